"""The sustained throughput ceiling of a sweep.

Works on the per-load-level summaries of :func:`quantverdict.measure.sweep.summarize`, whose ``saturated`` is
each level's stored point decisions (:func:`quantverdict.measure.validity.point_saturation`): the ceiling never
judges saturation itself. Pure (standard library; the summaries are typed by :mod:`quantverdict.measure.points`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from quantverdict.measure.points import LoadLevel, Spread
from quantverdict.measure.sweep_plan import is_inf_rate


def _metric(level: LoadLevel, key: str) -> Spread | None:
    """The level's spread of ``key`` over its valid repeats; None where it has none."""
    metrics = level.metrics or {}
    return metrics[key] if key in metrics else None


def _throughput(level: LoadLevel, key: str, fallback: str) -> Spread | None:
    return _metric(level, key) or _metric(level, fallback)


def _median(level: LoadLevel, key: str) -> float:
    spread = _metric(level, key)
    return float(spread.median if spread else 0.0)


def _steady_median(level: LoadLevel) -> float:
    """The level's median ``throughput_tok_s`` (its steady window where it had one), else whole-run ``output_tok_s``."""
    spread = _throughput(level, "throughput_tok_s", "output_tok_s")
    return spread.median if spread else 0.0


def sustained_ceiling(summary: Sequence[LoadLevel], mode: str = "rate") -> dict[str, Any]:
    """The highest throughput the server sustained, with its spread over repeats, and the level it was measured at.

    Open loop (``mode="rate"``): the valid level with the highest median **achieved** req/s (completed requests
    over the whole run, vLLM's ``request_throughput``: what goodput divides by too), and that level's whole-run
    output tok/s; so the ceiling is never below a rate the scheme achieved at a valid level, and goodput at any
    level (good requests over the same duration) never above it. ``kind = "saturated"`` when a valid level is
    saturated (its points' stored decision, :func:`quantverdict.measure.validity.point_saturation`) or is the
    infinite-rate burst: the sweep reached the server's limit, and the ceiling is the best it measured there or
    below (a short saturated run can complete fewer requests per second than a lower rate did: its ramp-up and
    drain weigh more); else ``kind = "lower_bound"``: the server kept up with every rate, its ceiling lies above.
    Closed loop: the concurrency with the highest median ``throughput_tok_s`` (steady-state output tok/s when the
    level had a steady window, else whole-run), ``kind = "closed_loop_max"``. Invalid points never count.

    Returns:
        ``{"kind", "offered_rate_rps", "concurrency", "rps", "rps_min", "rps_max", "output_tok_s",
        "output_tok_s_min", "output_tok_s_max", "repeats", "basis", "whole_run_tok_s", "whole_run_tok_s_min",
        "whole_run_tok_s_max"}`` (``basis``: ``"whole_run"`` in an open loop; the level's ``throughput_basis``,
        ``"steady_window"``, ``"whole_run"`` or ``"mixed"``, in a closed loop; ``whole_run_tok_s``: the same
        level's whole-run output tok/s, median and range over its repeats, whatever its basis, so that two ceilings
        of different bases can still be compared run for run), or ``{"kind": "none", "reason"}``.
    """
    valid = [lv for lv in summary if lv.valid_repeats and _throughput(lv, "throughput_tok_s", "output_tok_s")]
    if not valid:
        return {"kind": "none", "reason": "no valid sweep point"}
    if mode == "concurrency":
        best = max(valid, key=_steady_median)
        kind, basis = "closed_loop_max", best.throughput_basis
        tok = _throughput(best, "throughput_tok_s", "output_tok_s")
        rps = _throughput(best, "throughput_rps", "achieved_rps")
    else:
        reached = any(lv.saturated or is_inf_rate(lv.offered_rate_rps) for lv in valid)
        kind, basis = ("saturated" if reached else "lower_bound"), "whole_run"
        best = max(valid, key=lambda lv: (_median(lv, "achieved_rps"), _median(lv, "output_tok_s")))
        tok = _metric(best, "output_tok_s")
        rps = _metric(best, "achieved_rps")
    whole = _metric(best, "output_tok_s")
    return {
        "kind": kind,
        "offered_rate_rps": best.offered_rate_rps,
        "concurrency": best.concurrency,
        "rps": rps.median if rps else None,
        "rps_min": rps.min if rps else None,
        "rps_max": rps.max if rps else None,
        "output_tok_s": tok.median if tok else None,
        "output_tok_s_min": tok.min if tok else None,
        "output_tok_s_max": tok.max if tok else None,
        "repeats": tok.n if tok else None,
        "basis": basis,
        "whole_run_tok_s": whole.median if whole else None,
        "whole_run_tok_s_min": whole.min if whole else None,
        "whole_run_tok_s_max": whole.max if whole else None,
    }
