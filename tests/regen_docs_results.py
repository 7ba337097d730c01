"""Regenerate every review committed in docs/results from its records and compare with the committed files.

    PYTHONPATH=src:. python tests/regen_docs_results.py [--keep /tmp/regen] [--write]

A committed review is a folder of docs/results holding ``review.json`` (``gpu-hopper-schemes/review``); it is
regenerated with ``python -m pipelines.review`` from the records its ``review.json`` names in ``source``, with the
overrides it names in ``constraints_how`` (and ``tracking.enabled=false``: not logged to MLflow); ``review.md``,
``review.json``, ``review.html`` where committed (a folder may leave it out: it repeats ``review.md`` with the plots
inlined) and ``plots/*.png`` are compared, the header line (``Source: ... · generated
...``) and the JSON's ``source`` and ``generated_at`` aside, the JSON's floats to 12 significant digits (their last
bit depends on the CPU). Exit status 0 when every file is identical. The study pages beside them are checked by
``tools/results/make_results.py --check``.
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
# the cache-free grids of the regime-crossover page, one folder each: docs/results/gpu-cache-free/<name>-grid/records
CACHE_FREE_GRIDS = (
    "fp8",
    "w8a8",
    "prefill-gptq",
    "prefill-fp8",
    "prefill-w8a8",
    "decode-gptq",
    "decode-fp8",
    "decode-w8a8",
)


def committed_reviews() -> list[Path]:
    """The folders of docs/results that hold a committed review (``review.json``), sorted."""
    return sorted(p.parent for p in RESULTS.rglob("review.json"))


def review_files(review_dir: Path) -> list[str]:
    """The review files a committed review folder is compared on: ``review.md`` and ``review.json`` always,
    ``review.html`` where the folder holds it."""
    return ["review.md", *(["review.html"] if (review_dir / "review.html").is_file() else []), "review.json"]


def overrides_of(review_json: Path) -> list[str]:
    """The ``review.KEY=VALUE`` overrides a committed review was made with, read from its ``constraints_how``."""
    how = json.loads(review_json.read_text())["constraints_how"]
    head, sep, tail = how.split("; memory budget ")[0].partition(", with ")  # the target's budget is derived
    named = head.removeprefix("constraint set ").removesuffix(" (named)") if head.endswith(" (named)") else None
    return ([f"review={named}"] if named else []) + ([o.strip() for o in tail.split(", ")] if sep else [])


def work_dir(work: Path, review_dir: Path) -> Path:
    """Where ``review_dir`` is regenerated inside ``work`` (its path under docs/results, flattened)."""
    return work / review_dir.relative_to(RESULTS).as_posix().replace("/", "_")


def records_of(review_dir: Path) -> Path:
    """The records folder a committed review in ``docs/results`` was made from (its ``review.json``'s ``source``)."""
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
    for review_dir in committed_reviews():
        out = work_dir(work, review_dir)
        records = str(records_of(review_dir).relative_to(ROOT))
        overrides = overrides_of(review_dir / "review.json")
        # tracking off: a regenerated review is compared, not logged (the records name their grid's MLflow store,
        # which a review never writes; this checkout's store would only collect copies)
        _run(["-m", "pipelines.review", records, *overrides, "tracking.enabled=false", "--out", str(out)])
        for name in review_files(review_dir):
            rel = f"{review_dir.relative_to(ROOT)}/{name}"
            compared.append(rel)
            _compare(rel, _review_text(review_dir / name), _review_text(out / name), problems)
        for png in sorted((review_dir / "plots").glob("*.png")):
            rel = str(png.relative_to(ROOT))
            compared.append(rel)
            new = out / "plots" / png.name
            if not new.is_file() or new.read_bytes() != png.read_bytes():
                problems.append(f"{rel} differs (bytes)")
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
            for review_dir in committed_reviews():
                out = work_dir(Path(tmp), review_dir)
                if not (out / "review.json").is_file():
                    continue
                for name in review_files(review_dir):  # only what differs beyond the header
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
