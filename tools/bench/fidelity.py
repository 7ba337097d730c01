"""The fidelity check: ``vllm bench serve`` by hand (the CLI, one process per point) on a fresh server against
a finished job's checkpoint, the prefix cache reset around each point, printed beside the job's own sweep numbers.

    python -m tools.bench.fidelity runs/.../<job>/record.json               # the job's config, a fresh server
    python -m tools.bench.fidelity runs/.../<job>/record.json --port 8799 --tolerance 0.05
    python -m tools.bench.fidelity runs/.../<job>/record.json --repeat 0    # one run per load level
    python -m tools.bench.fidelity runs/.../<job>/record.json --repeat 0 --concurrency 64 --concurrency 256
    python -m tools.bench.fidelity runs/.../<job>/record.json --rate 4 --rate inf   # levels of a rate sweep
    python -m tools.bench.fidelity runs/.../<job>/record.json --report-only # no server: re-read <job>/fidelity
    python -m tools.bench.fidelity runs/.../<job>/record.json --report-only --out DIR --repeat 0  # a run's files

The by-hand run uses the points the job ran (its record's ``speed.points``; a job cut short ran part of its
plan), in the job's order, each with the job's seed (:func:`quantverdict.measure.sweep_plan.point_seed`) and
request count, ``--num-warmups 0 --ready-check-timeout-sec 0`` (vLLM's own warm-up and ready check send the
first measured prompt), a warm-up run of unmeasured prompts at the point's concurrency before the first point
of each load level run here (as the sweep client does without ``bench.prefetch_prompts``; with it, the job runs
those waves before the sweep instead, every level's in a row), and ``POST /reset_prefix_cache`` between that
warm-up and the point and after it; the
server's ``/metrics`` prefix-cache counters are read around each point, so the by-hand hit rate is shown
beside, with the hits beyond the prompts that repeat inside the point in brackets (vLLM's random dataset
repeats a few prompts inside one; the by-hand run sends the job's prompts, its seed and request count, so the
job's count of them applies, in the point's checks file too: :func:`by_hand_excess_hit_rate`; above 0% means
reuse across points). A
point whose output tok/s differs from the job's by more than the tolerance (5%) is flagged. TTFT p50 is
printed beside it (not judged: at small windows it moves more than 5% between two runs of one method).

``--repeat K``, ``--concurrency C`` and ``--rate R`` (each repeatable, combinable) choose the points: those
the job ran of the chosen repeats at the chosen load levels. A chosen point keeps the seed of its place in the
job's full plan, so it sends the prompts the job's run of it sent. A value that selects no point the job ran
(alone, or with the other flags) stops the check before any server starts, naming the flag and the levels the
job ran (each with its repeats when they differ).

Each point costs a warm-up and a measured CLI run (each a process that imports vLLM, ~20 s of it), so a run on a
machine held for a limited time can end mid-run. What a finished point leaves in ``--out`` (default
``<job>/fidelity``) is kept: the
CLI's ``<point>.json``, the server's checks ``<point>.checks.json`` (prefix-cache hit rate, token counts:
:func:`quantverdict.measure.server_metrics.server_checks`) and ``fidelity.json``, rewritten after every point
with the rows compared so far: ``{"rows": ..., "by_hand": ..., "chosen": [point names], "complete": ...}``,
``complete`` true when every chosen point has a row, ``"error"`` added when the run stopped on one. A run
starts by removing its chosen points' files of an earlier run (``<point>.json``, ``<point>.checks.json``,
``warmup/<point>.json``; one line on stderr says how many) and writing an empty ``fidelity.json``; other
points' files stay. ``--report-only`` starts nothing: it rebuilds the comparison from the ``<point>.json``
(and ``<point>.checks.json``) files of the chosen points already in ``--out``, prints the table and rewrites
``fidelity.json`` (``chosen``: the points it looked for; an earlier file's ``"error"`` kept); a
``<point>.json`` that cannot be read is skipped with a warning and counted as missing.

Exit codes: 0 every compared point within the tolerance; 1 one or more outside it; 2 bad input or nothing to
compare (a record without speed points, a filter value that selects no point the job ran, a run whose by-hand
points match none of the job's, ``--report-only`` with no readable by-hand file of a chosen point); 3 the run
stopped on an error (the traceback on stderr; the finished points kept in ``fidelity.json`` with ``error``).

On CPU the same check runs in ``tests/integration/test_serve_bench.py`` on the embedded model.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from quantverdict.config.compose import PROJECT_ROOT, job_config
from quantverdict.config.schema import BenchConfig, ComputeDtype
from quantverdict.measure import bench_result, server_metrics, sweep_plan
from quantverdict.processes import envs
from quantverdict.processes.envs import StageEnv
from quantverdict.results.record import ChosenDtype, SweepPoint, read
from quantverdict.serving.benchmark import bench_command, supported_optional_flags
from quantverdict.serving.lifecycle import compile_cache_dir
from quantverdict.serving.server import VLLMServer

TOLERANCE = 0.05  # the job's own sweep is trusted when every point is within +-5% of a by-hand run's
# On a shared 2-core CPU (tests/integration/test_serve_bench.py: one wave of 4 requests per point, 4-7-s windows, the
# server's OpenMP threads and the client taking turns on the cores) one run of a point scatters far more than on a
# GPU: two by-hand runs of one c = 4 point minutes apart gave 11.1 and 17.5 output tok/s, and the job's over the
# by-hand run's ranged 0.64-1.97 on an AVX2 EPYC, in both directions (earlier 8-request windows: within 23%). The
# check there shows the plumbing (seeds, request counts, no cache hits) and catches a gross gap (emulated bf16
# instead of float32 here: several times slower): the two within a factor of 2
CPU_MAX_RATIO = 2.0
JUDGED = "output_tok_s"
SHOWN = ("output_tok_s", "ttft_ms_p50")
CHECKS_SUFFIX = ".checks.json"  # <point>.checks.json: the server's checks of a by-hand point
COUNTER_SETTLE_S = 1.0  # wait after a point before reading /metrics (the API server counts after responding)


def choose(
    bench: BenchConfig,
    repeats: set[int] | None = None,
    concurrencies: set[int] | None = None,
    rates: set[float | str] | None = None,
    ran: Collection[str] | None = None,
) -> list[tuple[int, sweep_plan.SweepPoint]]:
    """The points of the job's plan to run (or read) by hand: those of the chosen repeats at the chosen levels
    that the job ran.

    Args:
        bench: the job's ``bench`` config (mode, levels, repeats).
        repeats: repeat indices to keep (None: every repeat).
        concurrencies: concurrency levels to keep (a concurrency sweep; None: every level).
        rates: offered rates to keep, req/s (a rate sweep; as :func:`~quantverdict.measure.sweep_plan.normalize_rate`
            gives them: a float or ``"inf"``; None: every rate).
        ran: the names of the points the job ran (its record's ``speed.points``, e.g. ``conc-64_r0``); only
            these are chosen and the filters are checked against them (a job cut short ran part of its plan).
            None: every point of the plan.

    Returns:
        ``(index in the job's full plan, point)`` in run order. The index is the point's place in
        :func:`~quantverdict.measure.sweep_plan.plan`, so :func:`~quantverdict.measure.sweep_plan.point_seed`
        of it is the seed the job's run of that point used, whatever is left out.

    Raises:
        ValueError: one message naming each flag with a value that selects no point the job ran, and the levels
            the job ran, e.g. ``--concurrency 32: the job ran concurrency 1, 16, 64, 256``; where the job ran
            different repeats at different levels, each level with its repeats, e.g. ``--concurrency 64: the
            job ran concurrency 1 (repeats 0, 1, 2), 16 (repeat 0)``, and a value that selects a point only
            apart from the other flags is named with them: ``--repeat 1 at --concurrency 16: ...``. Also when
            ``ran`` holds no point of the plan.

    E.g. concurrency 1, 16, 64, 256 with 3 repeats, ``repeats={0}``, ``concurrencies={64, 256}``:
    ``[(6, conc-64_r0), (9, conc-256_r0)]`` (seeds ``base + 7`` and ``base + 10``).
    """
    plan = sweep_plan.plan(bench.mode, list(bench.rates), list(bench.concurrencies), bench.repeats)
    indexed = [(i, p) for i, p in enumerate(plan) if ran is None or p.name in ran]
    if not indexed:
        names = sorted(ran or ())
        raise ValueError(
            f"the record's points ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''}) are none of the "
            f"job's plan ({_levels(bench.mode, plan)}, {bench.repeats} repeats)"
        )
    points = [p for _, p in indexed]
    levels = _ran_levels(bench.mode, points)
    level_flag = "--concurrency" if bench.mode == "concurrency" else "--rate"
    chosen_levels: set[Any] | None = concurrencies if bench.mode == "concurrency" else rates

    def level(p: sweep_plan.SweepPoint) -> Any:
        return p.concurrency if bench.mode == "concurrency" else p.offered_rate_rps

    errors = []
    if repeats is not None and (unknown := repeats - {p.repeat for p in points}):
        if _even(bench.mode, points):
            ran_repeats = sorted({p.repeat for p in points})
            errors.append(f"--repeat {_join(unknown)}: the job ran repeats {ran_repeats} of each level")
        else:
            errors.append(f"--repeat {_join(unknown)}: the job ran {levels}")
    if concurrencies is not None:
        if bench.mode != "concurrency":
            errors.append(f"--concurrency {_join(concurrencies)}: the job ran a rate sweep ({levels}); use --rate")
        elif unknown := concurrencies - {p.concurrency for p in points}:
            errors.append(f"--concurrency {_join(unknown)}: the job ran {levels}")
    if rates is not None:
        if bench.mode != "rate":
            errors.append(f"--rate {_join(rates)}: the job ran a concurrency sweep ({levels}); use --concurrency")
        elif unknown_rates := rates - {p.offered_rate_rps for p in points}:
            errors.append(f"--rate {_join(unknown_rates)}: the job ran {levels}")
    if not errors and repeats is not None and chosen_levels is not None:  # each value ran; with the others?
        lone_r = {r for r in repeats if not any(p.repeat == r and level(p) in chosen_levels for p in points)}
        lone_l = {v for v in chosen_levels if not any(level(p) == v and p.repeat in repeats for p in points)}
        if lone_r:  # all of them: the flags together select nothing, one message says it
            errors.append(f"--repeat {_join(lone_r)} at {level_flag} {_join(chosen_levels)}: the job ran {levels}")
        if lone_l and lone_r != repeats:
            errors.append(f"{level_flag} {_join(lone_l)} at --repeat {_join(repeats)}: the job ran {levels}")
    if errors:
        raise ValueError("; ".join(errors))
    return [
        (i, p)
        for i, p in indexed
        if (repeats is None or p.repeat in repeats)
        and (concurrencies is None or p.concurrency in concurrencies)
        and (rates is None or p.offered_rate_rps in rates)
    ]


def _rate_key(r: float | str) -> float:
    return math.inf if r == sweep_plan.INF else float(r)


def _join(values: set[int] | set[float | str]) -> str:
    """``{256, 64} -> "64 256"``; rates as ``format_rate`` writes them (``inf`` last)."""
    return " ".join(
        sweep_plan.format_rate(v) if not isinstance(v, int) else str(v) for v in sorted(values, key=_rate_key)
    )


def _levels(mode: str, points: list[sweep_plan.SweepPoint]) -> str:
    """The job's load levels in words: ``concurrency 1, 16, 64, 256`` or ``rates 1, 2, inf req/s``."""
    if mode == "concurrency":
        return "concurrency " + ", ".join(str(c) for c in sorted({p.concurrency or 0 for p in points}))
    rates = sorted({p.offered_rate_rps for p in points}, key=_rate_key)
    return "rates " + ", ".join(sweep_plan.format_rate(r) for r in rates) + " req/s"


def _repeats_by_level(mode: str, points: list[sweep_plan.SweepPoint]) -> dict[Any, set[int]]:
    """Load level (concurrency, or offered rate) -> the repeats of it among ``points``, levels in load order."""
    by: dict[Any, set[int]] = {}
    for p in points:
        by.setdefault(p.concurrency if mode == "concurrency" else p.offered_rate_rps, set()).add(p.repeat)
    return {k: by[k] for k in sorted(by, key=_rate_key)}


def _even(mode: str, points: list[sweep_plan.SweepPoint]) -> bool:
    """Every load level among ``points`` has the same repeats (a whole plan, or a whole repeat filter of one)."""
    return len({frozenset(r) for r in _repeats_by_level(mode, points).values()}) <= 1


def _ran_levels(mode: str, points: list[sweep_plan.SweepPoint]) -> str:
    """The levels of the points the job ran in words: :func:`_levels` when every level has the same repeats,
    else each level with its repeats: ``concurrency 1 (repeats 0, 1, 2), 16 (repeat 0)`` (a job cut short)."""
    if _even(mode, points):
        return _levels(mode, points)
    parts = []
    for lvl, reps in _repeats_by_level(mode, points).items():
        name = str(lvl) if mode == "concurrency" else sweep_plan.format_rate(lvl)
        parts.append(f"{name} (repeat{'s' if len(reps) > 1 else ''} {', '.join(str(r) for r in sorted(reps))})")
    return (
        ("concurrency " if mode == "concurrency" else "rates ")
        + ", ".join(parts)
        + ("" if mode == "concurrency" else " req/s")
    )


def _requests(bench: BenchConfig, point: sweep_plan.SweepPoint, num_prompts: dict[str, int] | None) -> int:
    """A point's request count: the job's (``num_prompts`` by point name), else the plan's minimum."""
    return (num_prompts or {}).get(point.name) or sweep_plan.prompts_for(
        bench.num_prompts, bench.prompts_per_concurrency, point.concurrency
    )


def run_by_hand(
    server: VLLMServer,
    bench: BenchConfig,
    model_path: str,
    env: StageEnv,
    out: Path,
    num_prompts: dict[str, int] | None = None,
    repeats: set[int] | None = None,
    seeds: dict[str, int] | None = None,
    concurrencies: set[int] | None = None,
    rates: set[float | str] | None = None,
    on_point: Callable[[dict[str, Any]], None] | None = None,
    ran: Collection[str] | None = None,
    repeated_tokens: dict[str, int] | None = None,
) -> list[dict[str, Any]]:
    """``vllm bench serve`` once per point of ``bench`` (the CLI, a process each), the cache reset around each.

    Args:
        server: a started server (dev mode: ``/reset_prefix_cache``).
        bench: the job's ``bench`` config (points, lengths, seed, warm-up count).
        model_path: the checkpoint folder (its tokenizer builds the prompts).
        env: the serve environment.
        out: where the CLI writes ``<point>.json``; ``<point>.checks.json`` (the server's checks) goes beside it.
        num_prompts: requests per point name (the job's, sized by its window); default
            :func:`~quantverdict.measure.sweep_plan.prompts_for`.
        repeats: only these repeat indices of each load level (None: all). A point keeps the seed of its
            place in the job's full plan, so ``{0}`` reruns the job's first repeat prompt for prompt.
        seeds: the seed per point name the job's run used (its record's ``seed``; default
            :func:`~quantverdict.measure.sweep_plan.point_seed` of the point's place in the plan).
        concurrencies: only these concurrency levels (None: all; see :func:`choose`).
        rates: only these offered rates, req/s or ``"inf"`` (None: all; see :func:`choose`).
        on_point: called with each point's row as soon as it is measured (before the next point starts), e.g.
            to write the comparison so far.
        ran: only the points of these names, those the job ran (None: the whole plan; see :func:`choose`).
        repeated_tokens: the job's repeated prompt tokens per point name (its record's ``prompt_repeat_tokens``):
            a point sent with the job's seed and request count sends the job's prompts, so its server checks
            subtract them as the job's did; other points' checks judge every hit.

    A warm-up of unmeasured prompts goes before the first point of each load level run here, as the sweep
    client does it without ``bench.prefetch_prompts`` (a later repeat follows a measured run at the same load;
    with it the job ran the waves before its sweep).

    Raises:
        ValueError: a chosen repeat or level that selects no point the job ran (:func:`choose`), before anything
            runs.
        RuntimeError: the CLI failed at a point (the points before it have their files and ``on_point`` calls).
        subprocess.CalledProcessError: a warm-up run failed.

    Returns:
        Per point in run order: :func:`quantverdict.measure.bench_result.parse_result`'s keys plus the
        :func:`quantverdict.measure.server_metrics.server_checks` keys (``prefix_cache_hit_rate``, ...) and
        ``seed`` (the one sent; kept in ``<point>.checks.json`` too, as vLLM's result file has none).
    """
    chosen = choose(bench, repeats, concurrencies, rates, ran)
    out.mkdir(parents=True, exist_ok=True)
    flags = supported_optional_flags(env)
    run_env = {**os.environ, **env.env}
    rows = []
    warmed: set[tuple[Any, Any]] = set()
    for i, point in chosen:
        n = _requests(bench, point, num_prompts)
        level = (point.offered_rate_rps, point.concurrency)
        n_warm = 0 if level in warmed else sweep_plan.warmup_requests(bench.warmup_prompts, point.concurrency)
        warmed.add(level)
        if n_warm > 0:  # unmeasured prompts (the warm-up seed) at the point's concurrency, not kept
            warm = bench_command(
                server, bench, model_path, env, point, out / "warmup", flags,
                seed=sweep_plan.warmup_seed(bench.seed), num_prompts=n_warm, warmups=False,
            )  # fmt: skip
            if point.concurrency is None:  # all at once, as the sweep client warms up
                warm[warm.index("--request-rate") + 1] = "inf"
            subprocess.run(warm, env=run_env, check=True, capture_output=True, timeout=bench.point_timeout_s)
        server.reset_prefix_cache()
        before = server.counters()
        seed = (seeds or {}).get(point.name, sweep_plan.point_seed(bench.seed, i))
        cmd = bench_command(
            server, bench, model_path, env, point, out, flags, seed=seed, num_prompts=n, warmups=False,
        )  # fmt: skip
        proc = subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=bench.point_timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(f"vllm bench serve failed at {point.name}: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
        time.sleep(COUNTER_SETTLE_S)  # the API server updates its counters after the last response
        after = server.counters()
        res = json.loads((out / f"{point.name}.json").read_text())
        row = bench_result.parse_result(res, point, n, bench.output_len, 0).to_dict()
        jobs_prompts = point.name in (seeds or {}) and point.name in (num_prompts or {})
        repeated = (repeated_tokens or {}).get(point.name) if jobs_prompts else None
        checks = server_metrics.server_checks(
            before, after, res["total_input_tokens"], res["total_output_tokens"], repeated
        ) | {"seed": seed}
        _write_json(out / f"{point.name}{CHECKS_SUFFIX}", checks)
        row.update(checks)
        rows.append(row)
        if on_point is not None:
            on_point(row)
    server.reset_prefix_cache()
    return rows


def read_by_hand(
    out: Path,
    bench: BenchConfig,
    chosen: list[tuple[int, sweep_plan.SweepPoint]],
    num_prompts: dict[str, int] | None = None,
) -> tuple[list[dict[str, Any]], dict[Path, str]]:
    """The by-hand rows of an earlier run, rebuilt from the files it left in ``out`` (no server, no CLI).

    Args:
        out: the by-hand run's folder (``<point>.json`` from the CLI, ``<point>.checks.json`` beside it).
        bench: the job's ``bench`` config (``output_len``; request counts where ``num_prompts`` lacks a point).
        chosen: the points to look for (:func:`choose`); those without a ``<point>.json`` are left out.
        num_prompts: requests per point name (the job's), passed to ``parse_result`` as :func:`run_by_hand` does.

    Returns:
        ``(rows, skipped)``. ``rows``: per point read, in run order,
        :func:`quantverdict.measure.bench_result.parse_result`'s keys plus the keys of its ``<point>.checks.json``
        when that file is there and readable (else no ``prefix_cache_hit_rate``: the table shows ``-``).
        ``skipped``: each file that could not be read -> why, naming it: a ``<point>.json`` that is not JSON (e.g.
        cut off mid-write) or not a vLLM bench result (no ``completed``/``duration``) leaves its point out; a
        ``<point>.checks.json`` that is not a JSON object leaves only the checks out of its point's row.
    """
    rows = []
    skipped: dict[Path, str] = {}
    for _, point in chosen:
        path = out / f"{point.name}.json"
        if not path.is_file():
            continue
        n = _requests(bench, point, num_prompts)
        try:
            row = bench_result.parse_result(json.loads(path.read_text()), point, n, bench.output_len, 0).to_dict()
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            skipped[path] = f"{path}: not a vLLM bench result ({type(exc).__name__}: {exc})"
            continue
        checks = out / f"{point.name}{CHECKS_SUFFIX}"
        if checks.is_file():
            try:
                found = json.loads(checks.read_text())
            except ValueError as exc:
                found = exc
            if isinstance(found, dict):
                row.update(found)
            else:
                why = f"{type(found).__name__}: {found}" if isinstance(found, ValueError) else "not an object"
                skipped[checks] = f"{checks}: not the server's checks ({why}); its point has no hit rate"
        rows.append(row)
    return rows, skipped


def clear_points(out: Path, chosen: list[tuple[int, sweep_plan.SweepPoint]]) -> int:
    """Remove an earlier run's files of the chosen points from ``out``: ``<point>.json``,
    ``<point>.checks.json`` and the warm-up's ``warmup/<point>.json`` (a new run must not mix with them: a
    report would pair new results with old checks, or show an old point as this run's).

    Args:
        out: the by-hand folder.
        chosen: the points about to run (:func:`choose`); other points' files are kept.

    Returns:
        The number of files removed.
    """
    removed = 0
    for _, point in chosen:
        for path in (
            out / f"{point.name}.json",
            out / f"{point.name}{CHECKS_SUFFIX}",
            out / "warmup" / f"{point.name}.json",
        ):
            if path.is_file():
                path.unlink()
                removed += 1
    return removed


def write_report(
    out: Path,
    rows: list[dict[str, Any]],
    by_hand: list[dict[str, Any]],
    chosen: list[str],
    error: str | None = None,
) -> Path:
    """Write ``<out>/fidelity.json``: ``{"rows": rows, "by_hand": by_hand, "chosen": chosen, "complete": ...}``
    (plus ``"error"`` when given), through a temporary file of its own in ``out`` and a rename, so a run killed
    mid-write keeps the last whole one.

    Args:
        out: the by-hand folder.
        rows: :func:`compare`'s rows so far.
        by_hand: the by-hand rows they come from (:func:`run_by_hand` or :func:`read_by_hand`).
        chosen: the names of the points the run (or the report) covers, in run order.
        error: why the run stopped early (the exception, one line).

    ``complete`` is true when every chosen point has a row (a filtered run is complete with its own points).

    Returns:
        The path written.
    """
    compared = {r["point"] for r in rows}
    doc: dict[str, Any] = {
        "rows": rows,
        "by_hand": by_hand,
        "chosen": list(chosen),
        "complete": all(name in compared for name in chosen),
    }
    if error is not None:
        doc["error"] = error
    path = out / "fidelity.json"
    _write_json(path, doc)
    return path


def _write_json(path: Path, obj: Any) -> None:
    """``obj`` as JSON at ``path``, through a temporary file beside it named after this process
    (``<name>.<pid>.tmp``: two processes writing into one folder never share it) and ``os.replace``; a failed
    write leaves ``path`` as it was and removes the temporary file."""
    text = json.dumps(obj, indent=1, default=str)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def compare(
    job_points: list[SweepPoint], by_hand: list[dict[str, Any]], tolerance: float = TOLERANCE
) -> list[dict[str, Any]]:
    """The job's points beside the by-hand ones, matched by point name.

    Returns:
        One row per point present in both: ``point``, ``job_<m>`` and ``by_hand_<m>`` for each shown metric
        (``output_tok_s``, ``ttft_ms_p50``), ``rel_diff`` (``|job - by hand| / by hand`` of output tok/s),
        ``within`` (``rel_diff <= tolerance``), ``by_hand_hit_rate`` (the by-hand run's prefix-cache hits /
        tokens looked up) and ``by_hand_excess_hit_rate`` (:func:`by_hand_excess_hit_rate`: the hits the job's
        repeated prompts leave unexplained; None where that cannot be said).

    E.g. job 102 tok/s, by hand 100: rel_diff 0.02, within 5%.
    """
    mine = {p.point: p for p in job_points}
    rows = []
    for hand in by_hand:
        if hand["point"] not in mine:
            continue
        job = mine[hand["point"]]
        row: dict[str, Any] = {"point": hand["point"]}
        for m in SHOWN:
            row[f"job_{m}"], row[f"by_hand_{m}"] = getattr(job, m), hand.get(m)
        a, b = getattr(job, JUDGED), hand.get(JUDGED)
        diff = abs(a - b) / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 else None
        row.update(rel_diff=diff, within=diff is not None and diff <= tolerance)
        row["by_hand_hit_rate"] = hand.get("prefix_cache_hit_rate")
        row["by_hand_excess_hit_rate"] = by_hand_excess_hit_rate(job, hand)
        rows.append(row)
    return rows


def by_hand_excess_hit_rate(job: SweepPoint, hand: dict[str, Any]) -> float | None:
    """The by-hand run's prefix-cache hits beyond the prompts that repeat inside the point, per token looked up.

    A by-hand point sent with the job's seed and request count sends the job's prompts, so the job's count of
    repeated prompt tokens (``prompt_repeat_tokens``, :mod:`quantverdict.measure.prompt_repeats`) explains the
    same hits there (vLLM's CLI returns no prompts to count them in). :func:`run_by_hand` subtracts them in the
    point's checks (``prompt_repeat_tokens`` set): that figure is returned. For a checks file written before it
    did, the rate is worked out here when the seed the by-hand run kept equals the job's and the prompt-token
    totals agree (with fixed lengths that is the request count); a file without a seed (written before seeds were
    kept) is taken at the request count alone: :func:`main` has always sent the job's seeds.

    Args:
        job: the job's point (``prompt_repeat_tokens``, ``seed``, ``input_tokens_total``).
        hand: the by-hand row (its checks: ``prefix_cache_hits``, ``prefix_cache_queries``, ``seed``,
            ``prompt_repeat_tokens``, ``prefix_cache_excess_hit_rate``; ``input_tokens_total`` from the CLI).

    Returns:
        ``max(0, hits - repeated tokens) / tokens looked up``; None when the job did not count its repeats (records
        before it), the by-hand checks are missing, or the seeds or the prompt-token totals differ (other prompts).

    E.g. H200, c=256 (2,376 requests of 256 tokens, seed 10): 13,856 hits of 608,256 tokens looked up by hand
    (2.28%), 14,848 repeated tokens in the job's run of the same prompts: 0 beyond them, 0.0%.
    """
    if hand.get("prompt_repeat_tokens") is not None:
        rate = hand.get("prefix_cache_excess_hit_rate")
        return rate if isinstance(rate, (int, float)) else None
    repeated, hits, queries = (
        job.prompt_repeat_tokens,
        hand.get("prefix_cache_hits"),
        hand.get("prefix_cache_queries"),
    )
    if not isinstance(repeated, int) or not isinstance(hits, int) or not isinstance(queries, int):
        return None
    if hand.get("seed") is not None and hand.get("seed") != job.seed:
        return None
    sent, ours = job.input_tokens_total, hand.get("input_tokens_total")
    if sent is None or ours is None or int(sent) != int(ours):
        return None
    return server_metrics.hit_rate(server_metrics.excess_hits(hits, repeated), queries)


def within_factor(row: dict[str, Any], factor: float = CPU_MAX_RATIO) -> bool:
    """True when a :func:`compare` row's job and by-hand output tok/s are within ``factor`` of each other, either
    way round (``1 / factor <= job / by hand <= factor``); False when either is missing or not positive.

    E.g. job 16.96, by hand 10.26: 1.65, within a factor of 2; job 3.0, by hand 10.0: 0.30, not within.
    """
    a, b = row.get(f"job_{JUDGED}"), row.get(f"by_hand_{JUDGED}")
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or a <= 0 or b <= 0:
        return False
    return 1 / factor <= a / b <= factor


def render(rows: list[dict[str, Any]], tolerance: float = TOLERANCE) -> str:
    """The comparison as a markdown table (values rounded for reading)."""

    def f(v: Any, nd: int = 1) -> str:
        return "-" if v is None else f"{v:,.{nd}f}"

    lines = [
        "| point | job out tok/s | by hand out tok/s | diff | job TTFT p50 ms | by hand TTFT p50 ms "
        "| by-hand cache hits (beyond the job's repeated prompts) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        flag = "" if r["within"] else f" **> {100 * tolerance:g}%**"
        hit = "-" if r["by_hand_hit_rate"] is None else f"{100 * r['by_hand_hit_rate']:.2f}%"
        if r.get("by_hand_excess_hit_rate") is not None:
            hit += f" ({100 * r['by_hand_excess_hit_rate']:.2f}%)"
        diff = "-" if r["rel_diff"] is None else f"{100 * r['rel_diff']:.1f}%"
        lines.append(
            f"| {r['point']} | {f(r['job_output_tok_s'])} | {f(r['by_hand_output_tok_s'])} | {diff}{flag} | "
            f"{f(r['job_ttft_ms_p50'], 0)} | {f(r['by_hand_ttft_ms_p50'], 0)} | {hit} |"
        )
    return "\n".join(lines)


def _rate(text: str) -> float | str:
    """``--rate`` value: req/s (> 0) or ``inf`` (:func:`~quantverdict.measure.sweep_plan.normalize_rate`)."""
    return sweep_plan.normalize_rate(text)


def _verdict(rows: list[dict[str, Any]], tolerance: float) -> int:
    """1 (and the points named on stderr) when a row is outside the tolerance, else 0."""
    bad = [r["point"] for r in rows if not r["within"]]
    if bad:
        print(f"outside +-{100 * tolerance:g}%: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    """Run the check (or, with ``--report-only``, re-read one); see the module docstring.

    Returns:
        0 every compared point within the tolerance; 1 one or more outside it; 2 bad input or nothing to
        compare: a record without speed points, a ``--repeat``/``--concurrency``/``--rate`` value that selects
        no point the job ran (nothing starts), a run whose by-hand points match none of the job's, with
        ``--report-only`` no readable by-hand file of a chosen point; 3 the run stopped on an error (a failed
        CLI run, a server that did not start: the traceback on stderr; ``fidelity.json`` holds the finished
        points and ``error``, ``complete`` false unless every chosen point had finished; the server is stopped).

    Raises:
        KeyboardInterrupt: re-raised (as is ``SystemExit``) once ``fidelity.json`` is written as for code 3.
    """
    ap = argparse.ArgumentParser(prog="python -m tools.bench.fidelity", description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("record", type=Path, help="a finished job's record.json (or its folder)")
    ap.add_argument("--port", type=int, default=None, help="server port (default: the job's bench.server.port)")
    ap.add_argument("--tolerance", type=float, default=TOLERANCE, help="allowed |job - by hand| / by hand")
    ap.add_argument("--out", type=Path, default=None, help="where the by-hand results go (default: <job>/fidelity)")
    ap.add_argument(
        "--repeat",
        type=int,
        action="append",
        default=None,
        metavar="K",
        help="check only repeat K of each load level (repeatable; default: every repeat the job ran), e.g. "
        "--repeat 0: one by-hand run per level against the job's same-seed run",
    )
    ap.add_argument(
        "--concurrency",
        type=int,
        action="append",
        default=None,
        metavar="C",
        help="check only concurrency level C of a concurrency sweep (repeatable; default: every level the job ran)",
    )
    ap.add_argument(
        "--rate",
        type=_rate,
        action="append",
        default=None,
        metavar="R",
        help="check only offered rate R req/s (or inf) of a rate sweep (repeatable; default: every rate the job ran)",
    )
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="start nothing: rebuild the comparison from the <point>.json files already in --out",
    )
    args = ap.parse_args(argv)
    path = args.record / "record.json" if args.record.is_dir() else args.record
    record = read(path)
    cfg = job_config(record.config)
    points = record.speed.points
    if not points:
        print(f"{path}: the record has no speed points", file=sys.stderr)
        return 2
    ran = {str(p.point) for p in points}
    repeats = set(args.repeat) if args.repeat else None
    concurrencies = set(args.concurrency) if args.concurrency else None
    rates = set(args.rate) if args.rate else None
    try:
        chosen = choose(cfg.bench, repeats, concurrencies, rates, ran)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    names = [p.name for _, p in chosen]
    out = args.out or path.parent / "fidelity"
    sent = {str(p.point): int(p.num_prompts or 0) for p in points}
    if args.report_only:
        return _report_only(out, cfg.bench, chosen, points, sent, args.tolerance)
    env = envs.ensure("serve", cfg.env.serve, cfg.env, PROJECT_ROOT)
    server_cfg = cfg.bench.server
    dtype = ChosenDtype.of(record.speed.dtype).value
    if dtype:
        server_cfg = dataclasses.replace(server_cfg, dtype=ComputeDtype(dtype))
    if cfg.model.serve_args:
        server_cfg = dataclasses.replace(server_cfg, extra_args=[*server_cfg.extra_args, *cfg.model.serve_args])
    if args.port:
        server_cfg = dataclasses.replace(server_cfg, port=args.port)
    model_path = str(record.checkpoint.path)
    server = VLLMServer(
        env,
        model_path,
        record.speed.served_model or f"{cfg.model.name}-{cfg.scheme.name}",
        server_cfg,
        cfg.bench.server.max_model_len or cfg.model.max_model_len,
        str(cfg.env.device),
        out / "vllm_server.log",
        compile_cache_dir=compile_cache_dir(cfg),
    )
    seeds = {str(p.point): p.seed for p in points if p.seed is not None}
    repeated = {str(p.point): p.prompt_repeat_tokens for p in points if p.prompt_repeat_tokens is not None}
    if removed := clear_points(out, chosen):
        print(f"removed {removed} files of an earlier run of these points from {out}", file=sys.stderr)
    write_report(out, [], [], names)  # no earlier run's rows beside this run's files
    by_hand: list[dict[str, Any]] = []

    def keep(row: dict[str, Any]) -> None:  # after every point: what a run stopped mid-way keeps
        by_hand.append(row)
        rows = compare(points, by_hand, args.tolerance)
        write_report(out, rows, by_hand, names)
        mine = [r for r in rows if r["point"] == row["point"]]
        diff = f"{100 * mine[0]['rel_diff']:.2f}%" if mine and mine[0]["rel_diff"] is not None else "no job point"
        tok_s = "-" if row.get(JUDGED) is None else f"{row[JUDGED]:,.1f}"
        print(f"{row['point']} ({len(by_hand)}/{len(chosen)}): by hand {tok_s} out tok/s, {diff}", file=sys.stderr)

    try:
        with server:
            run_by_hand(
                server, cfg.bench, model_path, env, out, sent, repeats, seeds,
                concurrencies=concurrencies, rates=rates, on_point=keep, ran=ran, repeated_tokens=repeated,
            )  # fmt: skip
    except BaseException as exc:  # the finished points stay comparable; the server is stopped by then
        error = f"{type(exc).__name__} after {len(by_hand)} of {len(chosen)} points: {exc}"[:4000]
        write_report(out, compare(points, by_hand, args.tolerance), by_hand, names, error=error)
        if not isinstance(exc, Exception):  # Ctrl-C, SystemExit: not this check's error
            raise
        traceback.print_exc()
        print(f"stopped: {error.splitlines()[0]}; {out / 'fidelity.json'} holds the finished points", file=sys.stderr)
        return 3
    rows = compare(points, by_hand, args.tolerance)
    write_report(out, rows, by_hand, names)
    compared = {r["point"] for r in rows}
    if unmatched := [h["point"] for h in by_hand if h["point"] not in compared]:
        print(f"no job point to compare with (by hand only): {', '.join(unmatched)}", file=sys.stderr)
    if not rows:
        print(f"nothing compared: none of the {len(by_hand)} by-hand points is among the job's", file=sys.stderr)
        return 2
    print(render(rows, args.tolerance))
    return _verdict(rows, args.tolerance)


def _report_only(
    out: Path,
    bench: BenchConfig,
    chosen: list[tuple[int, sweep_plan.SweepPoint]],
    points: list[SweepPoint],
    sent: dict[str, int],
    tolerance: float,
) -> int:
    """``--report-only``: the table and ``fidelity.json`` from the by-hand files in ``out``; :func:`main`'s codes.

    A ``<point>.json`` that cannot be read is skipped (a warning on stderr names it) and counted among the
    missing points; one whose ``<point>.checks.json`` cannot be read is shown without a hit rate (a warning
    alike). An earlier ``fidelity.json``'s ``"error"`` is kept in the rewritten one.
    """
    by_hand, skipped = read_by_hand(out, bench, chosen, sent)
    for why in skipped.values():
        print(f"skipped {why}", file=sys.stderr)
    rows = compare(points, by_hand, tolerance)
    if not rows:
        names = ", ".join(f"{p.name}.json" for _, p in chosen[:4]) + (", ..." if len(chosen) > 4 else "")
        print(f"{out}: no readable by-hand result of a point the job ran (looked for {names})", file=sys.stderr)
        return 2
    print(render(rows, tolerance))
    compared = {r["point"] for r in rows}
    missing = [
        p.name + (" (unreadable)" if out / f"{p.name}.json" in skipped else "")
        for _, p in chosen
        if p.name not in compared
    ]
    print(f"{len(rows)} of {len(chosen)} chosen points compared; no by-hand result: {', '.join(missing) or 'none'}")
    error = _earlier_error(out / "fidelity.json")
    if error is not None:
        print(f"kept the earlier run's error: {error.splitlines()[0] if error else error}", file=sys.stderr)
    write_report(out, rows, by_hand, [p.name for _, p in chosen], error=error)
    return _verdict(rows, tolerance)


def _earlier_error(path: Path) -> str | None:
    """The ``"error"`` of an earlier ``fidelity.json`` at ``path`` (None: no file, no error, or not readable)."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        print(f"{path}: not read ({exc}); an error it held is not kept", file=sys.stderr)
        return None
    error = doc.get("error") if isinstance(doc, dict) else None
    return error if isinstance(error, str) else None


if __name__ == "__main__":
    sys.exit(main())
