"""The orchestrator's side of the capacity search (``bench.capacity``): the client's spec, the points it announces
and the search it publishes.

The sweep client (:mod:`quantverdict.children.capacity_search`) picks each load after the one before was measured,
so the orchestrator cannot plan the points: it reads them, in the order they run, from ``points.jsonl``, which the
client appends to before each point runs, and the search's outcome from ``search.json`` at the end.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from quantverdict.children.capacity_search import ANNOUNCE_FILE, RESULT_FILE
from quantverdict.config.schema import BenchConfig
from quantverdict.measure import sweep_plan


def search_spec(bench: BenchConfig) -> dict[str, Any] | None:
    """The client spec's ``search`` for ``bench`` (see :class:`quantverdict.children.capacity_search.SearchDriver`);
    None unless ``bench.capacity.enabled``."""
    cap = bench.capacity
    if not cap.enabled:
        return None
    return {
        "mode": str(bench.mode),
        "ttft_ms": cap.ttft_ms,
        "tpot_ms": cap.tpot_ms,
        "e2e_ms": cap.e2e_ms,
        "attainment_pct": cap.attainment_pct,
        "start": cap.start,
        "max_load": cap.max_load,
        "tolerance_pct": cap.tolerance_pct,
        "repeats": bench.repeats,
        "num_prompts": bench.num_prompts,
        "prompts_per_concurrency": bench.prompts_per_concurrency,
        "seed": bench.seed,
    }


def announced_points(out_dir: Path) -> list[sweep_plan.SweepPoint]:
    """The points the client announced so far, in run order; a last line not yet whole is left for the next read."""
    path = out_dir / ANNOUNCE_FILE
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            a = json.loads(line)
        except json.JSONDecodeError:
            break
        load, repeat = float(a["load"]), int(a["repeat"])
        if a["mode"] == "concurrency":
            out.append(sweep_plan.SweepPoint(sweep_plan.INF, int(load), repeat))
        else:
            out.append(sweep_plan.SweepPoint(sweep_plan.normalize_rate(load), None, repeat))
    return out


def read_search(out_dir: Path) -> dict[str, Any] | None:
    """``search.json`` as the client published it; None when absent (no search, or it did not finish)."""
    path = out_dir / RESULT_FILE
    return dict(json.loads(path.read_text())) if path.is_file() else None


def clear(out_dir: Path) -> None:
    """Remove an earlier search's files from ``out_dir``: its announced points' results and its own two files."""
    for p in announced_points(out_dir):
        for suffix in (".json", ".qv.json", ".short.json"):
            (out_dir / f"{p.name}{suffix}").unlink(missing_ok=True)
    (out_dir / ANNOUNCE_FILE).unlink(missing_ok=True)
    (out_dir / RESULT_FILE).unlink(missing_ok=True)
