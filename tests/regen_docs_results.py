"""Regenerate every review and GPU table in docs/results from its records and compare with the committed files.

    PYTHONPATH=src:. python tests/regen_docs_results.py [--keep /tmp/regen]

Reviews: each ``docs/results/*review*/`` folder is regenerated with ``python -m pipelines.review`` from the
records it was made from (``gpu-review-<model>*`` from ``docs/results/gpu-records/<model>``,
``review-cpu-amx-*`` from ``docs/results/cpu-records/xeon-amx/smollm2-135m``) with the overrides its
committed ``review.json`` names in ``constraints_how`` (and ``tracking.enabled=false``: not logged to MLflow);
``review.md``, ``review.html``, ``review.json`` and ``plots/*.png`` are compared, the header line
(``Source: ... · generated ...``) and the JSON's ``source`` and ``generated_at`` aside, the JSON's floats to 12
significant digits (their last bit depends on the CPU).
GPU tables: ``python -m pipelines.bench_gpu --report-only`` over
``docs/results/gpu-records``, ``gpu-c256-repeats/records``, ``gpu-eval-server/records``,
``gpu-cache-free/records`` and ``gpu-cache-free/<name>-grid/records`` (name: each of ``CACHE_FREE_GRIDS``),
compared below their header block (everything from the first ``### `` heading on). Exit status 0 when every file
is identical.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
CPU_RECORDS = RESULTS / "cpu-records" / "xeon-amx" / "smollm2-135m"
# the cache-free grids, one folder each: docs/results/gpu-cache-free/<name>-grid/{records,gpu-*.md}
CACHE_FREE_GRIDS = (
    "fp8",
    "w8a8",
    "prefill-gptq",
    "fidelity",
    "decode-gptq",
    "decode-interrupted",
    "prefill-fp8",
    "prefill-w8a8",
    "decode-fp8",
    "embedded-fp8-c256",
    "decode-w8a8",
    "embedded-8bit",
)
GPU_TABLES = {  # records folder -> committed results folder
    RESULTS / "gpu-records": RESULTS,
    RESULTS / "gpu-c256-repeats" / "records": RESULTS / "gpu-c256-repeats",
    RESULTS / "gpu-eval-server" / "records": RESULTS / "gpu-eval-server",
    RESULTS / "gpu-cache-free" / "records": RESULTS / "gpu-cache-free",
    **{
        RESULTS / "gpu-cache-free" / f"{n}-grid" / "records": RESULTS / "gpu-cache-free" / f"{n}-grid"
        for n in CACHE_FREE_GRIDS
    },
}


def overrides_of(review_json: Path) -> list[str]:
    """The ``review.KEY=VALUE`` overrides a committed review was made with, read from its ``constraints_how``."""
    how = json.loads(review_json.read_text())["constraints_how"]
    head, sep, tail = how.split("; memory budget ")[0].partition(", with ")  # the target's budget is derived
    named = head.removeprefix("constraint set ").removesuffix(" (named)") if head.endswith(" (named)") else None
    return ([f"review={named}"] if named else []) + ([o.strip() for o in tail.split(", ")] if sep else [])


def records_of(review_dir: Path) -> Path:
    """The records folder a committed review in ``docs/results`` was made from."""
    if review_dir.name.startswith("review-cpu-amx"):
        return CPU_RECORDS
    source = json.loads((review_dir / "review.json").read_text())["source"]
    return ROOT / source


def _run(args: list[str]) -> None:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}", MPLBACKEND="Agg")
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")


# significant digits a review.json float is compared to: numpy picks its SIMD kernels (float64 log and exp among
# them) by the instruction sets of the CPU it finds, so the last bit of a ratio or an interval bound can differ
# between machines (seen: 0.9794112910716647 on the Xeon the reviews were written on, ...648 on an AMD EPYC);
# 12 digits keep every figure a review prints (md and html are compared exactly)
JSON_DIGITS = 12


def _rounded(value: object) -> object:
    """``value`` with every float rounded to :data:`JSON_DIGITS` significant digits (dicts and lists walked)."""
    if isinstance(value, float):
        return float(f"{value:.{JSON_DIGITS}g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def _review_text(path: Path) -> str:
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        data.pop("source", None)
        data.pop("generated_at", None)
        return json.dumps(_rounded(data), indent=1, sort_keys=True)
    lines = path.read_text().splitlines()
    header = ("· generated ", "<title>quantverdict review: ")  # the source folder and the time
    return "\n".join("<header line>" if any(h in line for h in header) else line for line in lines)


# the committed GPU tables predate the present wording of the saturation sentence (the tables are reports of
# records, written once): the committed text is brought up to date for this one sentence, nothing else
CURRENT_TABLE_PROSE = "saturated: requests completed at under 90% of the pace they were sent (most valid repeats)."
STALE_TABLE_PROSE = (
    "saturated: achieved < 90% of offered.",
    "saturated: achieved < 90% of offered at a rate not under 90% of the ceiling the server sustained.",
)


def _table_text(path: Path, committed: bool = False) -> str:
    text = path.read_text()
    if committed:
        for stale in STALE_TABLE_PROSE:
            text = text.replace(stale, CURRENT_TABLE_PROSE)
    return text[text.index("\n### ") :]


def _compare(label: str, old: str, new: str, problems: list[str]) -> None:
    if old != new:
        diff = "".join(
            list(difflib.unified_diff(old.splitlines(True), new.splitlines(True), "committed", "regenerated"))[:40]
        )
        problems.append(f"{label} differs:\n{diff}")


def regenerate(work: Path) -> tuple[list[str], list[str]]:
    """Regenerate everything into ``work``; returns (files compared, problems)."""
    compared: list[str] = []
    problems: list[str] = []
    for review_dir in sorted(RESULTS.glob("*review*")):
        if not (review_dir / "review.json").is_file():
            continue
        out = work / review_dir.name
        records = str(records_of(review_dir).relative_to(ROOT))
        overrides = overrides_of(review_dir / "review.json")
        # tracking off: a regenerated review is compared, not logged (the records name their grid's MLflow store,
        # which a review never writes; this checkout's store would only collect copies)
        _run(["-m", "pipelines.review", records, *overrides, "tracking.enabled=false", "--out", str(out)])
        for name in ("review.md", "review.html", "review.json"):
            rel = f"{review_dir.relative_to(ROOT)}/{name}"
            compared.append(rel)
            _compare(rel, _review_text(review_dir / name), _review_text(out / name), problems)
        for png in sorted((review_dir / "plots").glob("*.png")):
            rel = str(png.relative_to(ROOT))
            compared.append(rel)
            new = out / "plots" / png.name
            if not new.is_file() or new.read_bytes() != png.read_bytes():
                problems.append(f"{rel} differs (bytes)")
    for records, committed in GPU_TABLES.items():
        out = work / "tables" / committed.relative_to(RESULTS).as_posix().replace("/", "_")
        _run(["-m", "pipelines.bench_gpu", "--report-only", "--out", str(records), "--results", str(out)])
        for new in sorted(out.glob("gpu-*.md")):
            old = committed / new.name
            rel = str(old.relative_to(ROOT))
            compared.append(rel)
            if not old.is_file():
                problems.append(f"{rel}: not committed")
                continue
            _compare(rel, _table_text(old, committed=True), _table_text(new), problems)
    return compared, problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", type=Path, help="regenerate into this folder (default: a temporary one)")
    ap.add_argument(
        "--write",
        action="store_true",
        help="after comparing, copy every regenerated review (md, html, json, plots) over the committed one",
    )
    args = ap.parse_args()
    if args.write:
        with tempfile.TemporaryDirectory() as tmp:
            compared, problems = regenerate(Path(tmp))
            for review_dir in sorted(RESULTS.glob("*review*")):
                out = Path(tmp) / review_dir.name
                if not (out / "review.json").is_file():
                    continue
                for name in ("review.md", "review.html", "review.json"):  # only what differs beyond the header
                    old = review_dir / name
                    if not old.is_file() or _review_text(old) != _review_text(out / name):
                        old.write_bytes((out / name).read_bytes())
                for png in sorted((out / "plots").glob("*.png")):
                    old = review_dir / "plots" / png.name
                    if not old.is_file() or old.read_bytes() != png.read_bytes():
                        old.parent.mkdir(exist_ok=True)
                        old.write_bytes(png.read_bytes())
        print(f"{len(compared)} files compared, {len(problems)} differed; reviews rewritten")
        return 0
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        compared, problems = regenerate(args.keep)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            compared, problems = regenerate(Path(tmp))
    for rel in compared:
        print(f"compared {rel}")
    for p in problems:
        print(p, file=sys.stderr)
    print(f"{len(compared)} files compared, {len(problems)} differ")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
