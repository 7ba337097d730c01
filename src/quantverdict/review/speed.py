"""The speed number of a scorecard: sweep points per load level (median over valid repeats), ceiling, goodput
under the SLO and latency at the stated load."""

from __future__ import annotations

import math
from typing import Any

from quantverdict.config.schema import ReviewConfig
from quantverdict.measure import aggregate, capacity, sweep, sweep_plan
from quantverdict.measure import validity as point_checks
from quantverdict.measure.aggregate import is_number
from quantverdict.results.record import JobRecord
from quantverdict.review import flags
from quantverdict.review.flags import Flag

SHORT_OUTPUT_TOLERANCE = 0.99  # a speed point whose output tokens are < 99% of those requested is flagged

# metrics whose min/max over the valid repeats of a load level are kept next to the median
SPREAD_KEYS = (
    "achieved_rps",
    "output_tok_s",
    "throughput_rps",
    "throughput_tok_s",
    "ttft_ms_p99",
    "itl_ms_p50",
    "itl_ms_p99",
    "e2e_ms_p50",
)


def load_label(p: dict[str, Any], mode: str) -> str:
    if mode == "concurrency":
        c = p.get("concurrency")
        return f"concurrency {c:g}" if is_number(c) else f"concurrency {c}"  # medians turn 16 into 16.0
    r = p["load"]
    return "unlimited rate" if math.isinf(r) else f"{r:g} req/s"


def raw_points(rec: JobRecord) -> tuple[str, list[dict[str, Any]]]:
    """The sweep's mode (``rate`` unless the record says ``concurrency``) and its points as the record holds
    them (dicts, for :mod:`quantverdict.measure.sweep`)."""
    return rec.speed.mode or "rate", [p.to_dict() for p in rec.speed.points]


def speed_points(rec: JobRecord) -> tuple[str, list[dict[str, Any]]]:
    """The sweep points of a record, one per load level, sorted by load.

    Invalid points (:func:`quantverdict.measure.point_checks.point_valid`: output tokens under 90% of those requested,
    a wrong request count, ITL lists that are not gaps after the first token) are left out; a level
    with no valid repeat is left out. Each number is the **median** over the level's valid repeats;
    ``spread[metric] = [min, max]`` for ``SPREAD_KEYS``; ``load`` (req/s or concurrency, inf for an
    unlimited rate), ``repeats``, ``valid_repeats`` and ``saturated`` (most valid repeats saturated)
    are added.
    """
    mode, raw = raw_points(rec)
    out = []
    for level in aggregate.levels(raw, lambda p: sweep_plan.load_of(p, mode), point_checks.point_valid):
        valid = level.valid
        if not valid:
            continue
        agg = aggregate.median_point(valid)
        agg["spread"] = aggregate.ranges(valid, SPREAD_KEYS)
        agg["saturated"] = aggregate.majority(point_checks.point_saturated(q) for q in valid)
        agg["load"], agg["repeats"], agg["valid_repeats"] = level.load, len(level.points), len(valid)
        agg["label"] = load_label(agg, mode)
        out.append(agg)
    return mode, out


def slo_ok(p: dict[str, Any], rc: ReviewConfig) -> bool | None:
    """True when the point's TTFT p99 and ITL p99 meet the SLO; None when a needed value is missing."""
    ok = True
    for key, limit in (("ttft_ms_p99", rc.ttft_ms_p99), ("itl_ms_p99", rc.itl_ms_p99)):
        if limit is None:
            continue
        if p.get(key) is None:
            return None
        ok = ok and p[key] <= limit
    return ok


def load_point(mode: str, points: list[dict[str, Any]], rc: ReviewConfig) -> tuple[dict[str, Any] | None, str]:
    """The sweep point that stands for the stated load, and how it was chosen.

    Rate sweep, ``load_rps``: the smallest measured finite rate >= the load; if none, the unlimited-rate
    point (conservative: latency only grows with load). Concurrency sweep, ``load_rps``: the smallest
    concurrency whose achieved req/s reaches the load. Concurrency sweep, ``load_concurrency``: the
    smallest measured concurrency >= it. No load stated: the lowest measured load.
    """
    if not points:
        return None, "no speed points"
    if rc.load_rps is None and rc.load_concurrency is None:
        return points[0], f"no load stated: lowest measured load ({points[0]['label']})"
    if mode == "rate":
        if rc.load_rps is None:
            return None, "the sweep is open-loop (rates); a concurrency load needs bench.mode=concurrency"
        above = [p for p in points if p["load"] >= rc.load_rps - 1e-9]
        if not above:
            return None, f"no measured rate >= {rc.load_rps:g} req/s"
        p = above[0]
        how = (
            p["label"]
            if p["load"] == rc.load_rps
            else f"{p['label']} (nearest measured rate above {rc.load_rps:g} req/s)"
        )
        return p, how
    if rc.load_concurrency is not None:
        above = [p for p in points if p["load"] >= rc.load_concurrency]
        if not above:
            return None, f"no measured concurrency >= {rc.load_concurrency}"
        return above[0], above[0]["label"]
    rps = rc.load_rps or 0.0
    reach = [p for p in points if (p.get("achieved_rps") or 0) >= rps]
    if not reach:
        return None, f"no measured concurrency reaches {rps:g} req/s"
    return reach[0], f"{reach[0]['label']} (the lowest concurrency reaching {rps:g} req/s)"


def goodput(points: list[dict[str, Any]], rc: ReviewConfig) -> tuple[float | None, str]:
    """The achieved req/s at the highest sustained load whose TTFT p99 and ITL p99 meet the SLO, every
    lower load meeting it too: the "max rate under SLO attainment" of DistServe (Zhong et al. 2024) at
    99% attainment, read off the sweep.

    Only sustained loads count: finite offered rates (open loop) or concurrencies (closed loop). The
    unlimited-rate burst is not a load the server holds: its requests all arrive at t=0 and its
    latency is that of one batch of ``num_prompts`` requests, which can meet the SLO when 1 req/s does
    not (prefills of new arrivals stall the decode steps of the others). Latency grows with load, so
    the first load that fails ends the search (a higher one that passes is noise).

    Returns:
        ``(req/s, how)``: 0.0 when the lowest sustained load already fails; None with no SLO set or no
        sustained load measured.
    """
    if rc.ttft_ms_p99 is None and rc.itl_ms_p99 is None:
        return None, "no latency SLO set"
    held = [p for p in points if math.isfinite(p["load"])]
    if not held:
        return None, "no sustained load measured (only the unlimited-rate burst)"
    best: dict[str, Any] | None = None
    for p in held:
        if not slo_ok(p, rc):
            break
        best = p
    if best is None:
        return 0.0, f"the SLO fails at the lowest load ({held[0]['label']})"
    return float(best.get("achieved_rps") or 0.0), f"at {best['label']}"


def point_label(p: dict[str, Any], mode: str) -> str:
    """One raw sweep point's load as text, with its repeat after the first: ``1 req/s (repeat 1)``."""
    lbl = load_label({**p, "load": sweep_plan.load_of(p, mode)}, mode)
    return f"{lbl} (repeat {p['repeat']})" if p.get("repeat") else lbl


def speed_summary(rec: JobRecord, rc: ReviewConfig) -> tuple[dict[str, Any], list[Flag], list[str]]:
    """Single-stream speed, sustained ceiling, goodput under the SLO, and latency at the stated load.

    * single stream: the lowest-load point; ITL p50 and ``1000 / TPOT p50`` tok/s per request;
    * ceiling: :func:`quantverdict.measure.capacity.sustained_ceiling` (saturated levels and the burst; median over
      repeats with its min-max range; invalid points never count);
    * goodput: :func:`goodput` (the highest sustained load that meets the SLO, with every load below it);
    * saturation: a rate under 90% of the ceiling is never saturated (:func:`capacity.saturation_overruled`).

    Every number is a median over the valid repeats of its load level (:func:`speed_points`).

    Returns:
        ``(summary, flags, missing)``.
    """
    mode, points = speed_points(rec)
    found: list[Flag] = []
    _, raw = raw_points(rec)
    for q in raw:
        label = point_label(q, mode)
        want, got = q.get("output_tokens_requested"), q.get("output_tokens_total")
        if not point_checks.point_valid(q):
            if want and got is not None and got < point_checks.OUTPUT_VALID_FRACTION * want:
                found.append(
                    Flag(
                        flags.SPEED_POINT_SHORT,
                        "",
                        f"speed point {label}: {got:,.0f} of {want:,.0f} requested output tokens "
                        f"({100 * got / want:.0f}%): requests ended early; invalid, left out of every speed number",
                    )
                )
            others = [r for r in q.get("invalid_reasons") or [] if "requested output tokens" not in r]
            if others or not (want and got is not None and got < point_checks.OUTPUT_VALID_FRACTION * want):
                why = "; ".join(others) or "marked invalid"
                found.append(
                    Flag(
                        flags.SPEED_POINT_INVALID,
                        "",
                        f"speed point {label}: invalid ({why}); left out of every speed number",
                    )
                )
        elif want and got is not None and got < SHORT_OUTPUT_TOLERANCE * want:
            found.append(
                Flag(
                    flags.SPEED_POINT_SHORT_KEPT,
                    "",
                    f"speed point {label}: {got:,.0f} of {want:,.0f} requested output tokens "
                    f"({100 * got / want:.0f}%): some requests ended early; kept (>= 90%), tok/s slightly low",
                )
            )
        if q.get("failed"):
            found.append(Flag(flags.SPEED_POINT_FAILED, "", f"speed point {label}: {q['failed']:g} failed requests"))
        diff = q.get("vllm_max_rel_diff")
        if diff is not None and diff > point_checks.VLLM_AGREEMENT_TOLERANCE:
            found.append(
                Flag(
                    flags.PERCENTILE_DISAGREEMENT,
                    "",
                    f"speed point {label}: latency percentiles recomputed from the per-request data differ from "
                    f"vLLM's own by up to {100 * diff:.1f}%: the recomputed ones are reported",
                )
            )
    if not points:
        return {"mode": mode, "points": []}, found, ["no valid speed results" if raw else "no speed results"]
    low = points[0]
    tpot = low.get("tpot_ms_p50") or low.get("itl_ms_p50")
    ceiling = capacity.sustained_ceiling(capacity.consistent_saturation(sweep.summarize(raw, mode), mode), mode)
    for p in points:  # a rate the server keeps up with (below its ceiling) is not saturated
        note = capacity.saturation_overruled(p["load"], ceiling) if p.get("saturated") and mode == "rate" else None
        if note:
            p["saturated"], p["saturation_note"] = False, note
    out: dict[str, Any] = {
        "mode": mode,
        "points": points,
        "low_label": low["label"],
        "single_itl_ms_p50": low.get("itl_ms_p50"),
        "single_itl_ms_p50_range": low.get("spread", {}).get("itl_ms_p50"),
        "single_tok_s": 1000.0 / tpot if tpot else None,
        "ceiling_kind": ceiling["kind"],
        "ceiling_rps": ceiling.get("rps"),
        "ceiling_tok_s": ceiling.get("output_tok_s"),
        "ceiling_tok_s_range": (
            [ceiling["output_tok_s_min"], ceiling["output_tok_s_max"]] if ceiling.get("output_tok_s") else None
        ),
        "ceiling_repeats": ceiling.get("repeats"),
        "saturation_label": (
            load_label({**ceiling, "load": sweep_plan.load_of(ceiling, mode)}, mode)
            if ceiling["kind"] != "none"
            else None
        ),
        "repeats": max(p["repeats"] for p in points),
    }
    out["goodput_rps"], out["goodput_how"] = goodput(points, rc)
    at, how = load_point(mode, points, rc)
    out["load_how"] = how
    out["at_load"] = (
        {
            k: at.get(k)
            for k in (
                "label",
                "load",
                "achieved_rps",
                "ttft_ms_p99",
                "itl_ms_p99",
                "e2e_ms_p50",
                "e2e_ms_p99",
                "output_tok_s",
                "valid_repeats",
                "spread",
            )
        }
        if at
        else None
    )
    return out, found, []
