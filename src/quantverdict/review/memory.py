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
from quantverdict.results.record import ChosenDtype, JobRecord, Kernel, ModelDims
from quantverdict.review.document import Flag, Memory
from quantverdict.review.flags import FlagCode


def served_compute_dtype(rec: JobRecord) -> str:
    """The served compute dtype: the first set and not ``auto`` of vLLM's log, ``speed.dtype.value``,
    ``bench.server.dtype`` and the model's dtype, else ``bfloat16``."""
    chosen = (rec.server.dtype, ChosenDtype.of(rec.speed.dtype).value, rec.cfg.bench.server.dtype, rec.cfg.model.dtype)
    return next((str(d) for d in chosen if d and d != "auto"), "bfloat16")


def dtype_flags(rec: JobRecord, base: JobRecord | None) -> list[Flag]:
    """A flag when ``rec`` and its baseline were served in different compute dtypes."""
    if base is None or base is rec or not rec.speed.points or not base.speed.points:
        return []
    mine, theirs = served_compute_dtype(rec), served_compute_dtype(base)
    if mine == theirs:
        return []
    why = ChosenDtype.of(rec.speed.dtype).why
    message = f"served in {mine}, its baseline in {theirs}: the speed ratio mixes compute dtypes"
    return [Flag.new(FlagCode.DTYPE_MISMATCH, message + (f" ({why})" if why else ""))]


def kv_choice(rec: JobRecord) -> str:
    """``kv=NAME``: ``config.kv.name``, else ``fp8`` for an FP8 ``bench.server.kv_cache_dtype``, else ``auto``."""
    fp8 = str(rec.cfg.bench.server.kv_cache_dtype or "auto").startswith("fp8")
    return str(rec.cfg.kv.name or ("fp8" if fp8 else "auto"))


def _kv_dtype(rec: JobRecord, rc: ReviewConfig) -> tuple[float, str]:
    """Bytes per KV element and their source: the review's, the served KV dtype, else the compute dtype."""
    if rc.kv_cache_dtype_bytes:
        return rc.kv_cache_dtype_bytes, f"{rc.kv_cache_dtype_bytes:g} bytes (review.kv_cache_dtype_bytes)"
    kv = str(rec.cfg.bench.server.kv_cache_dtype or "auto")
    name = kv if kv != "auto" else served_compute_dtype(rec)
    return DTYPE_BYTES.get(name, 2), name


def _weights(rec: JobRecord) -> tuple[float | None, str | None, list[str]]:
    """Weights GiB, source, missing: vLLM's log, else the checkpoint's bytes, 16-bit tensors in the served dtype."""
    ck, sv = rec.checkpoint_memory, rec.server
    if sv.weights_gib:
        return float(sv.weights_gib), "vLLM log", []
    if not ck.total_weight_bytes:
        return None, None, ["no weight size (neither vLLM log nor checkpoint)"]
    dtype, roles = served_compute_dtype(rec), ck.bytes_by_role or {}
    factor = DTYPE_BYTES.get(dtype, 2) / 2
    total, how = float(ck.total_weight_bytes), "checkpoint bytes"
    if factor != 1 and "kept_16bit" in roles:
        total, how = total + (factor - 1) * float(roles["kept_16bit"]), f"checkpoint bytes, 16-bit tensors in {dtype}"
    missing = ["no vLLM server memory (server log): weights = the checkpoint's weight bytes"] if sv.is_empty() else []
    return total / GIB, how, missing


def _kernel_name(k: Any) -> str:
    """``Kernel (method)`` of a ``memory.server.kernels`` entry."""
    if not isinstance(k, dict):
        return str(k)
    kernel = Kernel.of(k)
    return f"{kernel.kernel} ({kernel.method})" if kernel.method else str(kernel.kernel)


def memory_summary(rec: JobRecord, rc: ReviewConfig) -> tuple[Memory, list[str]]:
    """``(memory, missing)``: GiB (2^30 bytes), ``need = weights + kv_tokens x kv_bytes_per_token +
    concurrent_requests x state_bytes_per_sequence + reserved``; hybrid models paged as vLLM pages them
    (:func:`quantverdict.measure.kv_cache.hybrid_paging`)."""
    ck, sv = rec.checkpoint_memory, rec.server
    weights, weights_source, missing = _weights(rec)
    dims = rec.model.dims or {}
    dtype_bytes, kv_dtype = _kv_dtype(rec, rc)
    served = served_compute_dtype(rec)
    bpt = kv_bytes_per_token(dims, dtype_bytes)
    if bpt is None:
        missing.append("no model dimensions: KV-cache bytes per token unknown")
    named = ModelDims.of(dims)
    if "linear_attention" in (named.layer_types or []) and not named.num_kv_layers:
        missing.append("hybrid model without num_kv_layers: the KV cache is counted in every layer (too much)")
    n_in, n_out = rec.cfg.bench.input_len, rec.cfg.bench.output_len
    rlen = rc.request_len_tokens or (n_in + n_out if n_in and n_out else None)
    # vLLM keeps a hybrid model's recurrent state in the served dtype (mamba_ssm_cache_dtype auto)
    state_dtype = DTYPE_BYTES.get(served, 2)
    paging = hybrid_paging(dims, dtype_bytes, state_dtype)
    req = sv.max_concurrency_request_tokens
    tokens: int | None
    if paging and rlen and not rc.kv_cache_tokens:  # vLLM reserves whole attention blocks per request
        tokens = rc.concurrent_requests * math.ceil(rlen / paging["block_tokens"]) * int(paging["block_tokens"])
    else:
        tokens = rc.kv_cache_tokens or (rc.concurrent_requests * rlen if rlen else None)
    kv_gib = tokens * bpt / GIB if tokens and bpt else None
    state = paging["state_layers"] * paging["page_bytes"] if paging else state_bytes_per_sequence(dims, state_dtype)
    state_gib = rc.concurrent_requests * state / GIB
    need = weights + kv_gib + state_gib + rc.reserved_gib if weights is not None and kv_gib is not None else None
    # the KV lever: the same capacity in an FP8 cache (one byte an element), these weights kept
    bpt8 = kv_bytes_per_token(dims, 1.0)
    kv_fp8_gib = tokens * bpt8 / GIB if tokens and bpt8 and not paging else None
    budget_tokens: int | None = None
    budget_seqs: float | None = None
    if rc.memory_budget_gib and weights is not None and bpt:
        free = rc.memory_budget_gib - weights - rc.reserved_gib
        if state and rlen:  # each sequence costs its tokens' KV plus one recurrent state
            per_seq = paged_bytes_per_sequence(paging, rlen) if paging else rlen * bpt + state
            seqs = max(0, int(free * GIB // per_seq))
            budget_tokens, budget_seqs = seqs * rlen, float(seqs)
        else:
            budget_tokens = max(0, int(free * GIB // bpt))
            budget_seqs = budget_tokens / rlen if rlen else None
    measured = sv.kv_cache_gib * GIB / sv.kv_cache_tokens if sv.kv_cache_gib and sv.kv_cache_tokens else None
    # vLLM's KV tokens = max concurrency x request length: its bytes per token include the states
    paged = paged_bytes_per_sequence(paging, int(req)) / int(req) if paging and req else None
    fp8_need = (
        need - kv_gib + kv_fp8_gib if kv_fp8_gib is not None and need is not None and kv_gib is not None else None
    )
    scale, ck_gib = kv_scale_bytes(dims, "fp8" if dtype_bytes == 1 else "auto"), ck.total_weight_bytes
    v: dict[str, Any] = dict(need_gib=need, budget_gib=rc.memory_budget_gib, weights_gib=weights)
    v |= dict(weights_source=weights_source, kv_needed_gib=kv_gib, kv_needed_tokens=tokens, kv_dtype=kv_dtype)
    v |= dict(kv_dtype_bytes=dtype_bytes, kv_bytes_per_token=bpt, kv_bytes_per_token_measured=measured)
    v |= dict(kv_bytes_per_token_paged=paged, kv_scale_bytes=scale, state_bytes_per_sequence=state)
    v |= dict(state_needed_gib=state_gib, reserved_gib=rc.reserved_gib, request_len_tokens=rlen)
    v |= dict(need_gib_kv_fp8=fp8_need, budget_kv_tokens=budget_tokens)
    v |= dict(budget_max_concurrency=budget_seqs, checkpoint_gib=ck_gib / GIB if ck_gib else None)
    v |= dict(bits_per_weight=ck.effective_bits_per_weight, hybrid_paging=paging)
    v |= dict(
        server_weights_gib=sv.weights_gib, server_kv_cache_gib=sv.kv_cache_gib, server_kv_tokens=sv.kv_cache_tokens
    )
    v |= dict(server_max_concurrency=sv.max_concurrency, kernels=[_kernel_name(k) for k in sv.kernels or []])
    v |= dict(fallback=bool(sv.fallback), fallback_lines=list(sv.fallback_lines or []))
    v |= dict(unquantized_gemm_fallback=bool(sv.unquantized_gemm_fallback))
    return Memory.model_validate(v), missing
