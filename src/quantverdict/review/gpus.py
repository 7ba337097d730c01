"""GPUs in the review: throughput per GPU, and the GPUs each scheme needs for the memory budget."""

from __future__ import annotations

import re

from quantverdict.config.schema import ReviewConfig
from quantverdict.measure.tensor_parallel import TP_SIZES, gpus_needed
from quantverdict.results.record import JobRecord, ModelDims
from quantverdict.review.document import GpuFit, GpuNeeds, GpuSpeed, Memory, Scheme


def job_gpus(rec: JobRecord) -> int:
    """GPUs a job's server used: ``environment.gpus_used``, else its ``bench.server.tensor_parallel_size``, else 1."""
    return rec.environment.gpus_used or int(rec.cfg.bench.server.tensor_parallel_size or 1)


def gpu_kind_matches(kind: str, name: str) -> bool:
    """Whether every word of ``kind`` is a whole word of the GPU ``name`` (case-insensitive)."""
    words = str(kind).split()
    return bool(words) and all(
        re.search(rf"(?<![A-Za-z0-9]){re.escape(w)}(?![A-Za-z0-9])", name, flags=re.IGNORECASE) for w in words
    )


def on_gpu(rec: JobRecord) -> bool:
    """Whether the job ran on a GPU (``environment.device`` or ``config.env.device`` is cuda)."""
    return (rec.environment.device or rec.cfg.env.device) == "cuda"


def whole_weights_gib(memory: Memory, gpus: int) -> float | None:
    """The whole model's weights (GiB): vLLM's logged figure is one GPU's."""
    w = memory.weights_gib
    return None if w is None else float(w) * gpus if memory.weights_source == "vLLM log" and gpus > 1 else float(w)


def gpu_needs(cards: list[Scheme], records: list[JobRecord], rc: ReviewConfig) -> GpuNeeds | None:
    """One model's schemes grouped by the GPUs they need for the memory budget
    (:func:`quantverdict.measure.tensor_parallel.gpus_needed` of the whole weights and the KV cache), and each one's
    sustained output tok/s per GPU used; None off GPU."""
    groups: dict[int | None, list[str]] = {}  # GPUs needed (None: more than the largest) -> scheme labels
    speeds = []
    for sc in cards:
        rec = next((r for r in records if str(r.job.id) == sc.job_id), None)
        if rec is None or not on_gpu(rec) or sc.status != "ok":
            continue
        m, used = sc.memory, job_gpus(rec)
        weights = whole_weights_gib(m, used)
        kv = None if m.kv_needed_gib is None else float(m.kv_needed_gib) + float(m.state_needed_gib or 0)
        heads = int(ModelDims.of(rec.model.dims).num_key_value_heads or 1)
        needed = None
        if weights is not None and kv is not None and rc.memory_budget_gib:
            needed = gpus_needed(weights, kv, heads, rc.memory_budget_gib, rc.reserved_gib, TP_SIZES)
        if sc.label not in (names := groups.setdefault(needed, [])):
            names.append(sc.label)
        top, tops = sc.speed.ceiling, [p.output_tok_s for p in sc.speed.points if p.output_tok_s]
        if tok_s := (top.output_tok_s if top else None) or max(tops, default=None):
            per = {"scheme": sc.scheme, "output_tok_s": tok_s, "lower_bound": bool(top and top.lower_bound)}
            speeds.append(GpuSpeed.model_validate(per | {"gpus": used, "output_tok_s_per_gpu": tok_s / used}))
    if not groups:
        return None
    fits = [GpuFit(gpus=n, labels=groups[n]) for n in sorted((n for n in groups if n is not None), reverse=True)]
    return GpuNeeds(fits=fits, fit_none=groups.get(None) or [], largest=TP_SIZES[-1], speeds=speeds)
