"""A scorecard's capacity at the SLO (:class:`quantverdict.review.document.Capacity`), re-derived from the recorded
points of each server start's search (``speed.searches``, ``bench.capacity``).

Per server start, every point's requests are judged against the SLO *the search used* (from the record), from the
point's own ``--save-detailed`` file (:func:`quantverdict.measure.goodput.goodput`; where the file is not there,
the good and sent counts the search recorded for its step), and the capacity is
:func:`quantverdict.measure.slo_capacity.capacity_from_points` of those counts: the same function the search
decided with, so the review checks the search rather than trusting it. Over starts: the median (the lower middle
of an even count, so that the capacity is a load a start measured and passed), and an interval over the starts
that have a capacity (Student t on the logs, as the review's speed ratios over starts,
:func:`quantverdict.measure.starts.t_interval_logs`; their min-max under two).
"""

from __future__ import annotations

import dataclasses
import json
import math

from quantverdict.measure.goodput import Slo, goodput
from quantverdict.measure.slo_capacity import capacity_from_points
from quantverdict.measure.starts import t_interval_logs
from quantverdict.results.record import CapacitySearch, JobRecord, SearchSlo, SweepPoint
from quantverdict.review import document as doc
from quantverdict.review.gpus import job_gpus
from quantverdict.review.speed import beside, raw_points

CONFIDENCE = 0.95  # the interval over starts


def _slo(search: CapacitySearch) -> Slo:
    s = search.slo or SearchSlo()
    return Slo(ttft_ms=s.ttft_ms, tpot_ms=s.tpot_ms, e2e_ms=s.e2e_ms)


def _recorded_counts(search: CapacitySearch) -> dict[str, tuple[int, int]]:
    """Point name -> (good, sent) as the search recorded them, for a step of one point (a step of several repeats
    keeps only their sum, which cannot be split: left out)."""
    out: dict[str, tuple[int, int]] = {}
    for step in search.steps or []:
        names = step.points or []
        if len(names) == 1 and step.good is not None and step.sent is not None:
            out[names[0]] = (step.good, step.sent)
    return out


def point_counts(rec: JobRecord, p: SweepPoint, slo: Slo, recorded: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """``(good, sent)`` requests of one recorded point against ``slo``: from its result file, else as recorded.

    Raises:
        ValueError: neither the file nor a recorded count is there.
    """
    path = beside(rec, p.result_file, "bench")
    if path is not None:
        g = goodput(json.loads(path.read_text()), slo)
        return g.good, g.sent
    if p.point in recorded:
        return recorded[str(p.point)]
    raise ValueError(f"point {p.point}: no per-request file ({p.result_file}) and no count recorded")


def _start_of(p: SweepPoint) -> int:
    return int(p.server_start or 1)


def _median_low(values: list[float | None]) -> float | None:
    """The median, a None (no capacity) counting below every number; the lower middle of an even count."""
    ranked = sorted(values, key=lambda v: -math.inf if v is None else v)
    return ranked[(len(ranked) - 1) // 2] if ranked else None


def _interval(caps: list[float], est: float) -> doc.Interval | None:
    if not caps:
        return None
    found = t_interval_logs([math.log(c) for c in caps], CONFIDENCE) if all(c > 0 for c in caps) else None
    if found is None:
        return doc.Interval(estimate=est, low=min(caps), high=max(caps), method="min_max", n=len(caps), unit="load")
    _, lo, hi = found
    method = f"student_t_log_{round(100 * CONFIDENCE)}"
    return doc.Interval(estimate=est, low=math.exp(lo), high=math.exp(hi), method=method, n=len(caps), unit="load")


def scheme_capacity(
    rec: JobRecord, mode: str, raw: list[SweepPoint], points: list[doc.SpeedPoint]
) -> doc.Capacity | None:
    """The capacity of one job's searches; None when no search ran (``speed.searches`` absent).

    Args:
        rec: the job's record.
        mode: ``concurrency`` | ``rate``.
        raw: its recorded points (:func:`quantverdict.review.speed.raw_points`).
        points: its speed points per load level (medians over valid repeats), for the output tok/s at capacity.
    """
    searches = list(rec.speed.searches or [])
    if not searches:
        return None
    first = searches[0]
    slo, target = _slo(first), float(first.attainment_pct or 0.0)
    notes = []
    if any(_slo(s) != slo or s.attainment_pct != first.attainment_pct for s in searches[1:]):
        notes.append("the starts searched at different SLOs: each start is judged at the first start's")
    starts, levels = [], []
    for search in searches:
        start = int(search.server_start or 1)
        recorded = _recorded_counts(search)
        runs = []
        for p in raw:
            if _start_of(p) == start:
                good, sent = point_counts(rec, p, slo, recorded)
                runs.append((p.load(mode), good, sent))
        f = capacity_from_points(runs, target)
        levels += [doc.CapacityLevel(server_start=start, **dataclasses.asdict(lv)) for lv in f.loads]
        agrees = f.capacity == search.capacity and [f.low, f.high] == list(search.bracket or [None, None])
        starts.append(
            doc.CapacityStart(
                server_start=start,
                capacity=f.capacity,
                low=f.low,
                high=f.high,
                stop_reason=search.stop_reason,
                agrees_with_search=agrees,
            )
        )
    capacity = _median_low([s.capacity for s in starts])
    at_least = any(s.stop_reason == "max_load_passed" for s in starts)
    measured = [p for p in points if capacity is not None and p.load <= capacity]
    at = max(measured, key=lambda p: p.load) if measured else None
    tok = at.output_tok_s if at else None
    gpus = job_gpus(rec)
    return doc.Capacity(
        mode=mode,
        slo=slo.describe(),
        slo_ms=slo.objectives(),
        attainment_pct=target,
        tolerance_pct=first.tolerance_pct,
        capacity=capacity,
        interval=_interval([s.capacity for s in starts if s.capacity is not None], capacity) if capacity else None,
        at_least=at_least,
        at_load=at.load if at else None,
        output_tok_s=tok,
        output_tok_s_per_gpu=tok / gpus if tok is not None and gpus else None,
        starts=starts,
        levels=levels,
        note="; ".join(notes),
    )


def read_at_capacity(speed: doc.Speed, rec: JobRecord) -> list[str]:
    """Set ``speed.capacity`` and, where a search ran, read the scheme's speed at its capacity: ``speed.at_load`` the
    level at :attr:`~quantverdict.review.document.Capacity.at_load` (the cost and the verdict read it there), or
    None with ``load_how`` saying the SLO is not met at the lowest load searched.

    Returns:
        What is missing (a point without per-request data or a recorded count: no capacity).
    """
    mode, raw = raw_points(rec)
    try:
        cap = scheme_capacity(rec, mode, raw, speed.points)
    except (OSError, ValueError, KeyError) as exc:
        return [f"no capacity at the SLO: {exc}"]
    speed.capacity = cap
    if cap is None:
        return []
    target = f"{cap.slo} for {cap.attainment_pct:g}% of requests"
    at = next((p for p in speed.points if p.load == cap.at_load), None)
    if at is None:
        speed.at_load, speed.goodput_rps = None, None
        speed.load_how = f"no capacity: {target} is not met at the lowest load searched"
        return []
    speed.at_load = doc.AtLoad.model_validate({k: getattr(at, k) for k in doc.AtLoad.model_fields})
    speed.load_how = f"capacity at the SLO ({target}): {at.label}" + (" or more" if cap.at_least else "")
    speed.goodput_rps = at.goodput.goodput_rps if at.goodput else None
    return []
