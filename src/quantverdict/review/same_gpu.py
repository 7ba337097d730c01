"""Whether a scheme's speed and its baseline's were measured on the same physical GPU (``environment.gpu[i].uuid``)
and in one grid (the Hydra multirun folder of ``job.output_dir``): two GPUs of one kind differ in clocks and power."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import PurePosixPath

from quantverdict.results.record import GpuInfo, JobRecord
from quantverdict.review.document import Flag
from quantverdict.review.flags import FlagCode
from quantverdict.review.gpus import job_gpus
from quantverdict.review.words import say

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


def used_gpu_uuids(rec: JobRecord) -> tuple[str | None, ...]:
    """The uuids of the GPUs a job's server used, in order; ``()`` for a CPU record."""
    return tuple(GpuInfo.of(g).uuid or None for g in (rec.environment.gpu or [])[: job_gpus(rec)])


def _hours_apart(a: JobRecord, b: JobRecord) -> float | None:
    """Hours between the jobs' starts; None when a start is missing or unreadable, or only one has a UTC offset."""
    try:
        t, tb = (datetime.fromisoformat(str(r.job.started_at or "")) for r in (a, b))
        return abs((t - tb).total_seconds()) / 3600
    except (TypeError, ValueError):
        return None


def same_gpu(rec: JobRecord, base: JobRecord) -> GpuMatch | None:
    """How ``rec`` and its baseline ``base`` measured speed; None when either lists no GPU."""
    mine, theirs = used_gpu_uuids(rec), used_gpu_uuids(base)
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


def same_gpu_flag(m: GpuMatch, baseline: str) -> Flag | None:
    """A ``DIFFERENT_GPU`` flag (unattached) when ``m`` says :data:`DIFFERENT`, else None."""
    if m.state != DIFFERENT:
        return None
    return Flag.new(FlagCode.DIFFERENT_GPU, say("different_gpu_flag", "speed.j2", baseline=baseline, **_shown(m)))
