"""Per-scheme scorecard: memory, accuracy (against the baseline, with paired intervals) and speed.

Everything here reads records (dicts, see :mod:`quantverdict.results.record`) and tolerates missing
sections: a value that cannot be computed is None and the reason goes into ``missing``.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from quantverdict.config.schema import ReviewConfig
from quantverdict.measure import sweep
from quantverdict.results.baseline import accuracy_deltas, eval_mismatch, pct_change
from quantverdict.review import flags, stats
from quantverdict.review.flags import Flag
from quantverdict.review.stats import Interval

GIB = 1024**3
# record key the loader adds: the folder the record.json was read from (to find eval/samples_*.jsonl)
SOURCE_DIR_KEY = "_review_dir"
SHORT_OUTPUT_TOLERANCE = 0.99  # a speed point whose output tokens are < 99% of those requested is flagged
TIER_NAMES = {0: "16-bit (no quantization)", 1: "8-bit", 2: "4-bit"}
DTYPE_BYTES = {
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float32": 4,
    "float": 4,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
}


@dataclass
class TaskDelta:
    """One accuracy comparison of a scheme against its baseline.

    ``kind`` is ``score`` (higher is better: ``delta`` is absolute, ``recovery_pct`` = 100·value/baseline)
    or ``perplexity`` (lower is better: ``delta_pct`` = 100·(value/baseline - 1)).
    """

    name: str  # task, or the perplexity kind for token_perplexity
    metric: str
    kind: str
    value: float
    baseline: float
    delta: float | None = None
    delta_pct: float | None = None
    recovery_pct: float | None = None
    interval: Interval | None = None  # of delta (score) or of delta_pct (perplexity)
    recovery_interval: Interval | None = None  # in %
    mcnemar_b: int | None = None
    mcnemar_c: int | None = None
    mcnemar_p: float | None = None
    n: int | None = None
    paired: bool = False
    significant: bool | None = None  # None: no interval
    note: str = ""


@dataclass
class Scorecard:
    """The review's view of one job: identity, the three numbers, and what could not be computed."""

    job_id: str
    model: str
    scheme: str
    label: str
    tier: int
    status: str
    failed_stage: str | None
    error: str | None
    is_baseline: bool
    memory: dict[str, Any] = field(default_factory=dict)
    accuracy: list[TaskDelta] = field(default_factory=list)
    accuracy_refused: str | None = None
    # why accuracy cannot be measured at all (synthetic model, random weights); None for a real model
    accuracy_not_applicable: str | None = None
    speed: dict[str, Any] = field(default_factory=dict)
    flags: list[Flag] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    validity: list[str] = field(default_factory=list)  # what the numbers stand on (review's Validity section)

    @property
    def name(self) -> str:
        return f"{self.scheme} ({self.label})"


# --- identity ---------------------------------------------------------------------------------------


def weight_tier(rec: dict[str, Any]) -> int:
    """0 for 16-bit weights (no quantization), 1 for 8-bit (W8A16, W8A8, FP8), 2 for 4-bit or fewer.

    From ``config.scheme.weight_bits``, else the digits after ``W`` in the scheme label.
    """
    bits = (rec.get("config", {}).get("scheme") or {}).get("weight_bits")
    if bits is None:
        label = rec.get("job", {}).get("scheme_label", "") or ""
        m = re.match(r"W(\d+)", label)
        bits = int(m.group(1)) if m else (8 if "FP8" in label else 16)
    return 0 if bits >= 16 else 1 if bits >= 8 else 2


NOT_APPLICABLE_DEFAULT = "synthetic model with random weights: accuracy is not applicable"


def accuracy_not_applicable(rec: dict[str, Any]) -> str | None:
    """Why the record's accuracy cannot be measured, or None when it can.

    A synthetic model (``config.model.source == "synthetic"``: random weights with a real model's
    dimensions) has no meaningful accuracy; the pipeline writes ``accuracy = {"not_applicable": reason}``
    and ``stages.evaluate.status = "not_applicable"``. The reason is taken from the first of those two,
    else (a job that failed before the evaluate stage) from the config's model source.
    """
    acc = rec.get("accuracy") or {}
    if acc.get("not_applicable"):
        return str(acc["not_applicable"])
    ev = (rec.get("stages") or {}).get("evaluate") or {}
    if isinstance(ev, dict) and ev.get("status") == "not_applicable":
        return str(ev.get("detail") or NOT_APPLICABLE_DEFAULT)
    if ((rec.get("config") or {}).get("model") or {}).get("source") == "synthetic":
        return NOT_APPLICABLE_DEFAULT
    return None


def na_label(reason: str | None) -> str:
    """How a not-applicable accuracy is shown in a table cell: ``not applicable (random weights)``."""
    return "not applicable (random weights)" if "random weights" in (reason or "") else "not applicable"


def is_baseline(rec: dict[str, Any]) -> bool:
    return bool(rec["job"].get("scheme") == rec.get("config", {}).get("baseline_scheme", "bf16"))


# --- memory -----------------------------------------------------------------------------------------


def kv_bytes_per_token(dims: dict[str, Any], dtype_bytes: float) -> float | None:
    """KV-cache bytes per token: ``2 (K and V) × kv_layers × kv_heads × head_dim × dtype_bytes``.

    ``kv_layers`` is ``num_kv_layers`` (the layers that hold a KV cache: hybrid models such as
    Qwen3.5 keep a fixed-size recurrent state, not per-token K/V, in their linear-attention layers),
    else ``num_hidden_layers``. ``head_dim`` defaults to ``hidden_size / num_attention_heads``,
    ``num_key_value_heads`` to ``num_attention_heads`` (multi-head attention). None when a
    dimension is missing.
    """
    layers, heads = dims.get("num_kv_layers") or dims.get("num_hidden_layers"), dims.get("num_attention_heads")
    kv_heads = dims.get("num_key_value_heads") or heads
    head_dim = dims.get("head_dim") or (dims["hidden_size"] / heads if dims.get("hidden_size") and heads else None)
    if not layers or not kv_heads or not head_dim:
        return None
    return 2.0 * layers * kv_heads * head_dim * dtype_bytes


def state_bytes_per_sequence(dims: dict[str, Any], dtype_bytes: float) -> float:
    """Fixed-size recurrent state a hybrid model keeps per sequence in its linear-attention layers (bytes).

    Gated DeltaNet, as vLLM allocates it (``MambaStateShapeCalculator.gated_delta_net_state_shape``,
    vLLM 0.26), per layer without a KV cache: a conv state of ``(conv_kernel - 1) × (2 × k_heads ×
    k_head_dim + v_heads × v_head_dim)`` and a temporal state of ``v_heads × v_head_dim × k_head_dim``,
    both in the model dtype by default. Qwen3.5-9B (16 k / 32 v heads of 128, kernel 4) in bf16:
    (3 × 8,192 + 524,288) × 2 = 1,097,728 B a layer, × 24 layers = 26,345,472 B (25.1 MiB) a sequence.
    0 for models without linear-attention layers.
    """
    layers = (dims.get("num_hidden_layers") or 0) - (dims.get("num_kv_layers") or dims.get("num_hidden_layers") or 0)
    keys = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")
    if layers <= 0 or not all(dims.get(k) for k in keys):
        return 0.0
    nk, nv, dk, dv = (int(dims[k]) for k in keys)
    conv = (int(dims.get("linear_conv_kernel_dim") or 4) - 1) * (2 * nk * dk + nv * dv)
    return float(layers * (conv + nv * dv * dk) * dtype_bytes)


def hybrid_paging(dims: dict[str, Any], kv_dtype_bytes: float, state_dtype_bytes: float) -> dict[str, float] | None:
    """How vLLM pages a hybrid model's memory: one page size shared by attention blocks and recurrent states.

    vLLM 0.26 (``HybridAttentionMambaModelConfig``, which logs "Setting attention block size to N tokens
    to ensure that attention page size is >= mamba page size" and "Padding mamba page size by X%") picks
    the attention block size as the smallest multiple of 16 tokens whose per-layer page
    (``block × 2 × kv_heads × head_dim × kv_dtype_bytes``) holds one layer's recurrent state, and pads the
    state to that page. A sequence of L tokens then takes ``ceil(L / block)`` pages in each KV layer and
    one page in each linear-attention layer. Qwen3.5-9B in bf16: state 1,097,728 B a layer ->
    ceil(1,097,728 / (16 × 4,096)) × 16 = 272 tokens a block, page 272 × 4,096 = 1,114,112 B (+1.49%).

    Returns ``{"block_tokens", "page_bytes", "kv_layers", "state_layers"}``, or None for a model without
    linear-attention layers or with a dimension missing.
    """
    state = state_bytes_per_sequence(dims, state_dtype_bytes)
    bpt = kv_bytes_per_token(dims, kv_dtype_bytes)
    kv_layers = dims.get("num_kv_layers") or 0
    state_layers = (dims.get("num_hidden_layers") or 0) - kv_layers
    if not state or not bpt or kv_layers <= 0 or state_layers <= 0:
        return None
    per_layer_token = bpt / kv_layers  # 2 × kv_heads × head_dim × kv_dtype_bytes
    block = 16 * math.ceil(state / state_layers / (16 * per_layer_token))
    return {
        "block_tokens": block,
        "page_bytes": block * per_layer_token,
        "kv_layers": kv_layers,
        "state_layers": state_layers,
    }


def paged_bytes_per_sequence(paging: dict[str, float], tokens: int) -> float:
    """Bytes vLLM reserves for one sequence of ``tokens`` tokens of a hybrid model (:func:`hybrid_paging`):
    ``(ceil(tokens / block) × kv_layers + state_layers) × page_bytes``. Qwen3.5-9B, 4,096 tokens:
    (16 × 8 + 24) × 1,114,112 = 169,345,024 B."""
    blocks = math.ceil(tokens / paging["block_tokens"])
    return (blocks * paging["kv_layers"] + paging["state_layers"]) * paging["page_bytes"]


def served_compute_dtype(rec: dict[str, Any]) -> tuple[str, str]:
    """The compute dtype the record's vLLM server ran (or would run) in, and where that was read.

    In order: vLLM's own engine line (``memory.server.dtype``, what the server did), ``speed.dtype.value``
    (chosen by the pipeline from the CPU, the kernel or the config, :mod:`quantverdict.config.cpu_caps`),
    ``config.bench.server.dtype`` when not ``auto``, else the model's dtype (``config.model.dtype``: vLLM's
    ``auto`` is the checkpoint's dtype).

    Returns:
        ``(dtype, source)``, e.g. ``("float32", "vLLM log")``.
    """
    cfg = rec.get("config") or {}
    logged = ((rec.get("memory") or {}).get("server") or {}).get("dtype")
    if logged:
        return str(logged), "vLLM log"
    chosen = ((rec.get("speed") or {}).get("dtype") or {}).get("value")
    if chosen:
        return str(chosen), "speed.dtype"
    configured = ((cfg.get("bench") or {}).get("server") or {}).get("dtype")
    if configured and configured != "auto":
        return str(configured), "bench.server.dtype"
    return str((cfg.get("model") or {}).get("dtype") or "bfloat16"), "model dtype"


def served_kv_dtype(rec: dict[str, Any]) -> tuple[str, str]:
    """The KV cache's dtype: ``config.bench.server.kv_cache_dtype`` when not ``auto`` (vLLM's
    ``--kv-cache-dtype``), else the served compute dtype (:func:`served_compute_dtype`).

    Returns:
        ``(dtype, source)``.
    """
    kv = ((rec.get("config") or {}).get("bench") or {}).get("server", {}).get("kv_cache_dtype") or "auto"
    if kv != "auto":
        return str(kv), "bench.server.kv_cache_dtype"
    return served_compute_dtype(rec)


def _kv_dtype_bytes(rec: dict[str, Any], rc: ReviewConfig) -> tuple[float, str]:
    if rc.kv_cache_dtype_bytes:
        return rc.kv_cache_dtype_bytes, f"{rc.kv_cache_dtype_bytes:g} bytes (review.kv_cache_dtype_bytes)"
    name, _ = served_kv_dtype(rec)
    return DTYPE_BYTES.get(name, 2), name


def served_weights_bytes(rec: dict[str, Any]) -> tuple[float | None, str]:
    """Bytes the weights take in the server's memory when vLLM logs no figure of its own (CPU).

    The checkpoint's weight bytes (``memory.checkpoint.total_weight_bytes``), with its 16-bit tensors
    (``bytes_by_role.kept_16bit``: embeddings, norms, unquantized layers) converted to the served
    compute dtype: vLLM builds the model in ``--dtype`` and copies the checkpoint into it, so a bf16
    tensor served in float32 takes twice its file size; quantized weights and their scales keep their
    format. SmolLM2-135M bf16 served in float32: 0.25 GiB on disk, 0.5 GiB in memory.

    Returns:
        ``(bytes, how)``; bytes None without a checkpoint size.
    """
    ck = (rec.get("memory") or {}).get("checkpoint") or {}
    total = ck.get("total_weight_bytes")
    if not total:
        return None, ""
    dtype, _ = served_compute_dtype(rec)
    kept = (ck.get("bytes_by_role") or {}).get("kept_16bit")
    factor = DTYPE_BYTES.get(dtype, 2) / 2
    if factor == 1 or kept is None:
        return float(total), "checkpoint bytes"
    return float(total) + (factor - 1) * float(kept), f"checkpoint bytes, 16-bit tensors in {dtype}"


def kernel_name(k: Any) -> str:
    """A kernel entry of the vLLM log parse (``{"kernel", "method"}`` or a plain string) as text."""
    if isinstance(k, dict):
        return f"{k.get('kernel')} ({k.get('method')})" if k.get("method") else str(k.get("kernel"))
    return str(k)


def request_len(rec: dict[str, Any], rc: ReviewConfig) -> int | None:
    if rc.request_len_tokens:
        return rc.request_len_tokens
    bench = rec.get("config", {}).get("bench") or {}
    if bench.get("input_len") and bench.get("output_len"):
        return int(bench["input_len"]) + int(bench["output_len"])
    return None


def memory_summary(rec: dict[str, Any], rc: ReviewConfig) -> tuple[dict[str, Any], list[str]]:
    """Weights, KV cache needed for the stated capacity, and what is left of the budget (GiB).

    ``need_gib = weights_gib + kv_needed_tokens × kv_bytes_per_token / 2^30 + concurrent_requests ×
    state_bytes_per_sequence / 2^30 + reserved_gib``; weights from the vLLM server log when it was
    parsed (GPU), else the checkpoint's weight bytes in the served dtype (:func:`served_weights_bytes`);
    KV bytes per token in the KV cache's dtype (:func:`served_kv_dtype`: the served dtype unless
    ``kv_cache_dtype`` is set; a CPU server in float32 holds 4 bytes an element, not the model's 2).
    The state term is 0 except for hybrid models (:func:`state_bytes_per_sequence`), which are counted
    the way vLLM pages them (:func:`hybrid_paging`): each request's tokens rounded up to whole attention
    blocks, each state padded to a page; the budget's max concurrency is then ``free // paged_bytes_per_sequence``.
    """
    missing: list[str] = []
    mem = rec.get("memory") or {}
    ck, sv = mem.get("checkpoint") or {}, mem.get("server") or {}
    out: dict[str, Any] = {
        "checkpoint_gib": ck["total_weight_bytes"] / GIB if ck.get("total_weight_bytes") else None,
        # stages.memory writes effective_bits_per_weight; the other name is that of early hand-built records
        "bits_per_weight": ck.get("effective_bits_per_weight", ck.get("effective_bits_per_quantized_weight")),
        "server_weights_gib": sv.get("weights_gib"),
        "server_kv_cache_gib": sv.get("kv_cache_gib"),
        "server_kv_tokens": sv.get("kv_cache_tokens"),
        "server_max_concurrency": sv.get("max_concurrency"),
        "kernels": [kernel_name(k) for k in sv.get("kernels") or []],
        "fallback": bool(sv.get("fallback")),
        "fallback_lines": list(sv.get("fallback_lines") or []),
        "unquantized_gemm_fallback": bool(sv.get("unquantized_gemm_fallback")),
        "quantization": sv.get("quantization"),
    }
    if sv.get("weights_gib"):
        out["weights_gib"], out["weights_source"] = float(sv["weights_gib"]), "vLLM log"
    elif out["checkpoint_gib"]:
        # vLLM logs no weights figure on CPU: the checkpoint's weight bytes, in the served dtype
        wb, how = served_weights_bytes(rec)
        out["weights_gib"], out["weights_source"] = (wb or 0.0) / GIB, how
        if not sv:
            missing.append("no vLLM server memory (server log): weights = the checkpoint's weight bytes")
    else:
        out["weights_gib"], out["weights_source"] = None, None
        missing.append("no weight size (neither vLLM log nor checkpoint)")
    dims = (rec.get("model") or {}).get("dims") or {}
    dtype_bytes, out["kv_dtype"] = _kv_dtype_bytes(rec, rc)
    out["served_dtype"] = served_compute_dtype(rec)[0]
    bpt = kv_bytes_per_token(dims, dtype_bytes)
    out["kv_dtype_bytes"] = dtype_bytes
    out["kv_bytes_per_token"] = bpt
    if bpt is None:
        missing.append("no model dimensions: KV-cache bytes per token unknown")
    if sv.get("kv_cache_gib") and sv.get("kv_cache_tokens"):
        out["kv_bytes_per_token_measured"] = sv["kv_cache_gib"] * GIB / sv["kv_cache_tokens"]
    if "linear_attention" in (dims.get("layer_types") or []) and not dims.get("num_kv_layers"):
        missing.append("hybrid model without num_kv_layers: the KV cache is counted in every layer (too much)")
    rlen = request_len(rec, rc)
    out["request_len_tokens"] = rlen
    # vLLM keeps a hybrid model's recurrent state in the served dtype (mamba_ssm_cache_dtype auto)
    state_dtype = DTYPE_BYTES.get(out["served_dtype"], 2)
    paging = hybrid_paging(dims, dtype_bytes, state_dtype)
    out["hybrid_paging"] = paging
    req = sv.get("max_concurrency_request_tokens")
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


# --- accuracy ---------------------------------------------------------------------------------------


def _read_samples(rec: dict[str, Any], task: str) -> list[dict[str, Any]] | None:
    path = ((rec.get("accuracy") or {}).get("samples") or {}).get(task)
    if not path:
        return None
    p = Path(path)
    candidates = [p]
    if rec.get(SOURCE_DIR_KEY):
        candidates += [Path(rec[SOURCE_DIR_KEY]) / "eval" / p.name, Path(rec[SOURCE_DIR_KEY]) / p.name]
    for c in candidates:
        if c.is_file():
            return [json.loads(line) for line in c.read_text().splitlines() if line.strip()]
    return None


def _pairs(
    a: list[dict[str, Any]], b: list[dict[str, Any]], keys: tuple[str, ...]
) -> tuple[list[dict], list[dict], str]:
    """Rows of both runs on the same doc_ids (sorted), with a note when the sets differ."""
    ia = {r["doc_id"]: r for r in a if all(r.get(k) is not None for k in keys)}
    ib = {r["doc_id"]: r for r in b if all(r.get(k) is not None for k in keys)}
    common = sorted(set(ia) & set(ib), key=str)
    note = ""
    if len(common) != len(ia) or len(common) != len(ib):
        note = f"paired on the {len(common)} items both ran ({len(ia)} vs {len(ib)} rows)"
    return [ia[d] for d in common], [ib[d] for d in common], note


def _score_delta(
    task: str, metric: str, v: float, b: float, rec: dict[str, Any], base: dict[str, Any], rc: ReviewConfig
) -> TaskDelta:
    td = TaskDelta(task, metric, "score", v, b, delta=v - b, recovery_pct=100.0 * v / b if b else None)
    sa, sb = _read_samples(rec, task), _read_samples(base, task)
    if sa and sb:
        ra, rb, note = _pairs(sa, sb, (metric,))
        if len(ra) == 1:  # one item is no sample: no interval, never "significant"
            td.paired, td.n, td.note = True, 1, NO_INTERVAL_FROM_ONE
            return td
        if ra:
            x = [float(r[metric]) for r in ra]
            y = [float(r[metric]) for r in rb]
            td.paired, td.n, td.note = True, len(x), note
            if rc.interval == "bootstrap":
                td.interval = stats.bootstrap_mean_diff(
                    x, y, samples=rc.bootstrap_samples, seed=rc.seed, confidence=rc.confidence
                )
                if sum(y):
                    r = stats.bootstrap_ratio(
                        x, y, samples=rc.bootstrap_samples, seed=rc.seed, confidence=rc.confidence
                    )
                    td.recovery_interval = _scale(r, 100.0)
            else:
                td.interval = stats.paired_normal_interval(x, y, rc.confidence)
                if sum(y):
                    td.recovery_interval = _scale(stats.ratio_normal_interval(x, y, rc.confidence), 100.0)
            if all(t in (0.0, 1.0) for t in x + y):
                td.mcnemar_b, td.mcnemar_c, td.mcnemar_p = stats.mcnemar_exact(x, y)
            # point values from the pairs (equal to the record's when every item paired)
            td.significant = td.interval.excludes_zero()
            return td
    ma, mb = (rec["accuracy"]["tasks"].get(task) or {}), (base["accuracy"]["tasks"].get(task) or {})
    sea, seb = ma.get(f"{metric}_stderr"), mb.get(f"{metric}_stderr")
    td.n = ma.get("n")
    why = "no per-item samples" if not (sa and sb) else "no common items"
    if sea is not None and seb is not None:
        td.interval = stats.unpaired_interval(v, sea, b, seb, rc.confidence)
        if v and b:
            td.recovery_interval = _scale(stats.unpaired_ratio_interval(v, sea, b, seb, rc.confidence), 100.0)
        td.significant = td.interval.excludes_zero()
        td.note = f"{why}: unpaired interval from the two stderrs (wider than a paired one)"
    else:
        td.note = f"{why} and no stderr: no interval"
    return td


NO_INTERVAL_FROM_ONE = "measured on 1 item: no interval and no significance test (they need at least 2 items)"


def _scale(iv: Interval, k: float) -> Interval:
    return Interval(iv.estimate * k, iv.low * k, iv.high * k, iv.method)


def _ppl_from_log_ratio(iv: Interval) -> Interval:
    """log(ppl ratio) interval -> % change interval: 100·(exp(L) - 1)."""

    def f(v: float) -> float:
        return 100.0 * math.expm1(v)

    return Interval(f(iv.estimate), f(iv.low), f(iv.high), iv.method)


def _ppl_delta(
    task: str, metric: str, v: float, b: float, rec: dict[str, Any], base: dict[str, Any], rc: ReviewConfig
) -> TaskDelta:
    td = TaskDelta(metric if task == metric else task, metric, "perplexity", v, b, delta_pct=pct_change(v, b))
    count = {"word_perplexity": "n_words", "byte_perplexity": "n_bytes"}.get(metric)
    sa, sb = (_read_samples(rec, task), _read_samples(base, task)) if count else (None, None)
    if sa and sb and count:
        ra, rb, note = _pairs(sa, sb, ("loglikelihood", count))
        if len(ra) == 1:  # one document is no sample: no interval, never "significant"
            td.paired, td.n, td.note = True, 1, NO_INTERVAL_FROM_ONE
            return td
        if ra:
            # log(ppl_s / ppl_b) = sum(ll_b - ll_s) / sum(count): a ratio estimator over documents
            num = [float(q["loglikelihood"]) - float(p["loglikelihood"]) for p, q in zip(ra, rb)]
            den = [float(p[count]) for p in ra]
            if rc.interval == "bootstrap":
                iv = stats.bootstrap_ratio(
                    num, den, samples=rc.bootstrap_samples, seed=rc.seed, confidence=rc.confidence
                )
            else:
                iv = stats.log_ratio_normal_interval(num, den, rc.confidence)
            td.interval, td.paired, td.n, td.note = _ppl_from_log_ratio(iv), True, len(num), note
            td.significant = td.interval.excludes_zero()
            return td
    td.note = "no per-window data: no interval" if task == metric else "no per-document samples: no interval"
    return td


def accuracy_section(
    rec: dict[str, Any], base: dict[str, Any] | None, rc: ReviewConfig
) -> tuple[list[TaskDelta], str | None, list[str]]:
    """Deltas of ``rec`` against ``base`` (headline metric per task + every perplexity kind).

    Returns:
        ``(deltas, refused_reason, missing)``; ``refused_reason`` is set when the eval settings differ
        (no delta is reported then, see :func:`quantverdict.results.baseline.eval_mismatch`).
    """
    missing: list[str] = []
    if not (rec.get("accuracy") or {}).get("tasks") and not (rec.get("accuracy") or {}).get("token_perplexity"):
        return [], None, ["no accuracy results"]
    if base is None:
        return [], None, ["no baseline record with accuracy for this model: no deltas"]
    reason = eval_mismatch(rec, base)
    if reason:
        return [], reason, []
    headline = (rec.get("config", {}).get("eval") or {}).get("headline") or {}
    deltas = accuracy_deltas(rec, base, headline)
    out: list[TaskDelta] = []
    tasks, btasks = rec["accuracy"].get("tasks") or {}, base["accuracy"].get("tasks") or {}
    for task, d in deltas.items():
        if task == "token_perplexity":
            continue
        metric = d["metric"]
        if "perplexity" in metric:
            out.append(_ppl_delta(task, metric, d["value"], d["baseline"], rec, base, rc))
            for other in ("word_perplexity", "byte_perplexity"):
                v, b = tasks[task].get(other), btasks.get(task, {}).get(other)
                if other != metric and v is not None and b is not None:
                    out.append(_ppl_delta(task, other, v, b, rec, base, rc))
        else:
            out.append(_score_delta(task, metric, d["value"], d["baseline"], rec, base, rc))
    for task in tasks:
        if task not in deltas:
            missing.append(f"{task}: no baseline value of the headline metric")
    if "token_perplexity" in deltas:
        d = deltas["token_perplexity"]
        out.append(_ppl_delta("token_perplexity", "token_perplexity", d["value"], d["baseline"], rec, base, rc))
    return out, None, missing


def accuracy_validity(rec: dict[str, Any], sc_name: str) -> tuple[list[Flag], list[str]]:
    """Flags and Validity lines from the evaluate stage's own checks (``accuracy.checks``): batch
    invariance of the log-likelihoods, and word/byte perplexity recomputed from the summed
    log-likelihood; plus the settings every delta was computed under.

    Returns:
        ``(flags, lines)``: flags for failed checks, lines for the Validity section.
    """
    acc = rec.get("accuracy") or {}
    if not acc:
        return [], []
    out: list[Flag] = []
    lines: list[str] = []
    st = acc.get("settings") or {}
    if st:
        lines.append(
            f"{sc_name}: eval batch_size {st.get('batch_size')}, dtype {st.get('dtype')}, max_length "
            f"{st.get('max_length')}, backend {st.get('backend')} (deltas refused unless the baseline's match); "
            f"{st.get('normalization') or 'acc_norm normalisation not stated'}"
        )
    checks = acc.get("checks") or {}
    bi = checks.get("batch_invariance")
    if bi:
        if bi.get("skipped"):
            lines.append(f"{sc_name}: batch-invariance check skipped: {bi['skipped']}")
        elif bi.get("ok") is False:
            out.append(
                Flag(
                    flags.BATCH_VARIANCE,
                    sc_name,
                    f"{sc_name}: batching changed a request's log-likelihood by up to "
                    f"{bi.get('max_abs_diff'):.3g} (batch size {bi.get('batch_sizes')}, > {bi.get('tolerance'):g}): "
                    "lm-eval scores depend on the batch",
                )
            )
        else:
            state = "ok" if bi.get("ok") else f"not judged ({bi.get('note') or 'no tolerance'})"
            lines.append(
                f"{sc_name}: batch invariance {state}: max |delta log-likelihood| {bi.get('max_abs_diff'):.3g} "
                f"between batch sizes {bi.get('batch_sizes')} ({bi.get('dtype')}, {bi.get('n_requests')} requests)"
            )
    fam = checks.get("perplexity_family")
    if fam:
        if fam.get("ok") is False:
            out.append(
                Flag(
                    flags.PERPLEXITY_FAMILY,
                    sc_name,
                    f"{sc_name}: lm-eval's word/byte perplexity differ from exp(-loglikelihood_sum / count) by up to "
                    f"{100 * (fam.get('max_rel_diff') or 0):.2g}%",
                )
            )
        elif fam.get("ok"):
            lines.append(
                f"{sc_name}: word_perplexity and byte_perplexity recomputed from one summed log-likelihood "
                "(divided by words, by UTF-8 bytes) agree with lm-eval's"
            )
    tp = acc.get("token_perplexity") or {}
    if tp:
        how = (
            "non-overlapping: the first token of each window is context only"
            if tp.get("stride") == tp.get("seq_len")
            else f"every token after the first scored once, with >= {tp.get('seq_len', 0) - tp.get('stride', 0)} "
            "tokens of context"
        )
        lines.append(
            f"{sc_name}: token_perplexity over {tp.get('n_tokens')} scored tokens in windows of "
            f"{tp.get('seq_len')} with stride {tp.get('stride')} ({how}); not comparable with word_perplexity"
        )
    return out, lines


# --- speed ------------------------------------------------------------------------------------------

# metrics whose min/max over the valid repeats of a load level are kept next to the median
SPREAD_KEYS = (
    "achieved_rps",
    "output_tok_s",
    "throughput_rps",
    "throughput_tok_s",
    "ttft_ms_p99",
    "itl_ms_p50",
    "itl_ms_p99",
    "e2e_ms_p50",
)


def load_label(p: dict[str, Any], mode: str) -> str:
    if mode == "concurrency":
        c = p.get("concurrency")
        return f"concurrency {c:g}" if _is_num(c) else f"concurrency {c}"  # medians turn 16 into 16.0
    r = p["load"]
    return "unlimited rate" if math.isinf(r) else f"{r:g} req/s"


def _is_num(x: Any) -> TypeGuard[int | float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def speed_points(rec: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The sweep points of a record, one per load level, sorted by load.

    Invalid points (:func:`quantverdict.measure.sweep.point_valid`: output tokens under 90% of those requested,
    a wrong request count, ITL lists that are not gaps after the first token) are left out; a level
    with no valid repeat is left out. Each number is the **median** over the level's valid repeats;
    ``spread[metric] = [min, max]`` for ``SPREAD_KEYS``; ``load`` (req/s or concurrency, inf for an
    unlimited rate), ``repeats``, ``valid_repeats`` and ``saturated`` (most valid repeats saturated)
    are added.
    """
    speed = rec.get("speed") or {}
    mode = speed.get("mode") or "rate"
    groups: dict[float, list[dict[str, Any]]] = {}
    for p in speed.get("points") or []:
        groups.setdefault(sweep.load_of(p, mode), []).append(p)
    out = []
    for load, ps in sorted(groups.items()):
        valid = [p for p in ps if sweep.point_valid(p)]
        if not valid:
            continue
        agg: dict[str, Any] = dict(valid[0])
        for k in valid[0]:
            nums = [x for x in (q.get(k) for q in valid) if _is_num(x)]
            if len(nums) == len(valid):
                agg[k] = statistics.median(float(x) for x in nums)
        agg["spread"] = {
            k: [min(float(q[k]) for q in valid), max(float(q[k]) for q in valid)]
            for k in SPREAD_KEYS
            if all(_is_num(q.get(k)) for q in valid)
        }
        sat = [s for s in (sweep.point_saturated(q) for q in valid) if s is not None]
        agg["saturated"] = (2 * sum(sat) > len(sat)) if sat else None
        agg["load"], agg["repeats"], agg["valid_repeats"] = load, len(ps), len(valid)
        agg["label"] = load_label(agg, mode)
        out.append(agg)
    return mode, out


def slo_ok(p: dict[str, Any], rc: ReviewConfig) -> bool | None:
    """True when the point's TTFT p99 and ITL p99 meet the SLO; None when a needed value is missing."""
    ok = True
    for key, limit in (("ttft_ms_p99", rc.ttft_ms_p99), ("itl_ms_p99", rc.itl_ms_p99)):
        if limit is None:
            continue
        if p.get(key) is None:
            return None
        ok = ok and p[key] <= limit
    return ok


def load_point(mode: str, points: list[dict[str, Any]], rc: ReviewConfig) -> tuple[dict[str, Any] | None, str]:
    """The sweep point that stands for the stated load, and how it was chosen.

    Rate sweep, ``load_rps``: the smallest measured finite rate >= the load; if none, the unlimited-rate
    point (conservative: latency only grows with load). Concurrency sweep, ``load_rps``: the smallest
    concurrency whose achieved req/s reaches the load. Concurrency sweep, ``load_concurrency``: the
    smallest measured concurrency >= it. No load stated: the lowest measured load.
    """
    if not points:
        return None, "no speed points"
    if rc.load_rps is None and rc.load_concurrency is None:
        return points[0], f"no load stated: lowest measured load ({points[0]['label']})"
    if mode == "rate":
        if rc.load_rps is None:
            return None, "the sweep is open-loop (rates); a concurrency load needs bench.mode=concurrency"
        above = [p for p in points if p["load"] >= rc.load_rps - 1e-9]
        if not above:
            return None, f"no measured rate >= {rc.load_rps:g} req/s"
        p = above[0]
        how = (
            p["label"]
            if p["load"] == rc.load_rps
            else f"{p['label']} (nearest measured rate above {rc.load_rps:g} req/s)"
        )
        return p, how
    if rc.load_concurrency is not None:
        above = [p for p in points if p["load"] >= rc.load_concurrency]
        if not above:
            return None, f"no measured concurrency >= {rc.load_concurrency}"
        return above[0], above[0]["label"]
    rps = rc.load_rps or 0.0
    reach = [p for p in points if (p.get("achieved_rps") or 0) >= rps]
    if not reach:
        return None, f"no measured concurrency reaches {rps:g} req/s"
    return reach[0], f"{reach[0]['label']} (the lowest concurrency reaching {rps:g} req/s)"


def goodput(points: list[dict[str, Any]], rc: ReviewConfig) -> tuple[float | None, str]:
    """The achieved req/s at the highest sustained load whose TTFT p99 and ITL p99 meet the SLO, every
    lower load meeting it too: the "max rate under SLO attainment" of DistServe (Zhong et al. 2024) at
    99% attainment, read off the sweep.

    Only sustained loads count: finite offered rates (open loop) or concurrencies (closed loop). The
    unlimited-rate burst is not a load the server holds: its requests all arrive at t=0 and its
    latency is that of one batch of ``num_prompts`` requests, which can meet the SLO when 1 req/s does
    not (prefills of new arrivals stall the decode steps of the others). Latency grows with load, so
    the first load that fails ends the search (a higher one that passes is noise).

    Returns:
        ``(req/s, how)``: 0.0 when the lowest sustained load already fails; None with no SLO set or no
        sustained load measured.
    """
    if rc.ttft_ms_p99 is None and rc.itl_ms_p99 is None:
        return None, "no latency SLO set"
    held = [p for p in points if math.isfinite(p["load"])]
    if not held:
        return None, "no sustained load measured (only the unlimited-rate burst)"
    best: dict[str, Any] | None = None
    for p in held:
        if not slo_ok(p, rc):
            break
        best = p
    if best is None:
        return 0.0, f"the SLO fails at the lowest load ({held[0]['label']})"
    return float(best.get("achieved_rps") or 0.0), f"at {best['label']}"


def _raw_label(p: dict[str, Any], mode: str) -> str:
    lbl = load_label({**p, "load": sweep.load_of(p, mode)}, mode)
    return f"{lbl} (repeat {p['repeat']})" if p.get("repeat") else lbl


def speed_summary(rec: dict[str, Any], rc: ReviewConfig) -> tuple[dict[str, Any], list[Flag], list[str]]:
    """Single-stream speed, sustained ceiling, goodput under the SLO, and latency at the stated load.

    * single stream: the lowest-load point; ITL p50 and ``1000 / TPOT p50`` tok/s per request;
    * ceiling: :func:`quantverdict.measure.sweep.sustained_ceiling` (saturated levels and the burst; median over
      repeats with its min-max range; invalid points never count);
    * goodput: :func:`goodput` (the highest sustained load that meets the SLO, with every load below it);
    * saturation: a rate under 90% of the ceiling is never saturated (:func:`sweep.saturation_overruled`).

    Every number is a median over the valid repeats of its load level (:func:`speed_points`).

    Returns:
        ``(summary, flags, missing)``.
    """
    mode, points = speed_points(rec)
    found: list[Flag] = []
    raw = (rec.get("speed") or {}).get("points") or []
    for q in raw:
        label = _raw_label(q, mode)
        want, got = q.get("output_tokens_requested"), q.get("output_tokens_total")
        if not sweep.point_valid(q):
            if want and got is not None and got < sweep.OUTPUT_VALID_FRACTION * want:
                found.append(
                    Flag(
                        flags.SPEED_POINT_SHORT,
                        "",
                        f"speed point {label}: {got:,.0f} of {want:,.0f} requested output tokens "
                        f"({100 * got / want:.0f}%): requests ended early; invalid, left out of every speed number",
                    )
                )
            others = [r for r in q.get("invalid_reasons") or [] if "requested output tokens" not in r]
            if others or not (want and got is not None and got < sweep.OUTPUT_VALID_FRACTION * want):
                why = "; ".join(others) or "marked invalid"
                found.append(
                    Flag(
                        flags.SPEED_POINT_INVALID,
                        "",
                        f"speed point {label}: invalid ({why}); left out of every speed number",
                    )
                )
        elif want and got is not None and got < SHORT_OUTPUT_TOLERANCE * want:
            found.append(
                Flag(
                    flags.SPEED_POINT_SHORT_KEPT,
                    "",
                    f"speed point {label}: {got:,.0f} of {want:,.0f} requested output tokens "
                    f"({100 * got / want:.0f}%): some requests ended early; kept (>= 90%), tok/s slightly low",
                )
            )
        if q.get("failed"):
            found.append(Flag(flags.SPEED_POINT_FAILED, "", f"speed point {label}: {q['failed']:g} failed requests"))
        diff = q.get("vllm_max_rel_diff")
        if diff is not None and diff > sweep.VLLM_AGREEMENT_TOLERANCE:
            found.append(
                Flag(
                    flags.PERCENTILE_DISAGREEMENT,
                    "",
                    f"speed point {label}: latency percentiles recomputed from the per-request data differ from "
                    f"vLLM's own by up to {100 * diff:.1f}%: the recomputed ones are reported",
                )
            )
    if not points:
        return {"mode": mode, "points": []}, found, ["no valid speed results" if raw else "no speed results"]
    low = points[0]
    tpot = low.get("tpot_ms_p50") or low.get("itl_ms_p50")
    ceiling = sweep.sustained_ceiling(sweep.consistent_saturation(sweep.summarize(raw, mode), mode), mode)
    for p in points:  # a rate the server keeps up with (below its ceiling) is not saturated
        note = sweep.saturation_overruled(p["load"], ceiling) if p.get("saturated") and mode == "rate" else None
        if note:
            p["saturated"], p["saturation_note"] = False, note
    out: dict[str, Any] = {
        "mode": mode,
        "points": points,
        "low_label": low["label"],
        "single_itl_ms_p50": low.get("itl_ms_p50"),
        "single_itl_ms_p50_range": low.get("spread", {}).get("itl_ms_p50"),
        "single_tok_s": 1000.0 / tpot if tpot else None,
        "ceiling_kind": ceiling["kind"],
        "ceiling_rps": ceiling.get("rps"),
        "ceiling_tok_s": ceiling.get("output_tok_s"),
        "ceiling_tok_s_range": (
            [ceiling["output_tok_s_min"], ceiling["output_tok_s_max"]] if ceiling.get("output_tok_s") else None
        ),
        "ceiling_repeats": ceiling.get("repeats"),
        "saturation_label": (
            load_label({**ceiling, "load": sweep.load_of(ceiling, mode)}, mode) if ceiling["kind"] != "none" else None
        ),
        "repeats": max(p["repeats"] for p in points),
    }
    out["goodput_rps"], out["goodput_how"] = goodput(points, rc)
    at, how = load_point(mode, points, rc)
    out["load_how"] = how
    out["at_load"] = (
        {
            k: at.get(k)
            for k in (
                "label",
                "load",
                "achieved_rps",
                "ttft_ms_p99",
                "itl_ms_p99",
                "e2e_ms_p50",
                "e2e_ms_p99",
                "output_tok_s",
                "valid_repeats",
                "spread",
            )
        }
        if at
        else None
    )
    return out, found, []


def speed_validity(rec: dict[str, Any], sc_name: str, speed: dict[str, Any]) -> list[str]:
    """Lines for the review's Validity section: what each speed number stands on (repeats, spread,
    saturated and invalid points, the ceiling's definition, the kernel check)."""
    sp = rec.get("speed") or {}
    raw = sp.get("points") or []
    if not raw:
        return []
    mode = sp.get("mode") or "rate"
    lines = []
    levels = sweep.summarize(raw, mode)
    invalid = [_raw_label(q, mode) for q in raw if not sweep.point_valid(q)]
    ceiling = {
        "kind": speed.get("ceiling_kind"),
        "rps": speed.get("ceiling_rps"),
        "offered_rate_rps": "inf" if speed.get("saturation_label") == "unlimited rate" else None,
    }
    sat_raw = [q for q in raw if sweep.point_valid(q) and sweep.point_saturated(q)]
    overruled = [
        q for q in sat_raw if mode == "rate" and sweep.saturation_overruled(q.get("offered_rate_rps"), ceiling)
    ]
    saturated = [
        f"{_raw_label(q, mode)} (achieved/offered {q['saturation_ratio']:.2f}, {q.get('saturation_basis', '?')})"
        if _is_num(q.get("saturation_ratio"))
        else _raw_label(q, mode)
        for q in sat_raw
        if q not in overruled
    ]
    reps = sorted({lv["repeats"] for lv in levels})
    if overruled:
        text_over = ", ".join(_raw_label(q, mode) for q in overruled)
    text = (
        f"{sc_name}: {len(raw)} speed points over {len(levels)} load levels, "
        f"{'/'.join(str(r) for r in reps)} repeat(s) each; every number is a median over valid repeats"
    )
    text += f"; invalid (left out): {', '.join(invalid)}" if invalid else "; no invalid point"
    text += (
        f"; saturated: {', '.join(saturated)}"
        if saturated
        else ("; no point saturated" if mode == "rate" else "; closed loop: saturation not defined")
    )
    if overruled:
        text += (
            f"; {text_over}: achieved under 90% of the offered rate, but under 90% of the ceiling "
            f"({speed.get('ceiling_rps'):.2f} req/s): a short-run shortfall, not saturation"
        )
    kind = speed.get("ceiling_kind")
    if kind and kind != "none":
        rng = speed.get("ceiling_tok_s_range")
        spread_txt = (
            f" [{rng[0]:.1f}-{rng[1]:.1f}] over {speed.get('ceiling_repeats')} repeats"
            if rng and speed.get("ceiling_repeats", 1) > 1
            else " (one run: no spread)"
        )
        what = {
            "saturated": "from the saturated/burst points",
            "lower_bound": "a lower bound: no point saturated, the server's ceiling lies above the sweep",
            "closed_loop_max": "the best concurrency",
        }[kind]
        text += (
            f"; ceiling {speed.get('ceiling_tok_s'):.1f} out tok/s{spread_txt} at {speed.get('saturation_label')} "
            f"({what})"
        )
    lines.append(text)
    kc = sp.get("kernel_check")
    if kc:
        comp = {True: "comparable for speed", False: "NOT comparable for speed", None: "comparability unknown"}
        lines.append(
            f"{sc_name}: kernel {', '.join(kc.get('kernels') or []) or '(none named in the log)'}; "
            f"{comp[kc.get('comparable_for_speed')]} ({kc.get('reason')})"
        )
    return lines
