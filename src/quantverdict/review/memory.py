"""Memory of a scheme in GiB: weights, KV cache for the stated capacity, and the budget left (KV bytes and hybrid
paging: :mod:`quantverdict.measure.kv_cache`)."""

from __future__ import annotations

import math
from typing import Any

from quantverdict.config.schema import ReviewConfig
from quantverdict.measure.kv_cache import (
    hybrid_paging,
    kv_bytes_per_token,
    kv_scale_bytes,
    paged_bytes_per_sequence,
    state_bytes_per_sequence,
)
from quantverdict.measure.memory import DTYPE_BYTES, GIB
from quantverdict.results.record import JobRecord
from quantverdict.review.flags import Flag, FlagCode


def served_compute_dtype(rec: JobRecord) -> tuple[str, str]:
    """The compute dtype the record's vLLM server ran (or would run) in, and where that was read.

    In order: vLLM's own engine line (``memory.server.dtype``, what the server did), ``speed.dtype.value``
    (chosen by the pipeline from the CPU, the kernel or the config, :mod:`quantverdict.config.cpu_caps`),
    ``config.bench.server.dtype`` when not ``auto``, else the model's dtype (``config.model.dtype``: vLLM's
    ``auto`` is the checkpoint's dtype).

    Returns:
        ``(dtype, source)``, e.g. ``("float32", "vLLM log")``.
    """
    if rec.server.dtype:
        return str(rec.server.dtype), "vLLM log"
    chosen = (rec.speed.dtype or {}).get("value")
    if chosen:
        return str(chosen), "speed.dtype"
    configured = (rec.cfg("bench").get("server") or {}).get("dtype")
    if configured and configured != "auto":
        return str(configured), "bench.server.dtype"
    return str(rec.cfg("model").get("dtype") or "bfloat16"), "model dtype"


def served_dtype(rec: JobRecord) -> str | None:
    """The ``--dtype`` the record's vLLM server computed in (None when nothing was served): ``speed.dtype.value``
    (chosen by :mod:`quantverdict.config.cpu_caps`, the kernel, the config or the checkpoint); its ``auto`` is the
    checkpoint's dtype, read from vLLM's log, else from ``config.model.dtype``."""
    if not rec.speed.points:
        return None
    value = (rec.speed.dtype or {}).get("value")
    if value == "auto":
        value = rec.server.dtype or rec.cfg("model").get("dtype")
    return str(value) if value else None


def dtype_flags(rec: JobRecord, base: JobRecord | None) -> list[Flag]:
    """A flag when ``rec`` and its baseline were served in different compute dtypes (the speed ratio then measures
    the dtype as much as the scheme), with the recorded reason; [] otherwise."""
    if base is None or base is rec:
        return []
    mine, theirs = served_dtype(rec), served_dtype(base)
    if not mine or not theirs or mine == theirs:
        return []
    why = (rec.speed.dtype or {}).get("why")
    message = f"served in {mine}, its baseline in {theirs}: the speed ratio mixes compute dtypes"
    return [Flag(FlagCode.DTYPE_MISMATCH, "", message + (f" ({why})" if why else ""))]


def served_kv_dtype(rec: JobRecord) -> tuple[str, str]:
    """The KV cache's dtype: ``config.bench.server.kv_cache_dtype`` when not ``auto`` (vLLM's
    ``--kv-cache-dtype``), else the served compute dtype (:func:`served_compute_dtype`).

    Returns:
        ``(dtype, source)``.
    """
    kv = (rec.cfg("bench").get("server") or {}).get("kv_cache_dtype") or "auto"
    if kv != "auto":
        return str(kv), "bench.server.kv_cache_dtype"
    return served_compute_dtype(rec)


def kv_choice(rec: JobRecord) -> str:
    """The record's KV-cache choice (``kv=NAME``, conf/kv): ``config.kv.name``, else ``fp8`` where
    ``bench.server.kv_cache_dtype`` was set to an FP8 format (records from before the kv axis), else ``auto``."""
    name = (rec.config.get("kv") or {}).get("name")
    if name:
        return str(name)
    served = (rec.cfg("bench").get("server") or {}).get("kv_cache_dtype") or "auto"
    return "fp8" if str(served).startswith("fp8") else "auto"


def _kv_dtype_bytes(rec: JobRecord, rc: ReviewConfig) -> tuple[float, str]:
    if rc.kv_cache_dtype_bytes:
        return rc.kv_cache_dtype_bytes, f"{rc.kv_cache_dtype_bytes:g} bytes (review.kv_cache_dtype_bytes)"
    name, _ = served_kv_dtype(rec)
    return DTYPE_BYTES.get(name, 2), name


def served_weights_bytes(rec: JobRecord) -> tuple[float | None, str]:
    """Bytes the weights take in the server's memory when vLLM logs no figure of its own (CPU).

    ``memory.checkpoint.total_weight_bytes`` with its 16-bit tensors (``bytes_by_role.kept_16bit``) scaled to the
    served compute dtype (vLLM copies the checkpoint into ``--dtype``); quantized weights keep their format.

    Returns:
        ``(bytes, how)``; bytes None without a checkpoint size.
    """
    total = rec.checkpoint_memory.total_weight_bytes
    if not total:
        return None, ""
    dtype, _ = served_compute_dtype(rec)
    kept = (rec.checkpoint_memory.bytes_by_role or {}).get("kept_16bit")
    factor = DTYPE_BYTES.get(dtype, 2) / 2
    if factor == 1 or kept is None:
        return float(total), "checkpoint bytes"
    return float(total) + (factor - 1) * float(kept), f"checkpoint bytes, 16-bit tensors in {dtype}"


def kernel_name(k: Any) -> str:
    """A kernel entry of the vLLM log parse (``{"kernel", "method"}`` or a plain string) as text."""
    if isinstance(k, dict):
        return f"{k.get('kernel')} ({k.get('method')})" if k.get("method") else str(k.get("kernel"))
    return str(k)


def request_len(rec: JobRecord, rc: ReviewConfig) -> int | None:
    if rc.request_len_tokens:
        return rc.request_len_tokens
    bench = rec.cfg("bench")
    if bench.get("input_len") and bench.get("output_len"):
        return int(bench["input_len"]) + int(bench["output_len"])
    return None


def memory_summary(rec: JobRecord, rc: ReviewConfig) -> tuple[dict[str, Any], list[str]]:
    """Weights, KV cache needed for the stated capacity, and what is left of the budget (GiB).

    ``need_gib = weights_gib + kv_needed_tokens × kv_bytes_per_token / 2^30 + concurrent_requests ×
    state_bytes_per_sequence / 2^30 + reserved_gib``; weights from the vLLM server log when it was
    parsed (GPU), else the checkpoint's weight bytes in the served dtype (:func:`served_weights_bytes`);
    KV bytes per token in the KV cache's dtype (:func:`served_kv_dtype`: the served dtype unless
    ``kv_cache_dtype`` is set; a CPU server in float32 holds 4 bytes an element, not the model's 2).
    The state term is 0 except for hybrid models
    (:func:`quantverdict.measure.kv_cache.state_bytes_per_sequence`), which are counted the way vLLM pages
    them (:func:`quantverdict.measure.kv_cache.hybrid_paging`): each request's tokens rounded up to whole
    attention blocks, each state padded to a page; the budget's max concurrency is then
    ``free // paged_bytes_per_sequence``.
    """
    missing: list[str] = []
    ck, sv = rec.checkpoint_memory, rec.server
    out: dict[str, Any] = {
        "checkpoint_gib": ck.total_weight_bytes / GIB if ck.total_weight_bytes else None,
        "bits_per_weight": ck.effective_bits_per_weight,
        "server_weights_gib": sv.weights_gib,
        "server_kv_cache_gib": sv.kv_cache_gib,
        "server_kv_tokens": sv.kv_cache_tokens,
        "server_max_concurrency": sv.max_concurrency,
        "kernels": [kernel_name(k) for k in sv.kernels or []],
        "fallback": bool(sv.fallback),
        "fallback_lines": list(sv.fallback_lines or []),
        "unquantized_gemm_fallback": bool(sv.unquantized_gemm_fallback),
        "quantization": sv.quantization,
    }
    if sv.weights_gib:
        out["weights_gib"], out["weights_source"] = float(sv.weights_gib), "vLLM log"
    elif out["checkpoint_gib"]:
        # vLLM logs no weights figure on CPU: the checkpoint's weight bytes, in the served dtype
        wb, how = served_weights_bytes(rec)
        out["weights_gib"], out["weights_source"] = (wb or 0.0) / GIB, how
        if sv.is_empty():
            missing.append("no vLLM server memory (server log): weights = the checkpoint's weight bytes")
    else:
        out["weights_gib"], out["weights_source"] = None, None
        missing.append("no weight size (neither vLLM log nor checkpoint)")
    dims = rec.model.dims or {}
    dtype_bytes, out["kv_dtype"] = _kv_dtype_bytes(rec, rc)
    out["served_dtype"] = served_compute_dtype(rec)[0]
    bpt = kv_bytes_per_token(dims, dtype_bytes)
    out["kv_dtype_bytes"] = dtype_bytes
    out["kv_bytes_per_token"] = bpt
    if bpt is None:
        missing.append("no model dimensions: KV-cache bytes per token unknown")
    if sv.kv_cache_gib and sv.kv_cache_tokens:
        out["kv_bytes_per_token_measured"] = sv.kv_cache_gib * GIB / sv.kv_cache_tokens
    if "linear_attention" in (dims.get("layer_types") or []) and not dims.get("num_kv_layers"):
        missing.append("hybrid model without num_kv_layers: the KV cache is counted in every layer (too much)")
    rlen = request_len(rec, rc)
    out["request_len_tokens"] = rlen
    # vLLM keeps a hybrid model's recurrent state in the served dtype (mamba_ssm_cache_dtype auto)
    state_dtype = DTYPE_BYTES.get(out["served_dtype"], 2)
    paging = hybrid_paging(dims, dtype_bytes, state_dtype)
    out["hybrid_paging"] = paging
    req = sv.max_concurrency_request_tokens
    if paging and req:  # vLLM's KV tokens = max concurrency x request length: its bytes/token include states
        out["kv_bytes_per_token_paged"] = paged_bytes_per_sequence(paging, int(req)) / int(req)
    tokens: int | None
    if paging and rlen and not rc.kv_cache_tokens:  # vLLM reserves whole attention blocks per request
        tokens = rc.concurrent_requests * math.ceil(rlen / paging["block_tokens"]) * int(paging["block_tokens"])
    else:
        tokens = rc.kv_cache_tokens or (rc.concurrent_requests * rlen if rlen else None)
    out["kv_needed_tokens"] = tokens
    out["kv_needed_gib"] = tokens * bpt / GIB if tokens and bpt else None
    state = paging["state_layers"] * paging["page_bytes"] if paging else state_bytes_per_sequence(dims, state_dtype)
    out["state_bytes_per_sequence"] = state
    out["state_needed_gib"] = rc.concurrent_requests * state / GIB
    out["reserved_gib"] = rc.reserved_gib
    if out["weights_gib"] is not None and out["kv_needed_gib"] is not None:
        out["need_gib"] = out["weights_gib"] + out["kv_needed_gib"] + out["state_needed_gib"] + rc.reserved_gib
    else:
        out["need_gib"] = None
    # the KV lever: the same capacity in an FP8 cache (one byte an element), these weights kept
    out["kv"] = kv_choice(rec)
    out["kv_scale_bytes"] = kv_scale_bytes(dims, "fp8" if dtype_bytes == 1 else "auto")
    bpt8 = kv_bytes_per_token(dims, 1.0)
    out["kv_fp8_needed_gib"] = tokens * bpt8 / GIB if tokens and bpt8 and not paging else None
    if out["kv_fp8_needed_gib"] is not None and out["need_gib"] is not None:
        out["need_gib_kv_fp8"] = out["need_gib"] - out["kv_needed_gib"] + out["kv_fp8_needed_gib"]
    else:
        out["need_gib_kv_fp8"] = None
    out["budget_gib"] = rc.memory_budget_gib
    if rc.memory_budget_gib and out["weights_gib"] is not None and bpt:
        free = rc.memory_budget_gib - out["weights_gib"] - rc.reserved_gib
        if state and rlen:  # each sequence costs its tokens' KV plus one recurrent state
            per_seq = paged_bytes_per_sequence(paging, rlen) if paging else rlen * bpt + state
            seqs = max(0, int(free * GIB // per_seq))
            out["budget_kv_tokens"], out["budget_max_concurrency"] = seqs * rlen, float(seqs)
        else:
            out["budget_kv_tokens"] = max(0, int(free * GIB // bpt))
            out["budget_max_concurrency"] = out["budget_kv_tokens"] / rlen if rlen else None
    else:
        out["budget_kv_tokens"] = out["budget_max_concurrency"] = None
    return out, missing
