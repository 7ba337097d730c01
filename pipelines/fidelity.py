"""The fidelity check: ``vllm bench serve`` by hand (the CLI, one process per point) on a fresh server against
a finished job's checkpoint, the prefix cache reset around each point, printed beside the job's own sweep numbers.

    python -m pipelines.fidelity runs/.../<job>/record.json               # the job's config, a fresh server
    python -m pipelines.fidelity runs/.../<job>/record.json --port 8799 --tolerance 0.05
    python -m pipelines.fidelity runs/.../<job>/record.json --repeat 0    # one run per load level
    python -m pipelines.fidelity runs/.../<job>/record.json --repeat 0 --concurrency 64 --concurrency 256
    python -m pipelines.fidelity runs/.../<job>/record.json --rate 4 --rate inf   # levels of a rate sweep
    python -m pipelines.fidelity runs/.../<job>/record.json --report-only # no server: re-read <job>/fidelity
    python -m pipelines.fidelity runs/.../<job>/record.json --report-only --out DIR --repeat 0  # a run's files

The by-hand run uses the job's points in the job's order, each with the job's seed
(:func:`quantverdict.measure.sweep_plan.point_seed`) and request count, ``--num-warmups 0
--ready-check-timeout-sec 0`` (vLLM's own warm-up and ready check send the first measured prompt), a
warm-up run of unmeasured prompts at the point's concurrency before each point (as the sweep client does),
and ``POST /reset_prefix_cache`` between that warm-up and the point and after it; the server's ``/metrics``
prefix-cache counters are read around each point, so the by-hand hit rate is shown beside (no reuse across
points; vLLM's random dataset repeats a few prompts inside one, as in the job). A point
whose output tok/s differs from the job's by more than the tolerance (5%) is flagged; the exit code is 1
when any is. TTFT p50 is printed beside it (not judged: at small windows it moves more than 5% between two
runs of one method).

``--repeat K``, ``--concurrency C`` and ``--rate R`` (each repeatable, combinable) choose the points: those
of the chosen repeats at the chosen load levels. A chosen point keeps the seed of its place in the job's full
plan, so it sends the prompts the job's run of it sent. A value the job did not run stops the check before
any server starts (exit code 2), naming the flag and the levels the job ran.

Each point costs a warm-up and a measured CLI run (each a process that imports vLLM, ~20 s of it), so a GPU
lease can end mid-run. What a finished point leaves in ``--out`` (default ``<job>/fidelity``) is kept: the
CLI's ``<point>.json``, the server's checks ``<point>.checks.json`` (prefix-cache hit rate, token counts:
:func:`quantverdict.measure.server_metrics.server_checks`) and ``fidelity.json``, rewritten after every point
with the rows compared so far (``{"rows": ..., "by_hand": ..., "complete": false}``; ``true`` once every
chosen point ran; ``"error"`` added when the run stopped on one). ``--report-only`` starts nothing: it rebuilds the
comparison from the ``<point>.json`` (and ``<point>.checks.json``) files already in ``--out``, prints the
table and rewrites ``fidelity.json``; exit code 2 when no file there is a point of the job.

On CPU the same check runs in ``tests/integration/test_sweep_cache.py`` on the embedded model.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quantverdict.config.compose import PROJECT_ROOT, job_config
from quantverdict.config.schema import BenchConfig, ComputeDtype
from quantverdict.measure import bench_result, server_metrics, sweep_plan
from quantverdict.processes import envs
from quantverdict.processes.envs import StageEnv
from quantverdict.serving.benchmark import bench_command, supported_optional_flags
from quantverdict.serving.lifecycle import compile_cache_dir
from quantverdict.serving.server import VLLMServer

TOLERANCE = 0.05  # issue 16: every point within +-5% of the job's
CPU_TOLERANCE = 0.15  # two CPU runs on a shared 2-core machine (see tests/integration/test_sweep_cache.py)
JUDGED = "output_tok_s"
SHOWN = ("output_tok_s", "ttft_ms_p50")
CHECKS_SUFFIX = ".checks.json"  # <point>.checks.json: the server's checks of a by-hand point
COUNTER_SETTLE_S = 1.0  # wait after a point before reading /metrics (the API server counts after responding)


def choose(
    bench: BenchConfig,
    repeats: set[int] | None = None,
    concurrencies: set[int] | None = None,
    rates: set[float | str] | None = None,
) -> list[tuple[int, sweep_plan.SweepPoint]]:
    """The points of the job's plan to run (or read) by hand: those of the chosen repeats at the chosen levels.

    Args:
        bench: the job's ``bench`` config (mode, levels, repeats).
        repeats: repeat indices to keep (None: every repeat).
        concurrencies: concurrency levels to keep (a concurrency sweep; None: every level).
        rates: offered rates to keep, req/s (a rate sweep; as :func:`~quantverdict.measure.sweep_plan.normalize_rate`
            gives them: a float or ``"inf"``; None: every rate).

    Returns:
        ``(index in the job's full plan, point)`` in run order. The index is the point's place in
        :func:`~quantverdict.measure.sweep_plan.plan`, so :func:`~quantverdict.measure.sweep_plan.point_seed`
        of it is the seed the job's run of that point used, whatever is left out.

    Raises:
        ValueError: values the job's plan does not hold; one message naming each such flag, its unknown values
            and the levels the job ran, e.g. ``--concurrency 32: the job ran concurrency 1, 16, 64, 256``.

    E.g. concurrency 1, 16, 64, 256 with 3 repeats, ``repeats={0}``, ``concurrencies={64, 256}``:
    ``[(6, conc-64_r0), (9, conc-256_r0)]`` (seeds ``base + 7`` and ``base + 10``).
    """
    points = sweep_plan.plan(bench.mode, list(bench.rates), list(bench.concurrencies), bench.repeats)
    levels = _levels(bench.mode, points)
    errors = []
    if repeats is not None and (unknown := repeats - {p.repeat for p in points}):
        ran = sorted({p.repeat for p in points})
        errors.append(f"--repeat {_join(unknown)}: the job ran repeats {ran} of each level")
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
    if errors:
        raise ValueError("; ".join(errors))
    return [
        (i, p)
        for i, p in enumerate(points)
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

    A warm-up of unmeasured prompts goes before the first point of each load level run here, as the sweep
    client does it (a later repeat follows a measured run at the same load).

    Raises:
        ValueError: a chosen repeat or level that the plan does not hold (:func:`choose`), before anything runs.
        RuntimeError: the CLI failed at a point (the points before it have their files and ``on_point`` calls).
        subprocess.CalledProcessError: a warm-up run failed.

    Returns:
        Per point in run order: :func:`quantverdict.measure.bench_result.parse_result`'s keys plus the
        :func:`quantverdict.measure.server_metrics.server_checks` keys (``prefix_cache_hit_rate``, ...).
    """
    chosen = choose(bench, repeats, concurrencies, rates)
    out.mkdir(parents=True, exist_ok=True)
    flags = supported_optional_flags(env)
    run_env = {**os.environ, **env.env}
    rows = []
    warmed: set[tuple[Any, Any]] = set()
    for i, point in chosen:
        n = (num_prompts or {}).get(point.name) or sweep_plan.prompts_for(
            bench.num_prompts, bench.prompts_per_concurrency, point.concurrency
        )
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
        cmd = bench_command(
            server, bench, model_path, env, point, out, flags,
            seed=(seeds or {}).get(point.name, sweep_plan.point_seed(bench.seed, i)), num_prompts=n, warmups=False,
        )  # fmt: skip
        proc = subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=bench.point_timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(f"vllm bench serve failed at {point.name}: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
        time.sleep(COUNTER_SETTLE_S)  # the API server updates its counters after the last response
        after = server.counters()
        res = json.loads((out / f"{point.name}.json").read_text())
        row = bench_result.parse_result(res, point, n, bench.output_len, 0)
        checks = server_metrics.server_checks(before, after, res["total_input_tokens"], res["total_output_tokens"])
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
) -> list[dict[str, Any]]:
    """The by-hand rows of an earlier run, rebuilt from the files it left in ``out`` (no server, no CLI).

    Args:
        out: the by-hand run's folder (``<point>.json`` from the CLI, ``<point>.checks.json`` beside it).
        bench: the job's ``bench`` config (``output_len``; request counts where ``num_prompts`` lacks a point).
        chosen: the points to look for (:func:`choose`); those without a ``<point>.json`` are left out.
        num_prompts: requests per point name (the job's), passed to ``parse_result`` as :func:`run_by_hand` does.

    Returns:
        Per point found, in run order: :func:`quantverdict.measure.bench_result.parse_result`'s keys plus the
        keys of its ``<point>.checks.json`` when that file is there (else no ``prefix_cache_hit_rate``: the
        table shows ``-``).

    Raises:
        ValueError: a ``<point>.json`` or ``<point>.checks.json`` that is not JSON, or not a vLLM bench result
            (no ``completed``/``duration``), naming the file.
    """
    rows = []
    for _, point in chosen:
        path = out / f"{point.name}.json"
        if not path.is_file():
            continue
        n = (num_prompts or {}).get(point.name) or sweep_plan.prompts_for(
            bench.num_prompts, bench.prompts_per_concurrency, point.concurrency
        )
        try:
            row = bench_result.parse_result(json.loads(path.read_text()), point, n, bench.output_len, 0)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a vLLM bench result ({type(exc).__name__}: {exc})") from exc
        checks = out / f"{point.name}{CHECKS_SUFFIX}"
        if checks.is_file():
            try:
                row.update(json.loads(checks.read_text()))
            except ValueError as exc:
                raise ValueError(f"{checks}: not JSON ({exc})") from exc
        rows.append(row)
    return rows


def write_report(
    out: Path, rows: list[dict[str, Any]], by_hand: list[dict[str, Any]], complete: bool, error: str | None = None
) -> Path:
    """Write ``<out>/fidelity.json``: ``{"rows": rows, "by_hand": by_hand, "complete": complete}`` (plus
    ``"error"`` when given), through a temporary file and a rename, so a run killed mid-write keeps the last
    whole one.

    Args:
        out: the by-hand folder.
        rows: :func:`compare`'s rows so far.
        by_hand: the by-hand rows they come from (:func:`run_by_hand` or :func:`read_by_hand`).
        complete: every chosen point has a by-hand result.
        error: why the run stopped early (the exception, one line).

    Returns:
        The path written.
    """
    doc: dict[str, Any] = {"rows": rows, "by_hand": by_hand, "complete": complete}
    if error is not None:
        doc["error"] = error
    path = out / "fidelity.json"
    _write_json(path, doc)
    return path


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


def compare(
    job_points: list[dict[str, Any]], by_hand: list[dict[str, Any]], tolerance: float = TOLERANCE
) -> list[dict[str, Any]]:
    """The job's points beside the by-hand ones, matched by point name.

    Returns:
        One row per point present in both: ``point``, ``job_<m>`` and ``by_hand_<m>`` for each shown metric
        (``output_tok_s``, ``ttft_ms_p50``), ``rel_diff`` (``|job - by hand| / by hand`` of output tok/s),
        ``within`` (``rel_diff <= tolerance``), ``by_hand_hit_rate`` (the by-hand run's prefix-cache hits).

    E.g. job 102 tok/s, by hand 100: rel_diff 0.02, within 5%.
    """
    mine = {p["point"]: p for p in job_points}
    rows = []
    for hand in by_hand:
        job = mine.get(hand["point"])
        if job is None:
            continue
        row: dict[str, Any] = {"point": hand["point"]}
        for m in SHOWN:
            row[f"job_{m}"], row[f"by_hand_{m}"] = job.get(m), hand.get(m)
        a, b = job.get(JUDGED), hand.get(JUDGED)
        diff = abs(a - b) / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 else None
        row.update(rel_diff=diff, within=diff is not None and diff <= tolerance)
        row["by_hand_hit_rate"] = hand.get("prefix_cache_hit_rate")
        rows.append(row)
    return rows


def render(rows: list[dict[str, Any]], tolerance: float = TOLERANCE) -> str:
    """The comparison as a markdown table (values rounded for reading)."""

    def f(v: Any, nd: int = 1) -> str:
        return "-" if v is None else f"{v:,.{nd}f}"

    lines = [
        "| point | job out tok/s | by hand out tok/s | diff | job TTFT p50 ms | by hand TTFT p50 ms "
        "| by-hand cache hits |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        flag = "" if r["within"] else f" **> {100 * tolerance:g}%**"
        hit = "-" if r["by_hand_hit_rate"] is None else f"{100 * r['by_hand_hit_rate']:.2f}%"
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
        0 every compared point within the tolerance; 1 one or more outside it; 2 bad input, nothing ran (a
        record without speed points, a ``--repeat``/``--concurrency``/``--rate`` value the job did not run,
        with ``--report-only`` no by-hand file of a job point or one that is not a vLLM result).

    Raises:
        RuntimeError: a by-hand point failed (``fidelity.json`` then holds the points before it, with
            ``complete: false`` and ``error``; the server is stopped).
    """
    ap = argparse.ArgumentParser(prog="python -m pipelines.fidelity", description=(__doc__ or "").split("\n\n")[0])
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
        help="check only concurrency level C of a concurrency sweep (repeatable; default: every level)",
    )
    ap.add_argument(
        "--rate",
        type=_rate,
        action="append",
        default=None,
        metavar="R",
        help="check only offered rate R req/s (or inf) of a rate sweep (repeatable; default: every rate)",
    )
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="start nothing: rebuild the comparison from the <point>.json files already in --out",
    )
    args = ap.parse_args(argv)
    path = args.record / "record.json" if args.record.is_dir() else args.record
    record = json.loads(path.read_text())
    cfg = job_config(record)
    points = (record.get("speed") or {}).get("points") or []
    if not points:
        print(f"{path}: the record has no speed points", file=sys.stderr)
        return 2
    repeats = set(args.repeat) if args.repeat else None
    concurrencies = set(args.concurrency) if args.concurrency else None
    rates = set(args.rate) if args.rate else None
    try:
        chosen = choose(cfg.bench, repeats, concurrencies, rates)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    out = args.out or path.parent / "fidelity"
    sent = {p["point"]: p["num_prompts"] for p in points}
    if args.report_only:
        return _report_only(out, cfg.bench, chosen, points, sent, args.tolerance)
    env = envs.ensure("serve", cfg.env.serve, cfg.env, PROJECT_ROOT)
    server_cfg = cfg.bench.server
    dtype = ((record.get("speed") or {}).get("dtype") or {}).get("value")
    if dtype:
        server_cfg = dataclasses.replace(server_cfg, dtype=ComputeDtype(dtype))
    if cfg.model.serve_args:
        server_cfg = dataclasses.replace(server_cfg, extra_args=[*server_cfg.extra_args, *cfg.model.serve_args])
    if args.port:
        server_cfg = dataclasses.replace(server_cfg, port=args.port)
    model_path = record["checkpoint"]["path"]
    server = VLLMServer(
        env,
        model_path,
        (record.get("speed") or {}).get("served_model") or f"{cfg.model.name}-{cfg.scheme.name}",
        server_cfg,
        cfg.bench.server.max_model_len or cfg.model.max_model_len,
        str(cfg.env.device),
        out / "vllm_server.log",
        compile_cache_dir=compile_cache_dir(cfg),
    )
    seeds = {p["point"]: int(p["seed"]) for p in points if isinstance(p.get("seed"), int)}
    by_hand: list[dict[str, Any]] = []

    def keep(row: dict[str, Any]) -> None:  # after every point: what a run stopped mid-way keeps
        by_hand.append(row)
        rows = compare(points, by_hand, args.tolerance)
        write_report(out, rows, by_hand, complete=False)
        mine = [r for r in rows if r["point"] == row["point"]]
        diff = f"{100 * mine[0]['rel_diff']:.2f}%" if mine and mine[0]["rel_diff"] is not None else "no job point"
        tok_s = "-" if row.get(JUDGED) is None else f"{row[JUDGED]:,.1f}"
        print(f"{row['point']} ({len(by_hand)}/{len(chosen)}): by hand {tok_s} out tok/s, {diff}", file=sys.stderr)

    try:
        with server:
            run_by_hand(
                server, cfg.bench, model_path, env, out, sent, repeats, seeds,
                concurrencies=concurrencies, rates=rates, on_point=keep,
            )  # fmt: skip
    except BaseException as exc:  # the finished points stay comparable; the server is stopped by then
        error = f"{type(exc).__name__} after {len(by_hand)} of {len(chosen)} points: {exc}"[:4000]
        write_report(out, compare(points, by_hand, args.tolerance), by_hand, complete=False, error=error)
        print(f"stopped: {error.splitlines()[0]}; {out / 'fidelity.json'} holds the finished points", file=sys.stderr)
        raise
    rows = compare(points, by_hand, args.tolerance)
    print(render(rows, args.tolerance))
    write_report(out, rows, by_hand, complete=True)
    return _verdict(rows, args.tolerance)


def _report_only(
    out: Path,
    bench: BenchConfig,
    chosen: list[tuple[int, sweep_plan.SweepPoint]],
    points: list[dict[str, Any]],
    sent: dict[str, int],
    tolerance: float,
) -> int:
    """``--report-only``: the table and ``fidelity.json`` from the by-hand files in ``out``; :func:`main`'s codes."""
    try:
        by_hand = read_by_hand(out, bench, chosen, sent)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    rows = compare(points, by_hand, tolerance)
    if not rows:
        names = ", ".join(f"{p.name}.json" for _, p in chosen[:4]) + (", ..." if len(chosen) > 4 else "")
        print(f"{out}: no by-hand result of a point the job ran (looked for {names})", file=sys.stderr)
        return 2
    print(render(rows, tolerance))
    missing = [p.name for _, p in chosen if p.name not in {h["point"] for h in by_hand}]
    print(f"{len(rows)} of {len(chosen)} chosen points compared; no by-hand result: {', '.join(missing) or 'none'}")
    write_report(out, rows, by_hand, complete=not missing)
    return _verdict(rows, tolerance)


if __name__ == "__main__":
    sys.exit(main())
