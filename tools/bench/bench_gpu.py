"""The GPU results report: one Markdown file per model from the records of finished GPU grids.

The grids themselves are ordinary Hydra multiruns; on a machine with several GPUs Ray runs their jobs at
once, each on the GPUs it asks for (``hydra/launcher=ray``: ``conf/hydra/launcher/ray.yaml``), e.g.::

    python -m pipelines.run -m hydra/launcher=ray env=gpu bench=gpu-concurrency eval=gpu \
        paths.output_root=/tmp/qvgpu/llama model=llama3.1-8b-shape scheme=bf16,gptq,fp8,w8a8
    python -m tools.bench.bench_gpu --out /tmp/qvgpu/llama /tmp/qvgpu/embedded --results docs/results

Results: ``<results>/gpu-<model>.md`` (memory, accuracy, speed, roofline and stage-time tables from the
records, :func:`quantverdict.results.table.format_table`); each grid also writes its review into its own
folder (``<out>/multirun/<time>/review/``), and ``python -m pipelines.review`` reruns it with other
constraints on the exported records (``--export-records``). Records of several runs are joined: a finished
job supersedes an interrupted or failed one of the same model and scheme, so a grid cut short and the rerun
of its missing schemes make one table.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

from quantverdict.config.compose import job_config
from quantverdict.measure import sweep, sweep_plan, vllm_log
from quantverdict.results.record import (
    HEAD_SECTIONS,
    JobRecord,
    ServerMemory,
    SweepPoint,
    TimeSplit,
    find_records,
    load,
    mark_interrupted,
)
from quantverdict.results.table import format_table
from quantverdict.review.sources import dedupe
from quantverdict.serving.benchmark import finished_points, parse_point
from quantverdict.serving.speed import speed_validity

ROOT = Path(__file__).resolve().parents[2]


def reparse_points(rec: JobRecord, job_dir: Path) -> bool:
    """Re-read each sweep point from its files in ``<job>/bench/`` (vLLM's ``<point>.json`` and the client's
    ``<point>.qv.json``, :func:`quantverdict.serving.benchmark.parse_point`) where both exist, so a fixed
    parser or a sidecar completed after the run (``quantverdict.children.recount_repeats``) applies; the
    recorded ``result_file`` path is kept. Returns whether any point was re-read."""
    points = rec.speed.points
    bench_dir = job_dir / "bench"
    if not points or not bench_dir.is_dir():
        return False
    bench_cfg, by_name = None, {}
    reread = False
    for i, old in enumerate(points):
        name = str(old.point)
        if not all((bench_dir / f"{name}{x}").is_file() for x in (".json", ".qv.json")):
            continue
        if bench_cfg is None:  # the job's config, composed once a point has its files
            bench_cfg = job_config(rec.config).bench
            by_name = {p.name: p for p in sweep_plan.plan(
                bench_cfg.mode, list(bench_cfg.rates), list(bench_cfg.concurrencies), bench_cfg.repeats
            )}  # fmt: skip
        if name not in by_name:
            continue
        new = parse_point(bench_dir, by_name[name], bench_cfg)
        # what the sweep added beside the client's files: kept as recorded
        for key in ("result_file", "gpu", "host", "server_start", "start_order", "sampling"):
            if old.has(key):
                setattr(new, key, getattr(old, key))
        points[i] = new
        reread = True
    return reread


def rederive(rec: dict, job_dir: Path) -> dict:
    """Re-read the fields a record takes from the job's raw files with this checkout's parsers, so a parser
    fix applies to finished runs: a job killed mid-sweep (its record left ``running``, no points) first gets the
    points it finished from ``bench/sweep.jsonl`` (:func:`quantverdict.serving.benchmark.finished_points`),
    then the sweep points from ``bench/`` (:func:`reparse_points`), then memory,
    kernels, the kernel check and the per-load summary from the vLLM server log, and the server-start parts of the
    benchmark split (``speed.time_split``: compile, graph capture, the warm-up after it) from the same log.
    Returns the record as its dict."""
    typed = JobRecord.view(mark_interrupted(rec))  # the machine was given back mid-job: say so, keep what finished
    speed = typed.speed
    if not speed.is_empty() and not speed.points:
        # killed mid-sweep (no `finally` ran, so the record has no points): the points it finished
        done = finished_points(job_dir / "bench")
        if done:
            speed.points = [SweepPoint.model_validate(p) for p in done]
    reread = reparse_points(typed, job_dir)
    log_path = job_dir / "vllm_server.log"
    act = (typed.cfg.scheme.activation_bits or 16) < 16  # the job's config
    if log_path.is_file():
        typed.memory.server = ServerMemory.model_validate(vllm_log.parse(log_path.read_text(errors="replace"), act))
    if speed.points and (reread or log_path.is_file()):
        speed_validity(speed, typed.job.scheme_label or "", typed.memory.server, act)
    if speed.time_split is not None and log_path.is_file():
        ts = TimeSplit.of(speed.time_split)
        speed.time_split = sweep.time_split(
            ts.server_start_s, typed.memory.server.to_dict(), [p.to_dict() for p in speed.points], ts.sweep_wall_s
        )
    return typed.to_dict()


def supersede(recs: list[dict]) -> list[dict]:
    """One job per model and scheme where runs overlap, in the order found, by the review's rule
    (:func:`quantverdict.review.sources.dedupe`: a finished job before an unfinished one, then the newest):
    the run that completed a cut-short grid replaces its interrupted jobs, a repeated grid its older jobs."""
    views = [JobRecord.view(r) for r in recs]
    kept = {id(v) for v in dedupe(views)[0]}
    return [r for r, v in zip(recs, views) if id(v) in kept]


def load_records(outs: list[Path]) -> list[dict]:
    """Every job record under the run folders ``outs`` (reused ones left out), re-derived
    (:func:`rederive`), unfinished jobs superseded by finished ones (:func:`supersede`)."""
    recs = []
    for out in outs:
        if not out.is_dir():
            raise FileNotFoundError(f"--out {out}: no such folder of runs")
        for path in find_records(out):
            try:
                recs.append((load(path), path.parent))
            except ValueError as exc:  # a JSON file of the same name that is not a job record
                print(f"skipped {path}: {exc}", file=sys.stderr)
    return supersede([rederive(r, d) for r, d in recs if not JobRecord.view(r, only=HEAD_SECTIONS).job.resumed_from])


def export_records(recs: list[dict], dest: Path) -> list[Path]:
    """Write each record to ``dest/<model>/<scheme>/record.json``, a small tree that
    ``python -m pipelines.review dest/<model>`` reads."""
    written = []
    for rec in recs:
        job = JobRecord.view(rec, only=HEAD_SECTIONS).job
        target = dest / str(job.model) / str(job.scheme) / "record.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(rec, indent=1, default=str))
        written.append(target)
    return written


def run_settings(recs: list[dict]) -> list[str]:
    """What the jobs of ``recs`` ran with, read from their records (not from this checkout's defaults): one
    line per distinct combination of sweep and evaluation settings, with the jobs that used it, e.g.
    ``bench=gpu-concurrency: concurrency 256, repeats 3, 256 in / 128 out; eval=gpu (vllm backend): bf16, gptq``.
    """
    lines: dict[str, list[str]] = {}
    for rec in recs:
        head = JobRecord.view(rec, only=HEAD_SECTIONS)
        bench, ev = head.cfg.bench, head.cfg.eval  # the job's resolved config, as the record keeps it
        if bench.enabled is not False:
            load = bench.concurrencies if bench.mode == "concurrency" else bench.rates
            sweep = (
                f"bench={bench.name or '?'}: {bench.mode or '?'} {', '.join(map(str, load or []))}, "
                f"repeats {bench.repeats or 1}, "
                f"{bench.input_len or '?'} in / {bench.output_len or '?'} out"
            )
        else:
            sweep = "bench disabled"
        if head.stage("evaluate").status == "not_applicable":
            evaluation = "eval not applicable (random weights)"  # enabled in the config, skipped by the job
        elif ev.enabled:
            evaluation = f"eval={ev.name or '?'} ({ev.backend or 'vllm'} backend)"
        else:
            evaluation = "eval disabled"
        lines.setdefault(f"{sweep}; {evaluation}", []).append(head.job.scheme or "?")
    return [f"{key}: {', '.join(schemes)}" for key, schemes in lines.items()]


def write_results(recs: list[dict], outs: list[Path], results: Path) -> list[Path]:
    """One Markdown file per model from ``recs`` (read from the run folders ``outs``); returns the files written."""
    by_model: dict[str, list[dict]] = {}
    for rec in recs:
        by_model.setdefault(JobRecord.view(rec, only=HEAD_SECTIONS).job.model or "?", []).append(rec)
    results.mkdir(parents=True, exist_ok=True)
    written = []
    for model, model_recs in sorted(by_model.items()):
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        head = (
            f"# GPU grid: {model} (`make bench-gpu`)\n\n"
            f"- Written {stamp} from {len(model_recs)} job record(s) under {', '.join(f'`{o}`' for o in outs)}.\n"
            "- Written by `python -m tools.bench.bench_gpu` (`make bench-gpu`) from GPU grids "
            "(random prompts, ignore_eos).\n"
            + "".join(f"- Settings (from the records): {line}.\n" for line in run_settings(model_recs))
            + "\n"
        )
        path = results / f"gpu-{model}.md"
        path.write_text(head + format_table(model_recs) + "\n")
        written.append(path)
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--out", nargs="+", default=["/tmp/qvgpu"], help="run folders of finished grids (default /tmp/qvgpu)"
    )
    ap.add_argument("--results", default=str(ROOT / "docs" / "results"), help="where gpu-<model>.md go")
    ap.add_argument(
        "--report-only", action="store_true", help="accepted for old command lines: reporting is all it does"
    )
    ap.add_argument("--export-records", metavar="DIR", help="also copy the job records to DIR/<model>/<scheme>/")
    args = ap.parse_args()
    outs = [Path(o) for o in args.out]
    try:
        recs = load_records(outs)
    except FileNotFoundError as exc:
        ap.error(str(exc))
    if not recs:
        print(f"no job records under {', '.join(map(str, outs))}", file=sys.stderr)
        return 1
    for path in write_results(recs, outs, Path(args.results)):
        print(f"wrote {path}")
    if args.export_records:
        print(f"exported {len(export_records(recs, Path(args.export_records)))} records to {args.export_records}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
