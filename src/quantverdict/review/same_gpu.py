"""Whether a scheme's speed and its baseline's were measured on the same physical GPU, and in one grid.

A speed ratio between two GPU jobs (:mod:`quantverdict.review.speed`, the regime's ratios paired by repeat)
means "scheme vs baseline" only when both ran on the same GPU: two GPUs of one kind can differ (clocks, power
limits, cooling), and a ratio across them carries that difference. The GPU's
identity is ``environment.gpu[i]["uuid"]``, nvidia-smi's ``GPU-<uuid>``, fixed for a physical GPU
(:func:`quantverdict.orchestrate.hardware.parse_nvidia_smi`); records written before 2026-12-01 lack it.
The GPUs a job's speed was measured on are the first :func:`quantverdict.review.gpus.job_gpus` entries of
``environment.gpu`` (the server runs on the first visible GPU, or shards over the first
``tensor_parallel_size`` of them). The grid is the Hydra multirun folder of ``job.output_dir``
(``<output_root>/multirun/<timestamp>/<job>``: one session); a single run (``<output_root>/runs/<job>``) is a
grid of its own, so two single runs are never "in one grid".

Pure functions of two records: :func:`same_gpu` compares, :func:`same_gpu_line` words the Validity line,
:func:`same_gpu_flag` raises a flag when the GPUs differ, :func:`pairable` says whether repeats may be paired.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import PurePosixPath

from quantverdict.results.record import JobRecord
from quantverdict.review import flags
from quantverdict.review.flags import Flag
from quantverdict.review.gpus import job_gpus

SAME = "same GPU"  # every GPU uuid of the scheme's job equals the baseline's, in the same order
DIFFERENT = "different GPUs"  # both jobs recorded their GPUs' uuids, and they differ
NOT_RECORDED = "not recorded"  # a GPU of either job has no uuid (records before 2026-12-01)
UUID_SINCE = "2026-12-01"  # the first records with environment.gpu[].uuid (commit 2434712)


@dataclass(frozen=True)
class GpuMatch:
    """How a scheme's speed measurement relates to its baseline's, GPU- and session-wise.

    Attributes:
        state: :data:`SAME`, :data:`DIFFERENT` or :data:`NOT_RECORDED`.
        gpus: the uuids of the GPUs the scheme's job used, in order (None where not recorded).
        baseline_gpus: the same for the baseline's job.
        same_grid: both jobs ran in one Hydra multirun folder (:func:`grid_of`); None when either record
            lacks ``job.output_dir``.
        hours_apart: ``|started_at - baseline started_at|`` in hours; None when either is missing or unreadable.
    """

    state: str
    gpus: tuple[str | None, ...]
    baseline_gpus: tuple[str | None, ...]
    same_grid: bool | None
    hours_apart: float | None


def used_gpu_uuids(rec: JobRecord) -> tuple[str | None, ...]:
    """The uuids (``GPU-<uuid>``) of the GPUs a job's server used, in order; None for a GPU without one; ``()``
    for a CPU-only record (``environment.gpu`` empty or missing)."""
    listed = [g for g in rec.environment.gpu or [] if isinstance(g, dict)]
    return tuple(str(g["uuid"]) if g.get("uuid") else None for g in listed[: job_gpus(rec)])


def _started(view: JobRecord) -> datetime | None:
    try:
        return datetime.fromisoformat(str(view.job.started_at)) if view.job.started_at else None
    except ValueError:
        return None


def same_gpu(rec: JobRecord, base: JobRecord) -> GpuMatch | None:
    """Whether ``rec`` (a scheme's record) and ``base`` (its baseline's) measured speed on the same GPU.

    Returns:
        None when either record lists no GPU (a CPU job: not applicable); else a :class:`GpuMatch` whose
        state is :data:`NOT_RECORDED` if any GPU either job used lacks a uuid, :data:`SAME` if the uuid
        lists are equal (same GPUs, same order), :data:`DIFFERENT` otherwise (e.g. tensor parallel over
        2 GPUs against 1).
    """
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
    """Whether a scheme's repeats may be paired with its baseline's by index (the review's paired test,
    :func:`quantverdict.review.verdict.paired_speedups`): not when they ran on different GPUs or not in one grid
    (repeat r of two sessions shares no drift); yes for CPU jobs (None) and where it is not known."""
    return m is None or (m.state != DIFFERENT and m.same_grid is not False)


def grid_of(output_dir: str | None) -> str | None:
    """The grid a job ran in: its Hydra multirun folder (the parent of ``output_dir`` when that sits in a
    ``multirun`` folder), else ``output_dir`` itself (a single run); None without a folder."""
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
    """A :data:`quantverdict.review.flags.DIFFERENT_GPU` flag (not yet attached to a scorecard: :meth:`Flag.of`)
    when ``m`` says :data:`DIFFERENT`; None otherwise (``NOT_RECORDED`` is a Validity line only)."""
    if m.state != DIFFERENT:
        return None
    full = _names(m.gpus) == _names(m.baseline_gpus)
    return Flag(
        flags.DIFFERENT_GPU,
        "",
        f"speed measured on another GPU than the baseline {baseline}'s ({_names(m.gpus, full)} vs "
        f"{_names(m.baseline_gpus, full)}): its speed ratios include any difference between the two GPUs",
    )
