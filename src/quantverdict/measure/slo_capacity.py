"""Capacity at the SLO: the highest load at which enough requests meet every latency objective, and the search
that finds it.

A *load* is a closed loop's concurrency (requests in flight, a whole number) or an open loop's offered request rate
(req/s). A load *passes* when the requests of its runs, pooled over its repeats, meet the SLO often enough:

    pooled attainment = 100 x (sum of good requests) / (sum of requests sent) >= attainment_pct

(good and sent per run as :func:`quantverdict.measure.goodput.goodput` counts them: a failed request is sent and
never good). Pooling weighs every request alike, so a repeat with more requests counts for more.

:func:`capacity_from_points` decides the capacity from measured loads; :class:`CapacitySearch` picks the loads to
measure: doubling from ``start`` while loads pass (the cap ``max_load`` tried once), then bisecting between the
highest passing load and the lowest failing one until they lie within the tolerance, as GuideLLM's and AIPerf's
SLO searches do. The search decides with :func:`capacity_from_points`, so the points a sweep recorded re-derive its
answer. Pure: standard library only (the sweep client, the orchestrator and the review import it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

Mode = Literal["concurrency", "rate"]
StopReason = Literal["tolerance", "max_load_passed", "start_failed"]

STOP_WORDS: dict[str, str] = {
    "tolerance": "the highest passing and lowest failing loads lie within the tolerance",
    "max_load_passed": "the largest load searched (max_load) passed: the capacity is at least that",
    "start_failed": "the SLO is not met at the lowest load searched",
}


@dataclass(frozen=True)
class LoadOutcome:
    """One measured load, its repeats pooled: ``good`` and ``sent`` requests summed over them."""

    load: float
    good: int
    sent: int
    attainment_pct: float
    passed: bool


@dataclass(frozen=True)
class CapacityFinding:
    """What measured loads say about the capacity.

    ``capacity``: the highest measured load that passes with every lower measured load passing (None: the lowest
    measured load fails, or nothing was measured); ``low``/``high``: the bracket, ``low`` = ``capacity`` and
    ``high`` the lowest failing load above it (None: no load above it failed); ``loads``: every measured load,
    ascending.
    """

    capacity: float | None
    low: float | None
    high: float | None
    loads: list[LoadOutcome] = field(default_factory=list)


def pooled(runs: Iterable[tuple[float, int, int]], attainment_pct: float) -> list[LoadOutcome]:
    """Per load, the runs ``(load, good, sent)`` pooled (good and sent summed) and judged, ascending by load.

    A load with no request sent has 0% attainment (it fails unless ``attainment_pct`` <= 0).
    """
    sums: dict[float, list[int]] = {}
    for load, good, sent in runs:
        acc = sums.setdefault(float(load), [0, 0])
        acc[0] += int(good)
        acc[1] += int(sent)
    out = []
    for load in sorted(sums):
        good, sent = sums[load]
        pct = 100.0 * good / sent if sent else 0.0
        out.append(LoadOutcome(load, good, sent, pct, pct >= attainment_pct))
    return out


def capacity_from_points(runs: Iterable[tuple[float, int, int]], attainment_pct: float) -> CapacityFinding:
    """The capacity a person can check from measured runs.

    Args:
        runs: one ``(load, good requests, requests sent)`` per run; several runs of one load (its repeats) are
            pooled (module docstring).
        attainment_pct: the share of requests (percent) that must meet the SLO for a load to pass.

    Returns:
        :class:`CapacityFinding`: walking the loads upward, the last load before the first failing one, and that
        failing load as the bracket's upper end. E.g. loads 1, 2, 4 pass, 8 fails, 6 passes: capacity 6,
        bracket (6, 8).
    """
    loads = pooled(runs, attainment_pct)
    capacity: float | None = None
    high: float | None = None
    for lo in loads:
        if not lo.passed:
            high = lo.load
            break
        capacity = lo.load
    return CapacityFinding(capacity, capacity, high, loads)


def tolerance(low: float, tolerance_pct: float, mode: Mode) -> float:
    """How close the bracket must be, in the load's unit: ``tolerance_pct`` % of ``low``; in a closed loop at
    least one request in flight (loads are whole numbers)."""
    width = tolerance_pct / 100.0 * low
    return max(1.0, width) if mode == "concurrency" else width


@dataclass
class CapacitySearch:
    """Double, then bisect: the loads to measure to find the capacity at the SLO within a tolerance.

    Feed every measured run with :meth:`add`; :meth:`next_load` gives the load to measure next, None when done
    (:attr:`stop_reason` says why). Loads run from ``start``, doubling while they pass, capped at ``max_load``
    (tried once); after the first failing load, the midpoint of the highest passing load ``lo`` and the lowest
    failing load ``hi`` (a closed loop's rounded half up to a whole number) until ``hi - lo <=``
    :func:`tolerance` ``(lo)``. E.g. start 1, tolerance 10%, a server that passes up to concurrency 13:
    1, 2, 4, 8 pass, 16 fails, 12 passes, 14 fails, 13 passes: done, capacity 13, bracket (13, 14)
    (14 - 13 = 1 <= max(1, 1.3)).

    Attributes:
        start: the first load (> 0, finite).
        max_load: the largest load searched (>= start).
        tolerance_pct: the bracket's width at the end, percent of its lower end (> 0).
        attainment_pct: the pass rule's threshold (:func:`capacity_from_points`).
        mode: ``concurrency`` (whole-number loads) or ``rate`` (req/s).

    Raises:
        ValueError: a setting out of range (on construction).
    """

    start: float
    max_load: float
    tolerance_pct: float
    attainment_pct: float
    mode: Mode = "concurrency"
    runs: list[tuple[float, int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start) and self.start > 0):
            raise ValueError(f"start={self.start!r} must be a finite load > 0")
        if not (math.isfinite(self.max_load) and self.max_load >= self.start):
            raise ValueError(f"max_load={self.max_load!r} must be finite and >= start={self.start!r}")
        if not self.tolerance_pct > 0:
            raise ValueError(f"tolerance_pct={self.tolerance_pct!r} must be > 0")
        if self.mode not in ("concurrency", "rate"):
            raise ValueError(f"mode={self.mode!r} is not allowed; allowed: concurrency, rate")

    def add(self, load: float, good: int, sent: int) -> None:
        """One measured run at ``load``: ``good`` of ``sent`` requests met the SLO."""
        self.runs.append((float(load), int(good), int(sent)))

    def finding(self) -> CapacityFinding:
        """:func:`capacity_from_points` of the runs so far."""
        return capacity_from_points(self.runs, self.attainment_pct)

    def _whole(self, load: float) -> float:
        return float(math.floor(load + 0.5)) if self.mode == "concurrency" else round(load, 3)

    def _step(self) -> tuple[float | None, StopReason | None]:
        """``(next load, None)`` or ``(None, why the search is done)``."""
        if not self.runs:
            return self._whole(self.start), None
        f = self.finding()
        if f.capacity is None:
            return None, "start_failed"
        lo = f.capacity
        if f.high is None:
            if lo >= self.max_load:
                return None, "max_load_passed"
            return self._whole(min(2.0 * lo, self.max_load)), None
        hi = f.high
        if hi - lo <= tolerance(lo, self.tolerance_pct, self.mode):
            return None, "tolerance"
        mid = self._whole((lo + hi) / 2.0)
        if not lo < mid < hi:  # no load left between them in this unit
            return None, "tolerance"
        return mid, None

    def next_load(self) -> float | None:
        """The load to measure next; None when the search is done."""
        return self._step()[0]

    @property
    def stop_reason(self) -> StopReason | None:
        """Why the search is done (:data:`STOP_WORDS`); None while it goes on."""
        return self._step()[1]
