"""The sustained throughput ceiling of a sweep, and the saturation labels it overrules.

Works on the per-load-level summaries of :func:`quantverdict.measure.sweep.summarize`. Pure (standard
library only).
"""

from __future__ import annotations

from typing import Any

from quantverdict.measure.sweep_plan import is_inf_rate
from quantverdict.measure.validity import SATURATION_FRACTION


def _throughput(level: dict[str, Any], key: str, fallback: str) -> dict[str, Any] | None:
    return level["metrics"].get(key) or level["metrics"].get(fallback)


def sustained_ceiling(summary: list[dict[str, Any]], mode: str = "rate") -> dict[str, Any]:
    """The highest throughput the server sustained, with its spread over repeats.

    Definition. Open loop: among the load levels the server could not keep up with (``saturated``)
    and the infinite-rate burst, the one with the highest median ``throughput_tok_s`` (steady-state
    output tok/s when the level had a steady window, else whole-run); ``kind = "saturated"``. If no
    level saturated and there was no burst, the ceiling is above the sweep: the highest valid level is
    reported as ``kind = "lower_bound"``. Closed loop: the concurrency with the highest median
    throughput, ``kind = "closed_loop_max"``. Invalid points never count.

    Returns:
        ``{"kind", "offered_rate_rps", "concurrency", "rps", "rps_min", "rps_max", "output_tok_s",
        "output_tok_s_min", "output_tok_s_max", "repeats", "basis", "whole_run_tok_s", "whole_run_tok_s_min",
        "whole_run_tok_s_max"}`` (``basis``: the level's ``throughput_basis``, ``"steady_window"``,
        ``"whole_run"`` or ``"mixed"``; ``whole_run_tok_s``: the same level's whole-run output tok/s, median and
        range over its repeats, whatever its basis, so that two ceilings of different bases can still be compared
        run for run), or ``{"kind": "none", "reason"}``.
    """
    valid = [lv for lv in summary if lv["valid_repeats"] > 0 and _throughput(lv, "throughput_tok_s", "output_tok_s")]
    if not valid:
        return {"kind": "none", "reason": "no valid sweep point"}
    if mode == "concurrency":
        cands, kind = valid, "closed_loop_max"
    else:
        cands = [lv for lv in valid if lv["saturated"] or is_inf_rate(lv["offered_rate_rps"])]
        kind = "saturated"
        if not cands:
            cands, kind = valid, "lower_bound"
    best = max(cands, key=lambda lv: (_throughput(lv, "throughput_tok_s", "output_tok_s") or {})["median"])
    tok = _throughput(best, "throughput_tok_s", "output_tok_s") or {}
    rps = _throughput(best, "throughput_rps", "achieved_rps") or {}
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
        "basis": best.get("throughput_basis"),
        "whole_run_tok_s": whole.get("median"),
        "whole_run_tok_s_min": whole.get("min"),
        "whole_run_tok_s_max": whole.get("max"),
    }


def saturation_overruled(offered_rate_rps: Any, ceiling: dict[str, Any]) -> str | None:
    """Why a finite offered rate cannot be saturated, given the server's sustained ceiling; None when it can.

    A server that sustained ``ceiling["rps"]`` req/s (at the burst or a higher rate) keeps up with any
    offered rate under ``SATURATION_FRACTION`` of it: an achieved rate under 90% of such a rate comes from
    the run being short (ramp-up and drain inside the timed window, and the count of a few requests:
    one completion of 8 is 12.5%), not from the server falling behind. Without this rule a review could
    call w8a8 "saturated at 1 req/s (0.82 achieved)" next to a ceiling of 2.20 req/s.
    """
    rps = ceiling.get("rps")
    if is_inf_rate(offered_rate_rps) or offered_rate_rps is None or not rps or ceiling.get("kind") != "saturated":
        return None
    if float(offered_rate_rps) >= SATURATION_FRACTION * float(rps):
        return None
    where = "the burst" if is_inf_rate(ceiling.get("offered_rate_rps")) else f"{ceiling.get('offered_rate_rps')} req/s"
    return (
        f"not saturated: the server sustained {float(rps):.2f} req/s at {where}, so its shortfall at "
        f"{float(offered_rate_rps):g} req/s is the short run (ramp-up, drain, few requests), not a full server"
    )


def consistent_saturation(summary: list[dict[str, Any]], mode: str = "rate") -> list[dict[str, Any]]:
    """``summary`` (:func:`quantverdict.measure.sweep.summarize`) with ``saturated`` cleared on levels whose
    offered rate is under 90% of the sustained ceiling of the others (:func:`saturation_overruled`, reason in
    ``saturation_note``). Closed loops are returned as they are. Use before :func:`sustained_ceiling` and any
    "saturated" label."""
    if mode != "rate":
        return summary
    ceiling = sustained_ceiling(summary, mode)
    out = []
    for lv in summary:
        note = saturation_overruled(lv["offered_rate_rps"], ceiling) if lv["saturated"] else None
        out.append({**lv, "saturated": False, "saturation_note": note} if note else lv)
    return out
