"""Server starts 2.. of finished jobs (``bench.server_starts``), round by round, with the stopping rule.

Every job runs start 1 itself (its server, its sweep). Then :func:`run_starts` runs the other starts over the jobs:

* **a grid** (``how="grid"``: the Hydra callback :class:`quantverdict.orchestrate.hydra_callbacks.GridSummary`, after
  the last job, before the table and the review): round ``s`` starts every job's server once more and sweeps it,
  the jobs in the grid's order (round 1's: the order the jobs ran) or a seeded random order per round
  (``bench.start_order``, :func:`quantverdict.measure.starts.round_order`), so that a drift of the machine lands on
  every scheme. Rounds run up to ``bench.server_starts``; past it, up to ``bench.max_server_starts``, only while
  some scheme's ratio to the baseline is unsettled at some load (:func:`quantverdict.measure.starts.decide_levels`).
* **a single job** (``how="single_job"``, ``python -m pipelines.run`` without ``-m``): its starts back to back, the
  fixed count ``bench.server_starts`` (no baseline to settle against).

Each start is :func:`quantverdict.serving.lifecycle.benchmark` in ``<job>/starts/start-<s>/`` (its own server log,
sweep files and GPU samples); its points are appended to the job's record with ``server_start = s`` and repeat
indices after the earlier starts' (``(s - 1) x bench.repeats + r``, so that repeat ``r`` of start ``s`` pairs with
the baseline's repeat of the same start), the per-load summary recomputed, and the record saved before the next
start. Every record is read and written as its model (:class:`quantverdict.results.record.JobRecord`).
Resumable: a start already in the record (a point with its index) is not run again. A start that fails is recorded
(``speed.starts``, status ``failed``) without its points, its server stopped, and the rounds go on; it runs again
the next time. The plan that ran is ``speed.start_plan`` of every record.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, cast

from pydantic import ValidationError

from quantverdict.config.compose import job_config
from quantverdict.config.cpu_caps import DtypeChoice
from quantverdict.config.schema import Config
from quantverdict.measure import starts as start_math
from quantverdict.measure.starts import LevelDecision
from quantverdict.measure.sweep_plan import load_of
from quantverdict.processes import envs
from quantverdict.results.record import (
    RECORD_FILE,
    CapacitySearch,
    JobInfo,
    JobRecord,
    Record,
    RecordInvalid,
    ServerStartInfo,
    StartPlan,
    SweepPoint,
    now_iso,
    read,
)
from quantverdict.serving import lifecycle
from quantverdict.serving.speed import speed_validity

log = logging.getLogger(__name__)

How = Literal["grid", "single_job"]
START_DIR = "starts"
METRIC = "output_tok_s"  # the throughput the review's speed claims rest on


def start_of(p: SweepPoint) -> int:
    """The server start a recorded point came from (:func:`quantverdict.measure.starts.start_index`)."""
    return start_math.start_index(p)


@dataclass
class GridJob:
    """One finished job of the grid: its folder, record (typed, as read), config and name in the plan."""

    out_dir: Path
    record: JobRecord
    cfg: Config

    @property
    def id(self) -> str:
        return str(self.record.job.id)

    def done_starts(self) -> set[int]:
        """Start indices with points in the record."""
        return {start_of(p) for p in self.record.speed.points}


@dataclass
class StartsOutcome:
    """What :func:`run_starts` did: the plan in time order (``<job id>#<start>``), the failed starts
    (``(job id, start, error)``), and whether the stopping rule ended the rounds before the maximum."""

    sequence: list[str] = field(default_factory=list)
    failed: list[tuple[str, int, str]] = field(default_factory=list)
    stopped_early: bool = False

    @property
    def ok(self) -> bool:
        return not self.failed


def save_record(out_dir: Path, rec: JobRecord) -> None:
    """Write ``rec`` to ``out_dir/record.json`` atomically (the keys it was read with and those set since),
    validated as a reader will read it.

    Raises:
        RecordInvalid: the record does not match its model (nothing written).
    """
    data = json.loads(json.dumps(rec.to_dict(), default=str, allow_nan=True))
    try:
        JobRecord.view(data)
    except ValidationError as exc:
        raise RecordInvalid(exc) from exc
    path = out_dir / RECORD_FILE
    tmp = path.with_name(f".{RECORD_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, allow_nan=True))
    tmp.replace(path)


def settings(cfg: Config) -> tuple[int, int]:
    """``(min_starts, max_starts)``: ``bench.server_starts`` and ``bench.max_server_starts`` (null: the same)."""
    lo = max(1, cfg.bench.server_starts)
    return lo, max(lo, cfg.bench.max_server_starts or lo)


def wants_starts(cfg: Config) -> bool:
    """Whether a job of this config runs more than its own start."""
    return settings(cfg)[1] > 1 and cfg.bench.enabled


def finished_jobs(job_dirs: list[Path]) -> list[GridJob]:
    """The jobs of ``job_dirs`` that finished with sweep points, in the order their first start ran
    (``job.started_at``, then folder name); unreadable records are logged and left out."""
    jobs = []
    for d in job_dirs:
        try:
            rec = read(d)
        except (ValueError, OSError) as exc:
            log.warning("server starts: %s not read: %s", d, exc)
            continue
        if rec.status != "ok" or not rec.speed.points or rec.speed.unsupported:
            continue
        try:
            cfg = job_config(rec.config)
        except Exception as exc:  # noqa: BLE001 - a config this code cannot type: that job gets no more starts
            log.warning("server starts: the config of %s could not be read: %s", d, exc)
            continue
        if settings(cfg)[1] <= 1:
            continue  # one start asked for (or a record written before bench.server_starts): nothing to add
        jobs.append(GridJob(d, rec, cfg))
    return sorted(jobs, key=lambda j: (str(j.record.job.started_at or ""), j.out_dir.name))


def baseline_of(job: GridJob, jobs: list[GridJob]) -> GridJob | None:
    """The grid's baseline for ``job``: the job of the same model and KV cache whose weight scheme is
    ``baseline_scheme``; None for the baseline itself or when the grid has none."""
    j = job.record.job
    for other in jobs:
        o = other.record.job
        if other is not job and o.model == j.model and o.kv == j.kv and o.weight_scheme == job.cfg.baseline_scheme:
            return other
    return None


def run_one_start(job: GridJob, start: int, order: int) -> ServerStartInfo:
    """Start ``job``'s server once more, sweep it into ``<job>/starts/start-<start>/``, append its points to the
    record and save it; return the start's ``speed.starts`` entry (status ``failed`` with the error when it failed:
    its server is stopped and no point of it is kept). KeyboardInterrupt is re-raised after the record is saved."""
    cfg, rec = job.cfg, job.record
    out = job.out_dir / START_DIR / f"start-{start}"
    scratch = Record(job=JobInfo(), config={})
    chosen = rec.environment.dtype_of("serve")
    serve_dtype = DtypeChoice(**chosen) if chosen is not None else None
    entry = ServerStartInfo(index=start, order=order, started_at=now_iso(), output_dir=str(out))
    t0 = time.perf_counter()
    try:
        env = envs.ensure("serve", cfg.env.serve, cfg.env, Path(cfg.paths.project_root))
        lifecycle.benchmark(cfg, scratch, out, serve_dtype, env, str(rec.checkpoint.path), save=lambda: None)
        entry.status = "ok"
    except Exception as exc:  # noqa: BLE001 - one start's failure is recorded; the finished starts stay
        entry.status, entry.error = "failed", f"{type(exc).__name__}: {exc}"
        log.error("server start %d of %s failed: %s", start, job.id, entry.error)
    except KeyboardInterrupt:
        entry.status, entry.error = "failed", "interrupted"
        raise
    finally:
        entry.finished_at = now_iso()
        entry.wall_s = round(time.perf_counter() - t0, 3)
        entry.server_start_s = scratch.speed.server_start_s
        entry.sweep_wall_s = scratch.speed.sweep_wall_s
        entry.server = scratch.speed.server
        entry.gpu_sampling = scratch.speed.gpu_sampling
        entry.host_sampling = scratch.speed.host_sampling
        points = list(scratch.speed.points) if entry.status == "ok" else []
        entry.points = len(points)
        searches = list(scratch.speed.searches or []) if entry.status == "ok" else []
        _append(job, start, entry, points, searches)
    return entry


def _append(
    job: GridJob, start: int, entry: ServerStartInfo, points: list[SweepPoint], searches: list[CapacitySearch]
) -> None:
    cfg, speed = job.cfg, job.record.speed
    repeats = max(1, cfg.bench.repeats)
    for p in points:
        p.server_start = start
        p.repeat = (start - 1) * repeats + int(p.repeat or 0)
        p.point = f"{p.point}_s{start}"
    speed.points = [*speed.points, *points]
    for search in searches:  # a capacity search's steps name this start's points as the record now does
        search.server_start = start
        for step in search.steps or []:
            step.points = [f"{name}_s{start}" for name in step.points or []]
    if searches:
        speed.searches = [*(speed.searches or []), *searches]
    speed.starts = [*_starts_of(job), entry]
    if points:  # the per-load summary and the sustained ceiling over every start's repeats
        server = job.record.memory.server
        speed_validity(speed, cfg.scheme.label, server, cfg.scheme.activation_bits < 16)
    save_record(job.out_dir, job.record)


def _starts_of(job: GridJob) -> list[ServerStartInfo]:
    """``speed.starts`` as recorded, with start 1 (the job's own) described from the record when absent."""
    speed, rec = job.record.speed, job.record
    have = list(speed.starts or [])
    if not any(s.index == 1 for s in have):
        first = ServerStartInfo(
            index=1,
            status="ok",
            started_at=rec.job.started_at,
            server_start_s=speed.server_start_s,
            sweep_wall_s=speed.sweep_wall_s,
            points=sum(1 for p in speed.points if start_of(p) == 1),
            server=speed.server,
            output_dir=str(job.out_dir),
        )
        up, swept = speed.server_start_s, speed.sweep_wall_s
        if up is not None and swept is not None:
            first.wall_s = round(float(up) + float(swept), 3)
        have.insert(0, first)
    # a start that failed and later ran: its last entry counts
    last: dict[int, ServerStartInfo] = {}
    for s in have:
        last[int(s.index or 0)] = s
    return [last[i] for i in sorted(last)]


def _decisions(jobs: list[GridJob], lo: int, hi: int, confidence: float, mode: str) -> dict[str, list[LevelDecision]]:
    out = {}
    for job in jobs:
        base = baseline_of(job, jobs)
        if base is not None:
            out[job.id] = start_math.decide_levels(
                job.record.speed.points, base.record.speed.points, lo, hi, confidence, METRIC, mode
            )
    return out


def _planned_loads(jobs: list[GridJob], job_id: str, mode: str) -> set[float]:
    """The load levels of ``job_id``'s points and of its baseline's: the levels the stopping rule must settle."""
    job = next(j for j in jobs if j.id == job_id)
    base = baseline_of(job, jobs)
    points = [*job.record.speed.points, *(base.record.speed.points if base else [])]
    return {load_of(p, mode) for p in points}


def run_starts(job_dirs: list[Path], how: How = "grid", on_start: Callable[[str], None] | None = None) -> StartsOutcome:
    """Run server starts 2.. of the finished jobs in ``job_dirs`` (see the module docstring).

    Args:
        job_dirs: the jobs' folders (a grid's, or one job's).
        how: ``grid`` (interleaved rounds, the stopping rule) or ``single_job`` (back to back, the fixed count).
        on_start: called with ``"<job id>#<start>"`` before each start runs (progress).

    Returns:
        The plan that ran and the failed starts.
    """
    outcome = StartsOutcome()
    jobs = finished_jobs(job_dirs)
    if not jobs or not wants_starts(jobs[0].cfg):
        return outcome
    cfg0 = jobs[0].cfg
    lo, hi = settings(cfg0)
    order = str(cfg0.bench.start_order)
    seed = cfg0.bench.seed
    mode = str(jobs[0].record.speed.mode or cfg0.bench.mode)
    # a capacity search measures other loads at every start: no load level to settle, a fixed count of starts
    searching = cfg0.bench.capacity.enabled
    paired = how == "grid" and any(baseline_of(j, jobs) for j in jobs) and not searching
    if not paired:
        hi = lo  # nothing to settle: the fixed count
    confidence = cfg0.bench.start_confidence
    outcome.sequence = [f"{j.id}#1" for j in jobs]
    ended: dict[str, dict[float, LevelDecision]] = {}  # per job, the look that settled each level
    starts_run = 1
    for s in range(2, hi + 1):
        if s - 1 >= lo and paired:
            unsettled = False
            for job_id, decisions in _decisions(jobs, lo, hi, confidence, mode).items():
                for d in decisions:
                    if d.ended_by != "continue":
                        ended.setdefault(job_id, {}).setdefault(d.load, d)
                    elif d.load not in ended.get(job_id, {}):
                        unsettled = True
                # a planned load with no pair to decide on (no valid point on one side) is not settled either
                decided = {d.load for d in decisions} | set(ended.get(job_id, {}))
                if _planned_loads(jobs, job_id, mode) - decided:
                    unsettled = True
            if not unsettled:
                outcome.stopped_early = s - 1 < hi
                break
        names = [j.id for j in jobs]
        by_id = {j.id: j for j in jobs}
        how_order = cast(start_math.StartOrder, "interleaved" if how == "single_job" else order)
        run_order = start_math.round_order(names, s, how_order, seed)
        for job_id in run_order:
            job = by_id[job_id]
            key = f"{job_id}#{s}"
            outcome.sequence.append(key)
            if s in job.done_starts():
                continue  # resumed: this start is in the record
            if on_start is not None:
                on_start(key)
            entry = run_one_start(job, s, len(outcome.sequence))
            if entry.status != "ok":
                outcome.failed.append((job_id, s, str(entry.error)))
        starts_run = s
    else:
        if paired:  # the last look, at the maximum: what is still open there ended by the maximum
            for job_id, decisions in _decisions(jobs, lo, hi, confidence, mode).items():
                for d in decisions:
                    last = dataclasses.replace(d, ended_by="max_reached") if d.ended_by == "continue" else d
                    ended.setdefault(job_id, {}).setdefault(d.load, last)
    _write_plans(jobs, how, lo, hi, order, seed, confidence, outcome, ended, starts_run, paired, searching)
    return outcome


def _write_plans(
    jobs: list[GridJob],
    how: How,
    lo: int,
    hi: int,
    order: str,
    seed: int,
    confidence: float,
    outcome: StartsOutcome,
    ended: dict[str, dict[float, LevelDecision]],
    starts_run: int,
    paired: bool,
    searching: bool = False,
) -> None:
    """Every record's ``speed.start_plan`` and each point's ``start_order``, saved."""
    position = {key: i + 1 for i, key in enumerate(outcome.sequence)}
    for job in jobs:
        speed = job.record.speed
        speed.starts = _starts_of(job)
        for st in speed.starts:
            key = f"{job.id}#{st.index}"
            st.order = position[key] if key in position else st.order
        for p in speed.points:
            key = f"{job.id}#{start_of(p)}"
            p.start_order = position[key] if key in position else None
        base = baseline_of(job, jobs)
        # server start-up + sweep of every start alike (start 1's wall_s holds only these; the later ones' more)
        walls = [
            float(s.server_start_s) + float(s.sweep_wall_s)
            for s in speed.starts
            if s.status == "ok" and s.server_start_s is not None and s.sweep_wall_s is not None
        ]
        levels = ended[job.id] if job.id in ended else {}
        plan = StartPlan.model_validate(
            {
                "how": how,
                "server_starts": lo,
                "max_server_starts": hi,
                "order": "back_to_back" if how == "single_job" else order,
                "seed": seed if order == "random" and how == "grid" else None,
                "sequence": outcome.sequence,
                "metric": METRIC,
                "confidence": confidence,
                "look_confidence": start_math.look_confidence(confidence, lo, hi) if paired else None,
                "baseline_job": base.id if base is not None else None,
                "levels": [d.to_dict() for _, d in sorted(levels.items())] or None,
                "gpu_time_saved_s": round(start_math.gpu_time_saved_s(walls, starts_run, hi), 1),
            }
        )
        if how == "single_job":
            plan.note = "a single job: its starts ran back to back, a fixed count (no baseline to settle against)"
        elif searching:
            plan.note = "a capacity search at every start: a fixed count of starts (no common load level to settle)"
        elif not paired:
            plan.note = "no baseline in the grid: a fixed count of starts"
        elif outcome.stopped_early:
            plan.note = f"every scheme's ratio settled after {starts_run} of at most {hi} starts"
        speed.start_plan = plan
        save_record(job.out_dir, job.record)


def grid_starts(sweep_dir: Path) -> bool:
    """:func:`run_starts` over the job folders of a finished grid (``how="grid"``), printing each start and each
    failure; True when no start failed (nothing to do counts as True)."""
    import traceback

    from quantverdict.results.record import find_records

    try:
        outcome = run_starts(
            [p.parent for p in find_records(sweep_dir)], "grid", on_start=lambda key: print(f"server start {key}")
        )
    except Exception:  # noqa: BLE001 - a bug here must not hide the grid's table, review and exit code
        print(f"the server starts of {sweep_dir} failed:\n{traceback.format_exc()}", file=sys.stderr)
        return False
    for job_id, start, error in outcome.failed:
        print(f"FAILED server start {start} of {job_id}: {error}", file=sys.stderr)
    if outcome.stopped_early:
        print("server starts: every scheme's ratio to the baseline settled before bench.max_server_starts")
    return outcome.ok
