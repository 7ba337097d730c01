"""The GPU benchmark (``make bench-gpu``): the embedded model's six-scheme grid and the 8B-class synthetic
grids on the H200 machine, spread over its GPUs, then one results file per model.

    python -m pipelines.bench_gpu --out /tmp/qvgpu --results docs/results
    python -m pipelines.bench_gpu --only embedded qwen --set bench.repeats=3   # a part, with overrides
    python -m pipelines.bench_gpu --streams embedded:w8a8,awq qwen+embedded:int8   # your own GPU layout
    python -m pipelines.bench_gpu --report-only --out /runs/a /runs/b   # one table from several runs

Needs the prebuilt stage targets of ``../shared/gpu/README.md`` (``env=h200-prebuilt``) and the offline
data (``--data``). Each stream is an ordinary ``python -m pipelines.run -m ...`` grid pinned to one GPU
(``CUDA_VISIBLE_DEVICES``) with its own server port and the part's output root and MLflow store, so two
streams never share a GPU or a port (two streams running the same part share its store, which takes
parallel jobs). Streams of a machine with fewer GPUs run one after another. Every job
keeps its record as it finishes, so a run cut short still reports what finished; a later run of the missing
schemes (``--streams``) completes it, and ``--report-only --out RUN1 RUN2`` joins them (a finished job
supersedes an interrupted or failed one of the same model and scheme).

Results: ``<results>/gpu-<model>.md`` (memory, accuracy, speed, roofline and stage-time tables from the
records, :func:`quantverdict.results.table.format_table`); each grid also writes its review into its own folder
(``<out>/<part>/multirun/<time>/review/``), and ``python -m pipelines.review`` reruns it with other
constraints on the exported records (``--export-records``). Exits 1 if any grid failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (model, schemes, extra overrides): in priority order; the first streams go to the first GPUs
PLAN: dict[str, list[tuple[str, str, list[str]]]] = {
    # the embedded model: all three numbers on the GPU
    "embedded": [("smollm2-135m", "bf16,gptq,fp8,w8a8,awq,int8", ["eval=gpu"])],
    # the regime crossover: weight-only 4-bit vs bf16 vs FP8/W8A8 on an 8B-shaped model
    "llama": [("llama3.1-8b-shape", "bf16,gptq,fp8,w8a8", [])],
    # the hybrid (Gated DeltaNet + attention) model: memory and KV accounting, speed without compilation
    "qwen": [("qwen3.5-9b-shape", "bf16,gptq", ["bench.server.enforce_eager=true", "bench.concurrencies=[1,64]"])],
}
STREAMS = [["embedded"], ["llama", "qwen"]]  # one list per GPU; with one GPU they run in sequence


def parse_streams(specs: list[str]) -> list[list[tuple[str, str | None]]]:
    """``--streams`` values -> one list of (part, schemes or None) per GPU.

    Each value is one GPU's stream: parts joined by ``+``, each optionally narrowed to some of its
    schemes with ``:`` (``qwen+embedded:int8``: the qwen part, then the embedded model's int8 only).

    Raises:
        ValueError: an unknown part, an empty or unplanned scheme (names the allowed ones), or a scheme
            asked for twice.
    """
    streams, seen = [], set()
    for spec in specs:
        stream = []
        for item in spec.split("+"):
            part, sep, schemes = item.partition(":")
            if part not in PLAN:
                raise ValueError(f"--streams {spec!r}: unknown part {part!r}; allowed: {', '.join(sorted(PLAN))}")
            planned = {s for _, grid, _ in PLAN[part] for s in grid.split(",")}
            if sep and not all(schemes.split(",")):
                raise ValueError(
                    f"--streams {spec!r}: empty scheme name after {part!r}:; allowed: {', '.join(sorted(planned))}"
                )
            unknown = sorted(set(schemes.split(",")) - planned) if schemes else []
            if unknown:
                raise ValueError(
                    f"--streams {spec!r}: part {part!r} has no scheme {', '.join(unknown)}; "
                    f"allowed: {', '.join(sorted(planned))}"
                )
            for scheme in schemes.split(",") if schemes else sorted(planned):
                if (part, scheme) in seen:
                    raise ValueError(f"--streams: {part}:{scheme} is asked for twice (two jobs would race for it)")
                seen.add((part, scheme))
            stream.append((part, schemes or None))
        streams.append(stream)
    return streams


def _gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def _grid_cmd(model: str, schemes: str, extra: list[str], out_root: Path, port: int, data: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pipelines.run",
        "-m",
        f"model={model}",
        f"scheme={schemes}",
        "env=h200-prebuilt",
        "bench=gpu-concurrency",
        "eval=gpu",
        f"paths.output_root={out_root}",
        f"bench.server.port={port}",
        f"data.offline_root={data}",
        *extra,
    ]  # later overrides win: a part's own, then --set


def _stream(
    index: int, parts: list[tuple[str, str | None]], gpu: str, args: argparse.Namespace, status: dict[str, str]
) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
    for name, only_schemes in parts:
        for model, schemes, extra in PLAN[name]:
            schemes = only_schemes or schemes
            out_root = Path(args.out[0]) / name
            out_root.mkdir(parents=True, exist_ok=True)
            cmd = _grid_cmd(model, schemes, [*extra, *args.set], out_root, 8801 + index, args.data)
            log = out_root / f"grid-gpu{gpu}.log"  # two streams may run grids of the same part
            t0 = time.monotonic()
            print(f"[gpu {gpu}] {model} {schemes}: {' '.join(cmd[3:])} (log {log})", flush=True)
            with open(log, "a") as fh:
                rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
            key = f"{model} {schemes}"
            status[key] = f"exit {rc} after {time.monotonic() - t0:.0f} s"
            print(f"[gpu {gpu}] {key}: {status[key]}", flush=True)


def rederive(rec: dict, job_dir: Path) -> dict:
    """Re-read the fields a record takes from the job's raw vLLM server log (memory, kernels, the kernel
    check, the per-load summary) with this checkout's parser, so a parser fix applies to finished runs."""
    # the launcher runs grids with the standard library alone; quantverdict (numpy, OmegaConf) only for reports
    from quantverdict.measure import vllm_log
    from quantverdict.results.record import mark_interrupted
    from quantverdict.serving.speed import speed_validity

    mark_interrupted(rec)  # the machine was given back mid-job: say so, keep what finished
    log_path = job_dir / "vllm_server.log"
    if log_path.is_file():
        act = int((rec.get("config", {}).get("scheme") or {}).get("activation_bits", 16)) < 16
        rec.setdefault("memory", {})["server"] = vllm_log.parse(log_path.read_text(errors="replace"), act)
        if rec.get("speed", {}).get("points"):
            speed_validity(rec["speed"], rec.get("job", {}).get("scheme_label", ""), rec["memory"]["server"], act)
    return rec


def supersede(recs: list[dict]) -> list[dict]:
    """One job per model and scheme where runs overlap, in the order found, by the review's rule
    (:func:`quantverdict.review.sources.dedupe`: a finished job before an unfinished one, then the newest):
    the run that completed a cut-short grid replaces its interrupted jobs, a repeated grid its older jobs."""
    # the launcher runs grids with the standard library alone; quantverdict (numpy, OmegaConf) only for reports
    from quantverdict.review.sources import dedupe

    kept = {id(r) for r in dedupe(recs)[0]}
    return [r for r in recs if id(r) in kept]


def load_records(outs: list[Path]) -> list[dict]:
    """Every job record under the run folders ``outs`` (reused ones left out), re-derived
    (:func:`rederive`), unfinished jobs superseded by finished ones (:func:`supersede`)."""
    # the launcher runs grids with the standard library alone; quantverdict (numpy, OmegaConf) only for reports
    from quantverdict.results.record import find_records, load

    recs = []
    for out in outs:
        if not out.is_dir():
            raise FileNotFoundError(f"--out {out}: no such folder of runs")
        for path in find_records(out):
            try:
                recs.append((load(path), path.parent))
            except ValueError as exc:  # a JSON file of the same name that is not a job record
                print(f"skipped {path}: {exc}", file=sys.stderr)
    return supersede([rederive(r, d) for r, d in recs if not r.get("job", {}).get("resumed_from")])


def export_records(recs: list[dict], dest: Path) -> list[Path]:
    """Write each record to ``dest/<model>/<scheme>/record.json``, a small tree that
    ``python -m pipelines.review dest/<model>`` reads."""
    import json

    written = []
    for rec in recs:
        target = dest / rec["job"]["model"] / rec["job"]["scheme"] / "record.json"
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
        cfg = rec.get("config") or {}
        bench, ev = cfg.get("bench") or {}, cfg.get("eval") or {}
        if bench.get("enabled", True):
            load = bench.get("concurrencies") if bench.get("mode") == "concurrency" else bench.get("rates")
            sweep = (
                f"bench={bench.get('name', '?')}: {bench.get('mode', '?')} {', '.join(map(str, load or []))}, "
                f"repeats {bench.get('repeats', 1)}, "
                f"{bench.get('input_len', '?')} in / {bench.get('output_len', '?')} out"
            )
        else:
            sweep = "bench disabled"
        evaluation = (
            f"eval={ev.get('name', '?')} ({ev.get('backend', 'vllm')} backend)"
            if ev.get("enabled")
            else "eval disabled"
        )
        lines.setdefault(f"{sweep}; {evaluation}", []).append(rec["job"].get("scheme", "?"))
    return [f"{key}: {', '.join(schemes)}" for key, schemes in lines.items()]


def write_results(recs: list[dict], outs: list[Path], results: Path) -> list[Path]:
    """One Markdown file per model from ``recs`` (read from the run folders ``outs``); returns the files written."""
    # the launcher runs grids with the standard library alone; quantverdict (numpy, OmegaConf) only for reports
    from quantverdict.results.table import format_table

    by_model: dict[str, list[dict]] = {}
    for rec in recs:
        by_model.setdefault(rec["job"].get("model", "?"), []).append(rec)
    results.mkdir(parents=True, exist_ok=True)
    written = []
    for model, model_recs in sorted(by_model.items()):
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        head = (
            f"# GPU grid: {model} (`make bench-gpu`)\n\n"
            f"- Written {stamp} from {len(model_recs)} job record(s) under {', '.join(f'`{o}`' for o in outs)}.\n"
            "- Written by `python -m pipelines.bench_gpu` (`make bench-gpu`) for runs on the H200 machine "
            "(prebuilt stacks of ../shared/gpu/README.md, `env=h200-prebuilt`; random prompts, ignore_eos).\n"
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
        "--out",
        nargs="+",
        default=["/tmp/qvgpu"],
        help="output root of the grids (default /tmp/qvgpu); with --report-only, one or more run folders",
    )
    ap.add_argument("--results", default=str(ROOT / "docs" / "results"), help="where gpu-<model>.md go")
    ap.add_argument("--data", default=os.environ.get("QV_DATA_ROOT", str(ROOT.parent / "shared" / "data")))
    ap.add_argument("--only", nargs="*", choices=sorted(PLAN), help="run only these parts of the plan")
    ap.add_argument(
        "--streams",
        nargs="+",
        metavar="PART[:SCHEMES][+PART...]",
        help="one value per GPU instead of the default layout, e.g. embedded:w8a8,awq qwen+embedded:int8",
    )
    ap.add_argument("--report-only", action="store_true", help="write the results files from existing records")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="Hydra overrides for every grid")
    ap.add_argument("--export-records", metavar="DIR", help="also copy the job records to DIR/<model>/<scheme>/")
    args = ap.parse_args()
    if args.report_only and (args.streams or args.only or args.set):
        ap.error("--streams, --only and --set choose what to run; with --report-only nothing runs")
    if not args.report_only:
        if len(args.out) != 1:
            ap.error("--out takes several folders only with --report-only")
        try:
            layout = parse_streams(args.streams) if args.streams else [[(p, None) for p in s] for s in STREAMS]
        except ValueError as exc:
            ap.error(str(exc))
        if not Path(args.data).is_dir():
            ap.error(f"--data {args.data!r} is not a directory of offline data (wikitext-2-raw/, piqa/, ...)")
        n = _gpu_count()
        if n == 0:
            ap.error("no GPU visible (nvidia-smi -L): make bench-gpu runs on the H200 machine")
        streams = [[p for p in s if not args.only or p[0] in args.only] for s in layout]
        streams = [s for s in streams if s]
        if not streams:
            ap.error(f"--only {' '.join(args.only)} leaves nothing of the layout to run")
        if n < len(streams):  # fewer GPUs than streams: run them one after another
            streams = [[p for s in streams for p in s]]
        status: dict[str, str] = {}
        threads = [
            threading.Thread(target=_stream, args=(i, names, str(i), args, status)) for i, names in enumerate(streams)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print("grids:", status, flush=True)
        failed = sorted(m for m, s in status.items() if not s.startswith("exit 0"))
    else:
        failed = []
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
    if failed:
        print(f"failed grids: {', '.join(failed)} (see <out>/<part>/grid-gpu<N>.log)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
