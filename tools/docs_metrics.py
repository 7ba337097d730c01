"""Print the sizes and counts of what a user reads, for the notes that track them.

    python tools/docs_metrics.py [--unit-seconds S] [--ci-seconds S]     (or: make metrics ARGS="...")

README bytes; docs/results in MB and files; how many lines of src/, conf/ and tests/ name a lease, a session, an
issue number or a date (the timeless-text rule; the pattern is printed with the count); ``.get(`` calls in src/;
Python and template lines of the review package. Unit and CI wall times are not measured here (they take minutes):
pass them as the test tiers reported them.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# what the timeless-text rule forbids: a lease or leasing (not "release"), a session (not "start_new_session"),
# an issue number, a date, a rented machine, an ordinal of the lease history
TIMELESS = re.compile(
    r"\blease[sd]?\b|\bleasing\b|issue ?#?[0-9]|\b20[0-9]{2}-[0-9]{2}\b|\brented\b|\bsessions?\b|seventeenth",
    re.IGNORECASE,
)
# names the pattern would match that are not a machine's history: the JSON Schema dialect "draft 2020-12", and
# pytest's fixture scope named "session" (one test run, an API value: ``@pytest.fixture(scope="session")``)
NOT_HISTORY = re.compile(r"draft[ /]2020-12|\bscope=[\"']session[\"']", re.IGNORECASE)
TEXT_SUFFIXES = {".py", ".yaml", ".yml", ".md", ".txt", ".j2", ".toml", ".cfg", ".sh", ".html", ".jinja"}


def files(folder: Path, suffixes: set[str] | None = None) -> list[Path]:
    """Tracked-looking files under ``folder`` (caches skipped), optionally only those with a suffix in ``suffixes``."""
    skip = {"__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and not skip & set(p.parts) and (suffixes is None or p.suffix in suffixes)
    )


def timeless_hits(folder: Path) -> list[str]:
    """``path:line: text`` of every line under ``folder`` that the timeless-text rule forbids."""
    out = []
    for path in files(folder, TEXT_SUFFIXES):
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if TIMELESS.search(NOT_HISTORY.sub("", line)):
                out.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    return out


def line_count(paths: list[Path]) -> int:
    return sum(len(p.read_text(errors="replace").splitlines()) for p in paths)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="sizes and counts of what a user reads")
    parser.add_argument("--unit-seconds", type=float, help="wall time of the unit tier, as measured")
    parser.add_argument("--ci-seconds", type=float, help="wall time of .ci/run, as measured")
    parser.add_argument("--list", action="store_true", help="also print every timeless-text hit")
    args = parser.parse_args(argv)

    results = ROOT / "docs" / "results"
    result_files = files(results) if results.is_dir() else []
    review = ROOT / "src" / "quantverdict" / "review"
    templates = [p for p in files(review) if "templates" in p.relative_to(review).parts]
    hits = {name: timeless_hits(ROOT / name) for name in ("src", "conf", "tests")}
    gets = sum(p.read_text().count(".get(") for p in files(ROOT / "src", {".py"}))

    rows = [
        ("README.md bytes", f"{(ROOT / 'README.md').stat().st_size:,}"),
        ("docs/results MB", f"{sum(p.stat().st_size for p in result_files) / 1e6:.1f}"),
        ("docs/results files", f"{len(result_files):,}"),
        *((f"timeless-text hits in {name}/", str(len(h))) for name, h in hits.items()),
        ("`.get(` calls in src/", f"{gets:,}"),
        ("review/ Python lines", f"{line_count([p for p in files(review, {'.py'})]):,}"),
        ("review/ template lines", f"{line_count(templates):,}"),
        ("unit tier seconds", f"{args.unit_seconds:g}" if args.unit_seconds is not None else "not given"),
        ("CI seconds", f"{args.ci_seconds:g}" if args.ci_seconds is not None else "not given"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print(f"(timeless-text pattern, case-insensitive: {TIMELESS.pattern}; not counted: {NOT_HISTORY.pattern})")
    if args.list:
        for h in hits.values():
            print("\n".join(h))
    return 0


if __name__ == "__main__":
    sys.exit(main())
