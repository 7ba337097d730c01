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
    ``saturated`` when most of its valid repeats are, by each point's stored decision
    (:func:`quantverdict.measure.validity.point_saturation`; None when none can be: burst or closed loop).

    Args:
        points: parsed points (:func:`parse_result`), any order, repeats included.
        mode: ``rate`` or ``concurrency`` (the load a level is keyed by).

    Returns:
        Sorted by load: ``{"offered_rate_rps", "concurrency", "repeats", "valid_repeats",
        "invalid_points", "saturated_repeats", "saturated", "throughput_basis", "metrics": {metric: spread or
        None}}``; ``throughput_basis`` is what the valid repeats' ``throughput_*`` rest on (:func:`basis_of`).
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
                "throughput_basis": basis_of(valid),
                "metrics": {
                    m: spread([p[m] for p in valid if isinstance(p.get(m), (int, float))]) for m in SUMMARY_METRICS
                },
            }
        )
    return out


def basis_of(points: Sequence[dict[str, Any]]) -> str | None:
    """What the points' ``throughput_rps`` / ``throughput_tok_s`` rest on (each point's ``throughput_basis``,
    :func:`quantverdict.measure.bench_result.parse_result`): ``"steady_window"`` or ``"whole_run"`` when every
    point says the same, ``"mixed"`` when they differ, None when none says.

    E.g. three repeats of a closed loop whose steady windows were all shorter than two request lifetimes:
    ``"whole_run"``; two of them long enough: ``"mixed"``.
    """
    bases = {p["throughput_basis"] for p in points if p.get("throughput_basis")}
    if len(bases) > 1:
        return "mixed"
    return next(iter(bases), None)


# --- where a benchmark stage's time went -----------------------------------------------------------


def time_split(
    server_start_s: float | None,
    server: dict[str, Any] | None,
    points: list[dict[str, Any]],
    sweep_wall_s: float | None,
) -> dict[str, Any]:
    """The benchmark stage's time, split: server start (of which torch.compile, graph capture and the warm-up after
    it, from the server log), the measured windows, and the client's overhead (warm-ups, cache resets, counter reads,
    dataset sampling, and the client's start when it was started after the server: the sweep's wall time minus
    its windows; a client started with the server imports vLLM during the start-up, ``speed.sweep_client``).

    Args:
        server_start_s: process start to a verified, healthy server (``speed.server_start_s``).
        server: the parsed server log (``memory.server``: ``compile_s``, ``graph_capture_s``,
            ``warmup_after_capture_s``, ``compile_cache_hit``), or None.
        points: the parsed points (``duration_s``: the measured window of each).
        sweep_wall_s: the sweep's wall time (one client process, all points), or None.

    Returns:
        ``{"server_start_s", "compile_s", "graph_capture_s", "warmup_after_capture_s", "compile_cache_hit",
        "windows_s", "overhead_s",
        "sweep_wall_s", "overhead_fraction"}``: ``overhead_fraction`` = overhead / (start + windows), the client's
        share; None where a part is unknown. Issue 16's target (<= 0.10) is the whole benchmark stage's excess over
        start + windows, which also holds the HBM probe and the server's stop
        (:func:`quantverdict.results.table.benchmark_split_table`).

    E.g. start 226 s, windows 120 s, sweep wall 131 s: overhead 11 s, fraction 11 / 346 = 0.032.
    """
    srv = server or {}
    windows = sum(float(p["duration_s"]) for p in points if isinstance(p.get("duration_s"), (int, float)))
    overhead = None if sweep_wall_s is None else round(float(sweep_wall_s) - windows, 3)
    base = None if server_start_s is None else float(server_start_s) + windows
    return {
        "server_start_s": server_start_s,
        "compile_s": srv.get("compile_s"),
        "graph_capture_s": srv.get("graph_capture_s"),
        "warmup_after_capture_s": srv.get("warmup_after_capture_s"),
        "compile_cache_hit": srv.get("compile_cache_hit"),
        "windows_s": round(windows, 3),
        "overhead_s": overhead,
        "sweep_wall_s": sweep_wall_s,
        "overhead_fraction": None if overhead is None or not base else overhead / base,
    }


# --- ratio to the baseline, paired by repeat (the review's hook for regime claims) -----------------

# Student's t, two-sided 95% (0.975 quantile), degrees of freedom 1..30 (any statistics table); 1.96 above
T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def paired_ratio(
    points: list[dict[str, Any]],
    baseline_points: list[dict[str, Any]],
    metric: str = "output_tok_s",
    mode: str = "concurrency",
    higher_is_better: bool = True,
) -> list[dict[str, Any]]:
    """Per load level, the ratio of a scheme's ``metric`` to the baseline's, paired by repeat index, with a 95%
    interval and what it establishes.

    Repeat ``r`` of a scheme is paired with repeat ``r`` of the baseline at the same load (same seed, same
    machine, the same position in the sweep), valid points only (:func:`point_valid`). On the log ratios
    ``d_r = ln(x_r / b_r)``: mean ``m``, sample standard deviation ``s``, ``n`` pairs; the interval is
    ``exp(m -+ t_{0.975, n-1} s / sqrt(n))`` (Student's t on paired differences of logs, so a ratio and its
    inverse get mirrored intervals). One pair gives a ratio without an interval.

    Args:
        points: the scheme's parsed points (``repeat``, load keys, ``metric``).
        baseline_points: the baseline's, from the same plan.
        metric: a point key, e.g. ``output_tok_s`` or ``throughput_tok_s``.
        mode: ``rate`` or ``concurrency`` (the load a level is keyed by).
        higher_is_better: True for throughputs; False for latencies (a ratio below 1 is then "faster").

    Returns:
        Sorted by load: ``{"load", "pairs", "ratios" (by repeat), "ratio" (geometric mean), "low", "high"
        (None under 2 pairs), "verdict"}``; verdict ``faster``, ``slower`` or ``no difference established``
        (the interval holds 1, or fewer than 2 pairs).

    E.g. ratios 1.20, 1.25, 1.22 (n=3): m = 0.2014, s = 0.0205, t = 4.303: interval 1.162-1.287, faster.
    """

    def by_key(ps: list[dict[str, Any]]) -> dict[tuple[float, int], float]:
        out: dict[tuple[float, int], float] = {}
        for p in ps:
            v = p.get(metric)
            if point_valid(p) and isinstance(v, (int, float)) and v > 0:
                out[(load_of(p, mode), int(p.get("repeat") or 0))] = float(v)
        return out

    mine, base = by_key(points), by_key(baseline_points)
    loads = sorted({k[0] for k in mine} | {k[0] for k in base})
    result = []
    for load in loads:
        reps = sorted(r for (ld, r) in mine if ld == load and (ld, r) in base)
        ratios = [mine[(load, r)] / base[(load, r)] for r in reps]
        entry: dict[str, Any] = {"load": load, "pairs": len(ratios), "ratios": ratios, "ratio": None}
        entry.update(low=None, high=None, verdict="no difference established")
        if ratios:
            logs = np.log(np.asarray(ratios))
            entry["ratio"] = float(np.exp(logs.mean()))
        if len(ratios) >= 2:
            n = len(ratios)
            t = T975[n - 2] if n - 1 <= len(T975) else 1.96
            half = t * float(logs.std(ddof=1)) / math.sqrt(n)
            low, high = float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))
            entry.update(low=low, high=high)
            better = low > 1 if higher_is_better else high < 1
            worse = high < 1 if higher_is_better else low > 1
            entry["verdict"] = "faster" if better else "slower" if worse else "no difference established"
        result.append(entry)
    return result
