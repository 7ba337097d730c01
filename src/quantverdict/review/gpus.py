"""GPUs in the review: throughput per GPU, the GPUs each scheme needs, and whether a scheme and its baseline ran on
the same physical GPU and in one grid (two GPUs of one kind differ in clocks and power)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import PurePosixPath

from quantverdict.config.schema import ReviewConfig
from quantverdict.measure.tensor_parallel import TP_SIZES, gpus_needed
from quantverdict.results.record import GpuInfo, JobRecord, ModelDims
from quantverdict.review.document import Flag, GpuFit, GpuNeeds, GpuSpeed, Memory, Scheme
from quantverdict.review.flags import FlagCode
from quantverdict.review.words import say


def job_gpus(rec: JobRecord) -> int:
    """GPUs a job's server used: ``environment.gpus_used``, else its ``bench.server.tensor_parallel_size``, else 1."""
    return rec.environment.gpus_used or int(rec.cfg.bench.server.tensor_parallel_size or 1)


SAME = "same GPU"  # every GPU uuid of the scheme's job equals the baseline's, in the same order
DIFFERENT = "different GPUs"  # both jobs recorded their GPUs' uuids, and they differ
NOT_RECORDED = "not recorded"  # a GPU of either job has no ``environment.gpu[i].uuid`` in its record


@dataclass(frozen=True)
class GpuMatch:
    """A scheme's speed measurement against its baseline's (None: unknown)."""

    state: str
    gpus: tuple[str | None, ...]
    baseline_gpus: tuple[str | None, ...]
    same_grid: bool | None
    hours_apart: float | None


def _hours_apart(a: JobRecord, b: JobRecord) -> float | None:
    """Hours between the jobs' starts; None when a start is missing or unreadable, or only one has a UTC offset."""
    try:
        t, tb = (datetime.fromisoformat(str(r.job.started_at or "")) for r in (a, b))
        return abs((t - tb).total_seconds()) / 3600
    except (TypeError, ValueError):
        return None


def same_gpu(rec: JobRecord, base: JobRecord) -> GpuMatch | None:
    """How ``rec`` and its baseline ``base`` measured speed (the uuids of the GPUs each server used, in order); None
    when either lists no GPU."""
    mine, theirs = (
        tuple(GpuInfo.of(g).uuid or None for g in (r.environment.gpu or [])[: job_gpus(r)]) for r in (rec, base)
    )
    if not mine or not theirs:
        return None
    state = NOT_RECORDED if None in mine or None in theirs else SAME if mine == theirs else DIFFERENT
    a, b = grid_of(rec.job.output_dir), grid_of(base.job.output_dir)
    return GpuMatch(state, mine, theirs, a == b if a and b else None, _hours_apart(rec, base))


def pairable(m: GpuMatch | None) -> bool:
    """Whether repeats may be paired by index: not on different GPUs or across grids."""
    return m is None or (m.state != DIFFERENT and m.same_grid is not False)


def grid_of(output_dir: str | None) -> str | None:
    """The grid of a job folder: its multirun folder, else the folder itself; None without one."""
    if not output_dir:
        return None
    path = PurePosixPath(output_dir)
    return str(path.parent) if path.parent.parent.name == "multirun" else str(path)


def short_uuid(uuid: str | None) -> str:
    """``GPU-3cc7d5f1-...`` -> ``GPU-3cc7d5f1…`` (its first group); ``?`` for None."""
    if not uuid:
        return "?"
    short = "-".join(uuid.split("-")[:2] if uuid.startswith("GPU-") else [uuid[:12]])
    return short if short == uuid else f"{short}…"


def _shown(m: GpuMatch) -> dict[str, str]:
    """Both jobs' uuids as shown: whole where different GPUs' abbreviations are alike."""
    mine, theirs = (", ".join(map(short_uuid, u)) for u in (m.gpus, m.baseline_gpus))
    if m.state == DIFFERENT and mine == theirs:
        mine, theirs = (", ".join(map(str, u)) for u in (m.gpus, m.baseline_gpus))
    return {"gpus": mine, "base": theirs}


def same_gpu_line(what: str, m: GpuMatch) -> str:
    """The Validity line of ``m`` for ``what`` (``"<model> / fp8 vs bf16"``)."""
    grid = {True: " in one grid", False: ", not in one grid", None: ""}[m.same_grid]
    when = f"the jobs started {m.hours_apart:.1f} h apart{grid}" if m.hours_apart is not None else ""
    when = when or (f"the jobs ran{grid.lstrip(',')}" if grid else "")
    return say("same_gpu_line", "speed.j2", what=what, m=m, when=when, **_shown(m))


def same_gpu_flag(m: GpuMatch, baseline: str) -> list[Flag]:
    """A ``DIFFERENT_GPU`` flag (unattached) when ``m`` says :data:`DIFFERENT`, else none."""
    if m.state != DIFFERENT:
        return []
    return [Flag.new(FlagCode.DIFFERENT_GPU, say("different_gpu_flag", "speed.j2", baseline=baseline, **_shown(m)))]


def gpu_kind_matches(kind: str, name: str) -> bool:
    """Whether every word of ``kind`` is a whole word of the GPU ``name`` (case-insensitive)."""
    words = str(kind).split()
    return bool(words) and all(
        re.search(rf"(?<![A-Za-z0-9]){re.escape(w)}(?![A-Za-z0-9])", name, flags=re.IGNORECASE) for w in words
    )


def whole_weights_gib(memory: Memory, gpus: int) -> float | None:
    """The whole model's weights (GiB): vLLM's logged figure is one GPU's."""
    w = memory.weights_gib
    return None if w is None else float(w) * gpus if memory.weights_source == "vLLM log" and gpus > 1 else float(w)


def gpu_needs(cards: list[tuple[Scheme, JobRecord]], rc: ReviewConfig) -> GpuNeeds | None:
    """One model's schemes (with their records) grouped by the GPUs they need for the memory budget
    (:func:`gpus_needed`), and each one's sustained output tok/s per GPU used; None off GPU."""
    groups: dict[int | None, list[str]] = {}  # GPUs needed (None: more than the largest) -> scheme labels
    speeds = []
    for sc, rec in cards:
        if (rec.environment.device or rec.cfg.env.device) != "cuda" or sc.status != "ok":
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
