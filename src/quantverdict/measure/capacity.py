"""The sustained throughput ceiling of a sweep.

Works on the per-load-level summaries of :func:`quantverdict.measure.sweep.summarize`, whose ``saturated`` is
each level's stored point decisions (:func:`quantverdict.measure.validity.point_saturation`): the ceiling never
judges saturation itself. Pure (standard library only).
"""

from __future__ import annotations

from typing import Any

from quantverdict.measure.sweep_plan import is_inf_rate


def _throughput(level: dict[str, Any], key: str, fallback: str) -> dict[str, Any] | None:
    return level["metrics"].get(key) or level["metrics"].get(fallback)


def _median(level: dict[str, Any], key: str) -> float:
    return float((level["metrics"].get(key) or {}).get("median") or 0.0)


def sustained_ceiling(summary: list[dict[str, Any]], mode: str = "rate") -> dict[str, Any]:
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
    valid = [lv for lv in summary if lv["valid_repeats"] > 0 and _throughput(lv, "throughput_tok_s", "output_tok_s")]
    if not valid:
        return {"kind": "none", "reason": "no valid sweep point"}
    if mode == "concurrency":
        best = max(valid, key=lambda lv: (_throughput(lv, "throughput_tok_s", "output_tok_s") or {})["median"])
        kind, basis = "closed_loop_max", best.get("throughput_basis")
        tok = _throughput(best, "throughput_tok_s", "output_tok_s") or {}
        rps = _throughput(best, "throughput_rps", "achieved_rps") or {}
    else:
        reached = any(lv["saturated"] or is_inf_rate(lv["offered_rate_rps"]) for lv in valid)
        kind, basis = ("saturated" if reached else "lower_bound"), "whole_run"
        best = max(valid, key=lambda lv: (_median(lv, "achieved_rps"), _median(lv, "output_tok_s")))
        tok = best["metrics"].get("output_tok_s") or {}
        rps = best["metrics"].get("achieved_rps") or {}
    whole = best["metrics"].get("output_tok_s") or {}
    return {
        "kind": kind,
        "offered_rate_rps": best["offered_rate_rps"],
        "concurrency": best["concurrency"],
        "rps": rps.get("median"),
        "rps_min": rps.get("min"),
        "rps_max": rps.get("max"),
        "output_tok_s": tok.get("median"),
        "output_tok_s_min": tok.get("min"),
        "output_tok_s_max": tok.get("max"),
        "repeats": tok.get("n"),
        "basis": basis,
        "whole_run_tok_s": whole.get("median"),
        "whole_run_tok_s_min": whole.get("min"),
        "whole_run_tok_s_max": whole.get("max"),
    }
