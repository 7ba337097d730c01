"""Whether a scheme's speed and its baseline's were measured on the same physical GPU, and in one grid.

A speed ratio of two GPU jobs means "scheme vs baseline" only on one GPU: two GPUs of one kind differ in clocks,
power and cooling. A GPU is known by ``environment.gpu[i].uuid`` (nvidia-smi's ``GPU-<uuid>``; older records lack
it); a job used the first :func:`quantverdict.review.gpus.job_gpus` of them. The grid is the Hydra multirun folder
of ``job.output_dir``; a single run is a grid of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import PurePosixPath

from quantverdict.results.record import GpuInfo, JobRecord
from quantverdict.review.flags import Flag, FlagCode
from quantverdict.review.gpus import job_gpus

SAME = "same GPU"  # every GPU uuid of the scheme's job equals the baseline's, in the same order
DIFFERENT = "different GPUs"  # both jobs recorded their GPUs' uuids, and they differ
NOT_RECORDED = "not recorded"  # a GPU of either job has no uuid (a record older than UUID_SINCE)
UUID_SINCE = "2026-12-01"  # the date of the first records with environment.gpu[].uuid (named in the Validity line)


@dataclass(frozen=True)
class GpuMatch:
    """How a scheme's speed measurement relates to its baseline's: ``state`` (:data:`SAME`, :data:`DIFFERENT`,
    :data:`NOT_RECORDED`), the uuids of each job's GPUs (None where not recorded), ``same_grid`` (None: unknown) and
    ``hours_apart`` of their starts (None: unknown)."""

    state: str
    gpus: tuple[str | None, ...]
    baseline_gpus: tuple[str | None, ...]
    same_grid: bool | None
    hours_apart: float | None


def used_gpu_uuids(rec: JobRecord) -> tuple[str | None, ...]:
    """The uuids of the GPUs a job's server used, in order (None for one without); ``()`` for a CPU record."""
    listed = [GpuInfo.of(g) for g in rec.environment.gpu or []]
    return tuple(g.uuid or None for g in listed[: job_gpus(rec)])


def _started(view: JobRecord) -> datetime | None:
    try:
        return datetime.fromisoformat(str(view.job.started_at)) if view.job.started_at else None
    except ValueError:
        return None


def same_gpu(rec: JobRecord, base: JobRecord) -> GpuMatch | None:
    """Whether ``rec`` (a scheme's record) and ``base`` (its baseline's) measured speed on the same GPUs (same
    uuids, same order); None when either lists no GPU."""
    mine, theirs = used_gpu_uuids(rec), used_gpu_uuids(base)
    if not mine or not theirs:
        return None
    if None in mine or None in theirs:
        state = NOT_RECORDED
    else:
        state = SAME if mine == theirs else DIFFERENT
    a, b = grid_of(rec.job.output_dir), grid_of(base.job.output_dir)
    same_grid = a == b if a and b else None
    t, tb = _started(rec), _started(base)
    try:
        hours = abs((t - tb).total_seconds()) / 3600 if t and tb else None
    except TypeError:  # one time with a UTC offset, the other without
        hours = None
    return GpuMatch(state, mine, theirs, same_grid, hours)


def pairable(m: GpuMatch | None) -> bool:
    """Whether repeats may be paired by index: not on different GPUs or across grids; yes for CPU jobs and
    where unknown."""
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
    head = uuid.split("-")[:2] if uuid.startswith("GPU-") else [uuid[:12]]
    short = "-".join(head)
    return short if short == uuid else f"{short}…"


def _names(uuids: tuple[str | None, ...], full: bool = False) -> str:
    return ", ".join(str(u) if full else short_uuid(u) for u in uuids)


def _when(m: GpuMatch) -> str:
    grid = {True: " in one grid", False: ", not in one grid", None: ""}[m.same_grid]
    if m.hours_apart is None:
        return f"the jobs ran{grid.lstrip(',')}" if grid else ""
    return f"the jobs started {m.hours_apart:.1f} h apart{grid}"


def same_gpu_line(what: str, m: GpuMatch) -> str:
    """The Validity line of ``m`` for ``what`` (e.g. ``"llama3.1-8b-shape / fp8 vs bf16"``), e.g.
    ``"...: speed measured on the same GPU (GPU-3cc7d5f1…) in one grid"``."""
    when = _when(m)
    if m.state == SAME:
        gpu = "GPU" if len(m.gpus) == 1 else "GPUs"
        rest = " in one grid" if m.same_grid else (f"; {when}" if when else "")
        return f"{what}: speed measured on the same {gpu} ({_names(m.gpus)}){rest}"
    if m.state == DIFFERENT:
        full = _names(m.gpus) == _names(m.baseline_gpus)  # abbreviations alike: show whole uuids
        return (
            f"{what}: speed measured on different GPUs ({_names(m.gpus, full)} vs {_names(m.baseline_gpus, full)}): "
            "the speed ratios include GPU-to-GPU variation" + (f"; {when}" if when else "")
        )
    return (
        f"{what}: whether speed was measured on the same GPU is not recorded (the GPU's uuid is recorded since "
        f"{UUID_SINCE})" + (f"; {when}" if when else "")
    )


def same_gpu_flag(m: GpuMatch, baseline: str) -> Flag | None:
    """A :data:`quantverdict.review.FlagCode.DIFFERENT_GPU` flag (not yet attached to a scorecard: :meth:`Flag.of`)
    when ``m`` says :data:`DIFFERENT`; None otherwise (``NOT_RECORDED`` is a Validity line only)."""
    if m.state != DIFFERENT:
        return None
    full = _names(m.gpus) == _names(m.baseline_gpus)
    return Flag(
        FlagCode.DIFFERENT_GPU,
        "",
        f"speed measured on another GPU than the baseline {baseline}'s ({_names(m.gpus, full)} vs "
        f"{_names(m.baseline_gpus, full)}): its speed ratios include any difference between the two GPUs",
    )
