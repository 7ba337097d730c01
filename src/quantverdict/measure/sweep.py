"""Repeat aggregation of sweep points: one summary per load level (median and spread over the valid
repeats), and the percentile that latencies are computed with.

Pure (standard library and numpy). What a point is and how it is read: :mod:`quantverdict.measure.sweep_plan`,
:mod:`quantverdict.measure.bench_result`, :mod:`quantverdict.measure.validity`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from quantverdict.measure import aggregate
from quantverdict.measure.sweep_plan import INF, load_of
from quantverdict.measure.validity import point_saturated, point_valid

# per load level: median and spread (min, max) over the valid repeats
SUMMARY_METRICS = (
    "achieved_rps",
    "output_tok_s",
    "steady_rps",
    "steady_output_tok_s",
    "throughput_rps",
    "throughput_tok_s",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "itl_ms_p50",
    "itl_ms_p99",
    "tpot_ms_p50",
    "e2e_ms_p50",
    "e2e_ms_p99",
)


# --- percentiles ------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """``numpy.percentile(values, q)`` with numpy's default ``method="linear"`` (Hyndman & Fan type 7).

    Sorted values ``x[0..n-1]``; rank ``r = (q / 100) * (n - 1)``; result
    ``x[floor(r)] + (x[floor(r) + 1] - x[floor(r)]) * (r - floor(r))``. vLLM's ``calculate_metrics``
    calls ``np.percentile`` the same way, so its percentiles and ours agree on the same list.

    Args:
        values: the sample (any order, >= 1 value).
        q: percentile in [0, 100].

    Raises:
        ValueError: empty ``values`` or ``q`` outside [0, 100].
    """
    if not len(values):
        raise ValueError("percentile of an empty list")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q={q} must be in [0, 100]")
    return float(np.percentile(np.asarray(values, dtype=float), q))


# --- summaries over repeats ------------------------------------------------------------------------


def spread(values: Sequence[float]) -> dict[str, Any] | None:
    """``{"median", "min", "max", "n"}`` of the values (median of an even count: mean of the middle two);
    None for an empty list."""
    vals = [float(v) for v in values]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def summarize(points: list[dict[str, Any]], mode: str = "rate") -> list[dict[str, Any]]:
    """One entry per load level: median and spread of each ``SUMMARY_METRICS`` over its valid repeats.

    Invalid points (:func:`point_valid`) are counted and named, never summarized. A level is
    ``saturated`` when most of its valid repeats are (None when none can be: burst or closed loop).

    Args:
        points: parsed points (:func:`parse_result`), any order, repeats included.
        mode: ``rate`` or ``concurrency`` (the load a level is keyed by).

    Returns:
        Sorted by load: ``{"offered_rate_rps", "concurrency", "repeats", "valid_repeats",
        "invalid_points", "saturated_repeats", "saturated", "metrics": {metric: spread or None}}``.
    """
    out = []
    for level in aggregate.levels(points, lambda p: load_of(p, mode), point_valid):
        load, ps, valid = level.load, level.points, level.valid
        sat = [point_saturated(p) for p in valid]
        out.append(
            {
                "offered_rate_rps": INF if math.isinf(load) else ps[0].get("offered_rate_rps"),
                "concurrency": ps[0].get("concurrency"),
                "repeats": len(ps),
                "valid_repeats": len(valid),
                "invalid_points": [str(p.get("point", f"r{p.get('repeat')}")) for p in ps if not point_valid(p)],
                "saturated_repeats": sum(1 for s in sat if s),
                "saturated": aggregate.majority(sat),
                "metrics": {
                    m: spread([p[m] for p in valid if isinstance(p.get(m), (int, float))]) for m in SUMMARY_METRICS
                },
            }
        )
    return out
