"""GPUs in the review: throughput per GPU, and how many GPUs each scheme needs for the memory budget.

``review.memory_budget_gib`` is one GPU's budget; a scheme needs the fewest GPUs ``n`` (1, 2, 4, 8) with ``weights
/ n + its share of the KV cache + reserved <= budget`` (:func:`quantverdict.measure.tensor_parallel.gpus_needed`).
vLLM logs the weights one GPU loaded: ``tp`` times that is the whole model. Throughput per GPU is the sustained
output tok/s over the GPUs the job used (:func:`job_gpus`).
"""

from __future__ import annotations

import re
from typing import Any

from quantverdict.config.schema import ReviewConfig
from quantverdict.measure.tensor_parallel import TP_SIZES, gpus_needed
from quantverdict.results.record import JobRecord
from quantverdict.review.document import Memory
from quantverdict.review.scorecard import Scorecard
from quantverdict.review.speed import ceiling_is_floor

WORDS = {1: "one", 2: "two", 4: "four", 8: "eight"}


def job_gpus(rec: JobRecord) -> int:
    """GPUs a job's server used: ``environment.gpus_used``, else its ``bench.server.tensor_parallel_size``, else 1."""
    if rec.environment.gpus_used:
        return rec.environment.gpus_used
    return int((rec.cfg("bench").get("server") or {}).get("tensor_parallel_size") or 1)


def gpu_kind_matches(kind: str, name: str) -> bool:
    """Whether a GPU kind names the GPU ``name`` (as nvidia-smi gives it): every word of ``kind`` is a whole
    word of ``name``, case-insensitively, words bounded by anything but letters and digits.

    The one GPU-name match of the review (prices in :mod:`.cost`, the target in :mod:`.crossmodel`).
    ``H200`` matches ``NVIDIA H200`` but ``H20`` does not; ``NVIDIA A100 80GB`` matches
    ``NVIDIA A100-SXM4-80GB`` but not ``NVIDIA H100 80GB HBM3`` (its ``A100`` is missing)."""
    words = str(kind).split()
    return bool(words) and all(
        re.search(rf"(?<![A-Za-z0-9]){re.escape(w)}(?![A-Za-z0-9])", name, flags=re.IGNORECASE) for w in words
    )


def on_gpu(rec: JobRecord) -> bool:
    """Whether the job ran on a GPU (``environment.device`` or ``config.env.device`` is cuda)."""
    return (rec.environment.device or rec.cfg("env").get("device")) == "cuda"


def whole_weights_gib(memory: Memory, gpus: int) -> float | None:
    """The whole model's weights (GiB) from a scorecard's memory summary: vLLM's logged figure is one GPU's."""
    w = memory.weights_gib
    if w is None:
        return None
    return float(w) * gpus if memory.weights_source == "vLLM log" and gpus > 1 else float(w)


def scheme_gpus(sc: Scorecard, rec: JobRecord, rc: ReviewConfig) -> dict[str, Any]:
    """One scheme's GPU figures: ``gpus_used``, ``weights_gib`` (whole model), ``kv_gib`` (KV cache plus
    recurrent states needed), ``gpus_needed`` (None: not within 8 GPUs or not computable),
    ``tok_s`` (sustained output tok/s) and ``tok_s_per_gpu``."""
    m, used = sc.memory, job_gpus(rec)
    weights = whole_weights_gib(m, used)
    kv = None if m.kv_needed_gib is None else float(m.kv_needed_gib) + float(m.state_needed_gib or 0)
    heads = int((rec.model.dims or {}).get("num_key_value_heads") or 1)
    needed = None
    if weights is not None and kv is not None and rc.memory_budget_gib:
        needed = gpus_needed(weights, kv, heads, rc.memory_budget_gib, rc.reserved_gib, TP_SIZES)
    ceiling = sc.speed.ceiling.output_tok_s if sc.speed.ceiling else None
    tok_s = ceiling or max((p.output_tok_s for p in sc.speed.points if p.output_tok_s), default=None)
    return {
        "gpus_used": used,
        "weights_gib": weights,
        "kv_gib": kv,
        "gpus_needed": needed,
        "tok_s": tok_s,
        "tok_s_per_gpu": tok_s / used if tok_s else None,
    }


def verdict_lines(cards: list[Scorecard], records: list[JobRecord], rc: ReviewConfig) -> list[str]:
    """The GPU lines of one model's verdict: GPUs needed per scheme for the budget, and throughput per GPU.

    Empty unless the model's records ran on a GPU. Schemes are grouped by the GPUs they need, most first:
    "GPUs needed at 80 GiB per GPU (...): BF16 on two GPUs or W4A16/FP8_DYNAMIC on one."
    """
    rows = []
    for sc in cards:
        rec = next((r for r in records if str(r.job.id) == sc.job_id), None)
        if rec is None or not on_gpu(rec) or sc.status != "ok":
            continue
        rows.append((sc, scheme_gpus(sc, rec, rc)))
    if not rows:
        return []
    groups: dict[int | None, list[str]] = {}
    for sc, g in rows:
        names = groups.setdefault(g["gpus_needed"], [])
        if sc.label not in names:
            names.append(sc.label)
    fits = sorted((n for n in groups if n is not None), reverse=True)
    parts = [f"{'/'.join(groups[n])} on {WORDS.get(n, str(n))} GPU{'s' if n > 1 else ''}" for n in fits]
    parts = [parts[0], *(p.rsplit(" GPU", 1)[0] for p in parts[1:])] if len(parts) > 1 else parts
    if None in groups:
        parts.append(f"{'/'.join(groups[None])} on none of {TP_SIZES[-1]} or fewer")
    out = [
        f"GPUs needed at {rc.memory_budget_gib:g} GiB per GPU (whole weights / GPUs + the KV cache for "
        f"{rc.concurrent_requests} requests, per GPU): {' or '.join(parts)}."
    ]
    speeds = [
        f"{sc.scheme} {_ge(sc)}{g['tok_s']:,.0f} tok/s on {g['gpus_used']} GPU{'s' if g['gpus_used'] > 1 else ''} = "
        f"{_ge(sc)}{g['tok_s_per_gpu']:,.0f} per GPU"
        for sc, g in rows
        if g["tok_s"]
    ]
    if speeds:
        out.append(f"Throughput per GPU (sustained output tok/s / GPUs used): {'; '.join(speeds)}.")
    return out


def _ge(sc: Scorecard) -> str:
    """``">= "`` before a ceiling that is a lower bound (no point saturated, or a sweep stopped before its top
    loads), else ``""``."""
    return ">= " if ceiling_is_floor(sc.speed) else ""
