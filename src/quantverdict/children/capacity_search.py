"""The sweep client's side of the capacity search: the points it runs, made one load at a time.

:mod:`quantverdict.children.sweep_client` runs the points of :meth:`SearchDriver.points` as it runs a planned
sweep's (warm-up before a load's first repeat, a window of at least ``min_duration_s``, its two files per point);
after each run it hands the result to :meth:`SearchDriver.observe`, which counts the requests that met the SLO
(:func:`quantverdict.measure.goodput.goodput`, from the ``--save-detailed`` lists) and feeds the search
(:class:`quantverdict.measure.slo_capacity.CapacitySearch`). Before each point runs, its name and index are
appended to ``<result_dir>/points.jsonl`` (the orchestrator reads the points in that order); at the end
``search.json`` holds the SLO, the steps, the capacity, the bracket and why the search stopped.

A point is named and seeded as a planned one: ``conc-24_r0`` / ``rate-3.5_r0``
(:class:`quantverdict.measure.sweep_plan.SweepPoint`), seed
:func:`~quantverdict.measure.sweep_plan.point_seed` ``(bench.seed, index)`` on the running index, at least
:func:`~quantverdict.measure.sweep_plan.prompts_for` requests. Standard library and :mod:`quantverdict.measure`
only (runs in the serve environment).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from quantverdict.measure.goodput import Slo, goodput
from quantverdict.measure.slo_capacity import STOP_WORDS, CapacitySearch
from quantverdict.measure.sweep_plan import INF, SweepPoint, point_seed, prompts_for

# one line per point, written before it runs: {"index", "name", "load", "repeat", "mode"}
ANNOUNCE_FILE = "points.jsonl"
RESULT_FILE = "search.json"


def slo_of(search: dict[str, Any]) -> Slo:
    """The objectives of a search spec (``ttft_ms``, ``tpot_ms``, ``e2e_ms``; None: not an objective)."""
    return Slo(ttft_ms=search.get("ttft_ms"), tpot_ms=search.get("tpot_ms"), e2e_ms=search.get("e2e_ms"))


class SearchDriver:
    """The points of one server start's capacity search (module docstring).

    Args:
        search: the spec's ``search``: ``mode`` (``concurrency`` | ``rate``), ``ttft_ms``, ``tpot_ms``, ``e2e_ms``,
            ``attainment_pct``, ``start``, ``max_load``, ``tolerance_pct``, ``repeats``, ``num_prompts``,
            ``prompts_per_concurrency``, ``seed`` (bench.seed).
        result_dir: where ``points.jsonl`` and ``search.json`` go.
    """

    def __init__(self, search: dict[str, Any], result_dir: Path) -> None:
        self.spec = search
        self.mode = str(search["mode"])
        self.slo = slo_of(search)
        self.search = CapacitySearch(
            start=float(search["start"]),
            max_load=float(search["max_load"]),
            tolerance_pct=float(search["tolerance_pct"]),
            attainment_pct=float(search["attainment_pct"]),
            mode="concurrency" if self.mode == "concurrency" else "rate",
        )
        self.repeats = max(1, int(search.get("repeats") or 1))
        self.result_dir = result_dir
        self.steps: list[dict[str, Any]] = []
        (result_dir / ANNOUNCE_FILE).unlink(missing_ok=True)

    def _point(self, load: float, repeat: int, index: int) -> dict[str, Any]:
        conc = int(load) if self.mode == "concurrency" else None
        sp = SweepPoint(INF, conc, repeat) if conc is not None else SweepPoint(load, None, repeat)
        n = prompts_for(int(self.spec["num_prompts"]), self.spec.get("prompts_per_concurrency"), conc)
        return {
            "name": sp.name,
            "request_rate": sp.request_rate_arg,
            "max_concurrency": conc,
            "num_prompts": n,
            "seed": point_seed(int(self.spec["seed"]), index),
            "load": load,
        }

    def points(self) -> Iterator[dict[str, Any]]:
        """The points to run, each announced in ``points.jsonl`` before it is yielded; the next load is chosen once
        :meth:`observe` saw every repeat of the one before."""
        index = 0
        while (load := self.search.next_load()) is not None:
            self.steps.append({"step": len(self.steps) + 1, "load": load, "points": [], "good": 0, "sent": 0})
            for repeat in range(self.repeats):
                point = self._point(load, repeat, index)
                line = {"index": index, "name": point["name"], "load": load, "repeat": repeat, "mode": self.mode}
                with open(self.result_dir / ANNOUNCE_FILE, "a") as fh:
                    fh.write(json.dumps(line) + "\n")
                index += 1
                yield point

    def observe(self, point: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
        """Count the run's requests that met the SLO and feed the search.

        Returns:
            The point's ``search`` block: ``step``, its own ``good``, ``sent``, ``attainment_pct``, and its load's
            pooled ``level_attainment_pct`` and ``passed`` over the repeats so far.

        Raises:
            ValueError: the result lacks the per-request lists (:func:`quantverdict.measure.goodput.goodput`).
        """
        g = goodput(result, self.slo)
        self.search.add(point["load"], g.good, g.sent)
        step = self.steps[-1]
        step["points"].append(point["name"])
        step["good"] += g.good
        step["sent"] += g.sent
        level_pct = 100.0 * step["good"] / step["sent"] if step["sent"] else 0.0
        step["attainment_pct"] = level_pct
        step["passed"] = level_pct >= self.search.attainment_pct
        return {
            "step": step["step"],
            "good": g.good,
            "sent": g.sent,
            "attainment_pct": g.attainment_pct,
            "level_attainment_pct": level_pct,
            "passed": step["passed"],
        }

    def summary(self) -> dict[str, Any]:
        """``search.json``: the SLO, the settings, the steps, ``capacity``, ``bracket`` ``[low, high]`` and
        ``stop_reason`` (None while the search goes on: it was cut short)."""
        f = self.search.finding()
        reason = self.search.stop_reason
        s = self.spec
        return {
            "mode": self.mode,
            "slo": {"ttft_ms": s.get("ttft_ms"), "tpot_ms": s.get("tpot_ms"), "e2e_ms": s.get("e2e_ms")},
            "attainment_pct": self.search.attainment_pct,
            "start": self.search.start,
            "max_load": self.search.max_load,
            "tolerance_pct": self.search.tolerance_pct,
            "repeats": self.repeats,
            "steps": self.steps,
            "capacity": f.capacity,
            "bracket": [f.low, f.high],
            "stop_reason": reason,
            "stop_words": STOP_WORDS[reason] if reason else "the search did not finish",
        }
