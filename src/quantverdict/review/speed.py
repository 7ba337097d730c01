"""The speed number of a scorecard: sweep points per load level (median over valid repeats), ceiling, goodput and
latency at the stated load.

Goodput is counted per request (:mod:`quantverdict.measure.goodput`) from each point's ``--save-detailed`` result
file (``speed.points[i].result_file``, or that name in ``bench/`` beside the record); without it the review says
so rather than estimate it.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from quantverdict.config.schema import ReviewConfig
from quantverdict.measure import aggregate, bench_result, capacity, sweep, sweep_plan
from quantverdict.measure import validity as point_checks
from quantverdict.measure.aggregate import is_number
from quantverdict.measure.goodput import Slo
from quantverdict.measure.goodput import goodput as request_goodput
from quantverdict.results.record import JobRecord
from quantverdict.review.flags import Flag, FlagCode

NO_PER_REQUEST = "no per-request data in this record"

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
    "tpot_ms_p50",  # the first screen's speed ratio (baseline TPOT p50 / scheme TPOT p50) and its repeat range
)


def load_label(p: dict[str, Any], mode: str) -> str:
    if mode == "concurrency":
        c = p.get("concurrency")
        return f"concurrency {c:g}" if is_number(c) else f"concurrency {c}"  # medians turn 16 into 16.0
    r = p["load"]
    return "unlimited rate" if math.isinf(r) else f"{r:g} req/s"


def workload(rec: JobRecord) -> dict[str, Any]:
    """The request shape of a record's sweep from ``config.bench``: ``{"bench", "input_len", "output_len", "text"}``
    (tokens per request). A speedup holds for one shape: schemes are compared only with a baseline of the same shape."""
    bench = rec.cfg("bench")
    name, n_in, n_out = bench.get("name"), bench.get("input_len"), bench.get("output_len")
    if is_number(n_in) and is_number(n_out):
        shape = f"{int(float(n_in)):,} in / {int(float(n_out)):,} out tokens per request"
    else:
        shape = "request shape not recorded"
    return {"bench": name, "input_len": n_in, "output_len": n_out, "text": shape + (f" (bench={name})" if name else "")}


def shape_of(speed: dict[str, Any]) -> tuple[Any, Any] | None:
    """``(input_len, output_len)`` of a scorecard's speed; None without points or a recorded shape."""
    w = speed.get("workload") or {}
    if not speed.get("points") or w.get("input_len") is None or w.get("output_len") is None:
        return None
    return (w["input_len"], w["output_len"])


def raw_points(rec: JobRecord) -> tuple[str, list[dict[str, Any]]]:
    """The sweep's mode and its points as recorded (dicts, repeats apart), a too-short steady window set aside
    (:func:`quantverdict.measure.bench_result.rebase_steady`)."""
    return sweep_mode(rec), [bench_result.rebase_steady(p.to_dict()) for p in rec.speed.points]


def sweep_mode(rec: JobRecord) -> str:
    """``speed.mode``, else ``config.bench.mode``, else ``rate``."""
    return str(rec.speed.mode or rec.cfg("bench").get("mode") or "rate")


def speed_points(rec: JobRecord) -> tuple[str, list[dict[str, Any]]]:
    """One point per load level, by load: the median of each number over the level's valid repeats
    (:func:`quantverdict.measure.validity.point_valid`), ``spread[metric] = [min, max]`` for :data:`SPREAD_KEYS`, and
    ``load``, ``label``, ``repeats``, ``valid_repeats``, ``saturated`` (most valid repeats' stored decision,
    :func:`quantverdict.measure.validity.point_saturation`), ``saturation_ratio``, ``saturation_basis``."""
    mode, raw = raw_points(rec)
    out = []
    for level in aggregate.levels(raw, lambda p: sweep_plan.load_of(p, mode), point_checks.point_valid):
        valid = level.valid
        if not valid:
            continue
        agg = aggregate.median_point(valid)
        agg["spread"] = aggregate.ranges(valid, SPREAD_KEYS)
        decisions = [point_checks.point_saturation(q) for q in valid]
        agg["saturated"] = aggregate.majority(d["saturated"] for d in decisions)
        ratios = [d["saturation_ratio"] for d in decisions if is_number(d["saturation_ratio"])]
        agg["saturation_ratio"] = statistics.median(ratios) if ratios else None
        bases = {d["saturation_basis"] for d in decisions}
        agg["saturation_basis"] = bases.pop() if len(bases) == 1 else "mixed"
        agg["load"], agg["repeats"], agg["valid_repeats"] = level.load, len(level.points), len(valid)
        agg["label"] = load_label(agg, mode)
        out.append(agg)
    return mode, out


def planned_loads(rec: JobRecord) -> list[float]:
    """The load levels the config planned (``bench.concurrencies`` or ``bench.rates``; inf unlimited),
    ascending; [] without a plan."""
    mode = sweep_mode(rec)
    bench = rec.cfg("bench")
    try:
        plan = sweep_plan.plan(mode, list(bench.get("rates") or []), list(bench.get("concurrencies") or []), 1)
    except (TypeError, ValueError):
        return []
    return sorted(
        {sweep_plan.load_of({"concurrency": q.concurrency, "offered_rate_rps": q.offered_rate_rps}, mode) for q in plan}
    )


def missing_levels(planned: list[float], points: list[dict[str, Any]]) -> list[float]:
    """The planned loads without a valid point among ``points`` (one per level), ascending."""
    have = {float(p["load"]) for p in points}
    return [load for load in planned if load not in have]


def ceiling_is_floor(speed: dict[str, Any]) -> bool:
    """Whether a scorecard's ceiling is a lower bound (no point saturated, or the sweep stopped early)."""
    return speed.get("ceiling_kind") == "lower_bound"


def _stopped_why(rec: JobRecord) -> str:
    """`` (job interrupted in stage benchmark)`` for an unfinished record, else ``""``."""
    status, stage = rec.status, rec.failed_stage
    if status in (None, "ok"):
        return ""
    return f" (job {status}" + (f" in stage {stage})" if stage else ")")


def slo_ok(p: dict[str, Any], rc: ReviewConfig) -> bool | None:
    """Whether a point's TTFT p99 and ITL p99 meet the SLO; None when a needed value is missing."""
    ok = True
    for key, limit in (("ttft_ms_p99", rc.ttft_ms_p99), ("itl_ms_p99", rc.itl_ms_p99)):
        if limit is None:
            continue
        if p.get(key) is None:
            return None
        ok = ok and p[key] <= limit
    return ok


def load_point(mode: str, points: list[dict[str, Any]], rc: ReviewConfig) -> tuple[dict[str, Any] | None, str]:
    """The point that stands for the stated load, and how it was chosen: rate sweep, the smallest rate >=
    ``load_rps`` (else the unlimited rate); concurrency sweep, the smallest concurrency reaching ``load_rps`` req/s
    or >= ``load_concurrency``; no load stated, the lowest load."""
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


def p99_slo_max_rps(points: list[dict[str, Any]], rc: ReviewConfig) -> tuple[float | None, str]:
    """Achieved req/s at the highest sustained load (finite rate or concurrency) whose TTFT p99 and ITL p99
    meet the SLO, every lower load meeting them too; 0.0 when the lowest fails, None without an SLO or a sustained load.
    Not goodput: the p99s are separate percentiles."""
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


def slo_of(rc: ReviewConfig) -> Slo:
    """The per-request objectives: TTFT <= ``ttft_ms_p99``, TPOT <= ``itl_ms_p99``, E2E <= ``e2e_ms`` (those set)."""
    return Slo(ttft_ms=rc.ttft_ms_p99, tpot_ms=rc.itl_ms_p99, e2e_ms=rc.e2e_ms)


def result_file(rec: JobRecord, p: dict[str, Any]) -> Path | None:
    """The ``--save-detailed`` result file of point ``p``: beside the record first (``bench/<name>``, ``<name>``),
    else where the job wrote it; None when none exists."""
    name = p.get("result_file")
    if not name:
        return None
    # beside the record first: a copied record (docs/results) reads its own copy, not a path of another machine
    source_dir = rec.source_dir
    candidates = (
        [Path(source_dir) / "bench" / Path(name).name, Path(source_dir) / Path(name).name] if source_dir else []
    )
    candidates.append(Path(name))
    return next((c for c in candidates if c.is_file()), None)


def point_goodput(rec: JobRecord, p: dict[str, Any], slo: Slo) -> dict[str, Any] | None:
    """Goodput of one point (:meth:`quantverdict.measure.goodput.Goodput.to_dict`); None without per-request
    data."""
    path = result_file(rec, p)
    if path is None:
        return None
    try:
        return request_goodput(json.loads(path.read_text()), slo).to_dict()
    except (OSError, ValueError, KeyError):
        return None


def level_goodput(rec: JobRecord, mode: str, rc: ReviewConfig) -> dict[float, dict[str, Any]]:
    """Per load level with per-request data in every valid repeat: ``{"goodput_rps", "slo_attainment_pct"
    (medians), "good_requests", "slo_requests" (sums), "repeats", "slo_missed" ({objective: sum})}``."""
    slo = slo_of(rc)
    if not slo.objectives():
        return {}
    _, raw = raw_points(rec)
    with_g = [{**q, "_goodput": point_goodput(rec, q, slo)} for q in raw]
    out: dict[float, dict[str, Any]] = {}
    for level in aggregate.levels(with_g, lambda q: sweep_plan.load_of(q, mode), point_checks.point_valid):
        gs = [q["_goodput"] for q in level.valid]
        if not gs or any(g is None for g in gs):
            continue
        missed: dict[str, int] = {}
        for g in gs:
            for k, v in g["slo_missed"].items():
                missed[k] = missed.get(k, 0) + v
        out[level.load] = {
            "goodput_rps": statistics.median(g["goodput_rps"] for g in gs),
            "slo_attainment_pct": statistics.median(g["slo_attainment_pct"] for g in gs),
            "good_requests": sum(g["good_requests"] for g in gs),
            "slo_requests": sum(g["slo_requests"] for g in gs),
            "repeats": len(gs),
            "slo_missed": missed,
        }
    return out


def goodput_at(at: dict[str, Any] | None, rc: ReviewConfig) -> tuple[float | None, str]:
    """Goodput at the stated load's point (req/s) and how it was counted; None without an SLO, a point or
    per-request data."""
    slo = slo_of(rc)
    if not slo.objectives():
        return None, "no latency SLO set"
    if at is None:
        return None, "no point at the stated load"
    g = at.get("goodput")
    if not g:
        return None, f"{NO_PER_REQUEST} (no --save-detailed result file beside it): not counted per request"
    reps = f", median of {g['repeats']} repeats" if g["repeats"] > 1 else ""
    return float(g["goodput_rps"]), (
        f"at {at['label']}: {g['good_requests']} of {g['slo_requests']} requests met the SLO "
        f"({g['slo_attainment_pct']:.1f}%{reps})"
    )


def point_label(p: dict[str, Any], mode: str) -> str:
    """A raw point's load as text, its repeat after the first: ``1 req/s (repeat 1)``."""
    lbl = load_label({**p, "load": sweep_plan.load_of(p, mode)}, mode)
    return f"{lbl} (repeat {p['repeat']})" if p.get("repeat") else lbl


def speed_summary(rec: JobRecord, rc: ReviewConfig) -> tuple[dict[str, Any], list[Flag], list[str]]:
    """Single-stream speed (lowest load: ITL p50, ``1000 / TPOT p50`` tok/s), sustained ceiling
    (:func:`quantverdict.measure.capacity.sustained_ceiling`), goodput at the load, ``p99_slo_max_rps``, and latency at
    the load; every number a median over the valid repeats of its level (:func:`speed_points`).

    Returns:
        ``(summary, flags, missing)``.
    """
    mode, points = speed_points(rec)
    found: list[Flag] = []
    _, raw = raw_points(rec)
    for sp, q in zip(rec.speed.points, raw):
        label = point_label(q, mode)
        want, got = sp.output_tokens_requested, sp.output_tokens_total
        if not point_checks.point_valid(q):
            if want and got is not None and got < point_checks.OUTPUT_VALID_FRACTION * want:
                found.append(
                    Flag(
                        FlagCode.SPEED_POINT_SHORT,
                        "",
                        f"speed point {label}: {got:,.0f} of {want:,.0f} requested output tokens "
                        f"({100 * got / want:.0f}%): requests ended early; invalid, left out of every speed number",
                    )
                )
            others = [r for r in sp.invalid_reasons or [] if "requested output tokens" not in r]
            if others or not (want and got is not None and got < point_checks.OUTPUT_VALID_FRACTION * want):
                why = "; ".join(others) or "marked invalid"
                found.append(
                    Flag(
                        FlagCode.SPEED_POINT_INVALID,
                        "",
                        f"speed point {label}: invalid ({why}); left out of every speed number",
                    )
                )
        elif want and got is not None and got < SHORT_OUTPUT_TOLERANCE * want:
            found.append(
                Flag(
                    FlagCode.SPEED_POINT_SHORT_KEPT,
                    "",
                    f"speed point {label}: {got:,.0f} of {want:,.0f} requested output tokens "
                    f"({100 * got / want:.0f}%): some requests ended early; kept (>= 90%), tok/s slightly low",
                )
            )
        if sp.failed:
            found.append(Flag(FlagCode.SPEED_POINT_FAILED, "", f"speed point {label}: {sp.failed:g} failed requests"))
        diff = sp.vllm_max_rel_diff
        if diff is not None and diff > point_checks.VLLM_AGREEMENT_TOLERANCE:
            found.append(
                Flag(
                    FlagCode.PERCENTILE_DISAGREEMENT,
                    "",
                    f"speed point {label}: latency percentiles recomputed from the per-request data differ from "
                    f"vLLM's own by up to {100 * diff:.1f}%: the recomputed ones are reported",
                )
            )
    if not points:
        return {"mode": mode, "points": []}, found, ["no valid speed results" if raw else "no speed results"]
    low = points[0]
    tpot = low.get("tpot_ms_p50") or low.get("itl_ms_p50")
    ceiling = capacity.sustained_ceiling(sweep.summarize(raw, mode), mode)
    planned = planned_loads(rec)
    missing = missing_levels(planned, points)
    above = [load for load in missing if load > points[-1]["load"]]

    def labels(loads: list[float]) -> list[str]:
        return [load_label({"load": x, "concurrency": x}, mode) for x in loads]

    if above and ceiling["kind"] == "closed_loop_max":
        # the sweep stopped before its highest concurrencies (a job interrupted mid-sweep): the best measured
        # level is a floor under the server's capacity, not its ceiling
        ceiling = {**ceiling, "kind": "lower_bound"}
    if missing:
        found.append(
            Flag(
                FlagCode.SWEEP_INCOMPLETE,
                "",
                f"speed: no valid point at {', '.join(labels(missing))} of the planned sweep "
                f"({', '.join(labels(planned))})"
                + (
                    f"{_stopped_why(rec)}: "
                    + ("its ceiling is a lower bound, and " if ceiling["kind"] == "lower_bound" else "")
                    + "no speedup at saturation is claimed against it or from it"
                    if above
                    else ""
                ),
            )
        )
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
        "ceiling_basis": ceiling.get("basis"),  # steady_window | whole_run | mixed (over its repeats) | None
        # the ceiling level's whole-run output tok/s (median, [min, max]): what two ceilings of different bases
        # are compared on (review.verdict.speedups)
        "ceiling_whole_run_tok_s": ceiling.get("whole_run_tok_s"),
        "ceiling_whole_run_tok_s_range": (
            [ceiling["whole_run_tok_s_min"], ceiling["whole_run_tok_s_max"]] if ceiling.get("whole_run_tok_s") else None
        ),
        "saturation_label": (
            load_label({**ceiling, "load": sweep_plan.load_of(ceiling, mode)}, mode)
            if ceiling["kind"] != "none"
            else None
        ),
        "repeats": max(p["repeats"] for p in points),
        # planned load levels without a valid point ("concurrency 64", ...), and those above the last one measured
        "missing_levels": labels(missing),
        "stopped_before": labels(above),
    }
    out["p99_slo_max_rps"], out["p99_slo_max_how"] = p99_slo_max_rps(points, rc)
    by_load = level_goodput(rec, mode, rc)
    for p in points:
        p["goodput"] = by_load.get(p["load"])
    at, how = load_point(mode, points, rc)
    out["goodput_rps"], out["goodput_how"] = goodput_at(at, rc)
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
                "goodput",
            )
        }
        if at
        else None
    )
    return out, found, []
