"""Repeat aggregation of sweep points: one summary per load level (median and spread over the valid
repeats), and the percentile that latencies are computed with.

Pure (standard library and numpy). What a point is and how it is read: :mod:`quantverdict.measure.points`,
:mod:`quantverdict.measure.sweep_plan`, :mod:`quantverdict.measure.bench_result`,
:mod:`quantverdict.measure.validity`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from quantverdict.measure import aggregate
from quantverdict.measure.points import LoadLevel, ServerMemory, Spread, SweepPoint, as_point, as_server
from quantverdict.measure.sweep_plan import INF
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


def spread(values: Sequence[float]) -> Spread | None:
    """The median, min, max and count ``n`` of the values (median of an even count: mean of the middle two);
    None for an empty list."""
    vals = [float(v) for v in values]
    if not vals:
        return None
    return Spread(median=statistics.median(vals), min=min(vals), max=max(vals), n=len(vals))


def summarize(points: Sequence[SweepPoint | Mapping[str, Any]], mode: str = "rate") -> list[LoadLevel]:
    """One entry per load level: median and spread of each ``SUMMARY_METRICS`` over its valid repeats.

    Invalid points (:func:`point_valid`) are counted and named, never summarized. A level is
    ``saturated`` when most of its valid repeats are, by each point's stored decision
    (:func:`quantverdict.measure.validity.point_saturation`; None when none can be: burst or closed loop).

    Args:
        points: parsed points (:func:`quantverdict.measure.bench_result.parse_result`), typed or as the record's
            JSON holds them, any order, repeats included.
        mode: ``rate`` or ``concurrency`` (the load a level is keyed by).

    Returns:
        Sorted by load, one :class:`~quantverdict.measure.points.LoadLevel` each: ``offered_rate_rps``,
        ``concurrency``, ``repeats``, ``valid_repeats``, ``invalid_points``, ``saturated_repeats``, ``saturated``,
        ``throughput_basis`` (what the valid repeats' ``throughput_*`` rest on, :func:`basis_of`) and ``metrics``
        (metric -> :class:`~quantverdict.measure.points.Spread` or None).
    """
    out = []
    typed = [as_point(p) for p in points]
    for level in aggregate.levels(typed, lambda p: p.load(mode), point_valid):
        load, ps, valid = level.load, level.points, level.valid
        sat = [point_saturated(p) for p in valid]
        out.append(
            LoadLevel(
                offered_rate_rps=INF if math.isinf(load) else ps[0].offered_rate_rps,
                concurrency=ps[0].concurrency,
                repeats=len(ps),
                valid_repeats=len(valid),
                invalid_points=[str(p.point if p.has("point") else f"r{p.repeat}") for p in ps if not point_valid(p)],
                saturated_repeats=sum(1 for s in sat if s),
                saturated=aggregate.majority(sat),
                throughput_basis=basis_of(valid),
                metrics={m: spread([v for p in valid if (v := p.number(m)) is not None]) for m in SUMMARY_METRICS},
            )
        )
    return out


def basis_of(points: Sequence[SweepPoint | Mapping[str, Any]]) -> str | None:
    """What the points' ``throughput_rps`` / ``throughput_tok_s`` rest on (each point's ``throughput_basis``,
    :func:`quantverdict.measure.bench_result.parse_result`): ``"steady_window"`` or ``"whole_run"`` when every
    point says the same, ``"mixed"`` when they differ, None when none says.

    E.g. three repeats of a closed loop whose steady windows were all shorter than two request lifetimes:
    ``"whole_run"``; two of them long enough: ``"mixed"``.
    """
    bases = {basis for p in points if (basis := as_point(p).throughput_basis)}
    if len(bases) > 1:
        return "mixed"
    return next(iter(bases), None)


# --- where a benchmark stage's time went -----------------------------------------------------------


def time_split(
    server_start_s: float | None,
    server: ServerMemory | Mapping[str, Any] | None,
    points: Sequence[SweepPoint | Mapping[str, Any]],
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
        share; None where a part is unknown. The target (<= 0.10: the stage costs at most 10% beyond what it measures)
        is the whole benchmark stage's excess over start + windows, which also holds the HBM probe and the server's stop
        (:func:`quantverdict.results.table.benchmark_split_table`).

    E.g. start 226 s, windows 120 s, sweep wall 131 s: overhead 11 s, fraction 11 / 346 = 0.032.
    """
    srv = as_server(server)
    windows = sum(d for p in points if (d := as_point(p).number("duration_s")) is not None)
    overhead = None if sweep_wall_s is None else round(float(sweep_wall_s) - windows, 3)
    base = None if server_start_s is None else float(server_start_s) + windows
    return {
        "server_start_s": server_start_s,
        "compile_s": srv.compile_s,
        "graph_capture_s": srv.graph_capture_s,
        "warmup_after_capture_s": srv.warmup_after_capture_s,
        "compile_cache_hit": srv.compile_cache_hit,
        "windows_s": round(windows, 3),
        "overhead_s": overhead,
        "sweep_wall_s": sweep_wall_s,
        "overhead_fraction": None if overhead is None or not base else overhead / base,
    }
