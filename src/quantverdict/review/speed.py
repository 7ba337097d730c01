"""The speed number of a scorecard (:class:`quantverdict.review.document.Speed`): sweep points per load level
(median over valid repeats), ceiling, goodput and latency at the stated load.

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
from quantverdict.results.record import JobRecord, SweepPoint
from quantverdict.review import document as doc
from quantverdict.review.flags import Flag, FlagCode

NO_PER_REQUEST = "no per-request data in this record"

SHORT_OUTPUT_TOLERANCE = 0.99  # a speed point whose output tokens are < 99% of those requested is flagged

# metrics whose min/max over the valid repeats of a load level are kept next to the median (``tpot_ms_p50``: the
# first screen's speed ratio and its repeat range)
SPREAD_KEYS = tuple(
    "achieved_rps output_tok_s throughput_rps throughput_tok_s ttft_ms_p99 itl_ms_p50 itl_ms_p99 e2e_ms_p50 "
    "tpot_ms_p50".split()
)
# the medians a review point keeps (:class:`quantverdict.review.document.SpeedPoint`)
MEDIANS = tuple(
    "achieved_rps output_tok_s ttft_ms_p50 ttft_ms_p99 itl_ms_p50 itl_ms_p99 tpot_ms_p50 tpot_ms_p99 e2e_ms_p50 "
    "e2e_ms_p99 e2e_ms_mean completed failed output_tokens_total output_tokens_requested".split()
)

Point = doc.SpeedPoint | doc.AtLoad


def _finite(v: Any) -> float | None:
    """A finite number as float; None for anything else (None, NaN, infinity, a bool)."""
    return float(v) if is_number(v) and math.isfinite(v) else None


def _minmax(lo: Any, hi: Any) -> doc.MinMax | None:
    a, b = _finite(lo), _finite(hi)
    return None if a is None or b is None else doc.MinMax(min=a, max=b)


def level_label(load: float, mode: str) -> str:
    """A load level as text: ``concurrency 16``, ``2 req/s``, ``unlimited rate``."""
    if mode == "concurrency":
        return f"concurrency {load:g}"
    return "unlimited rate" if math.isinf(load) else f"{load:g} req/s"


def load_label(p: dict[str, Any], mode: str) -> str:
    """:func:`level_label` of a point given as a dict (its ``load``, else its concurrency or offered rate)."""
    return level_label(float(p["load"]) if "load" in p else sweep_plan.load_of(p, mode), mode)


def workload(rec: JobRecord) -> doc.Workload:
    """The request shape of a record's sweep, from ``config.bench`` (a JSON object: the record keeps the resolved
    config untyped). A speedup holds for one shape: schemes are compared only with a baseline of the same shape."""
    bench = rec.cfg("bench")
    name, n_in, n_out = bench.get("name"), bench.get("input_len"), bench.get("output_len")
    if is_number(n_in) and is_number(n_out):
        shape = f"{int(float(n_in)):,} in / {int(float(n_out)):,} out tokens per request"
    else:
        shape = "request shape not recorded"
    text = shape + (f" (bench={name})" if name else "")
    return doc.Workload.model_validate({"bench": name, "input_len": n_in, "output_len": n_out, "text": text})


def workload_shape(w: doc.Workload | None) -> tuple[int, int] | None:
    """``(input_len, output_len)`` tokens per request; None where not recorded."""
    return None if w is None or w.input_len is None or w.output_len is None else (w.input_len, w.output_len)


def shape_of(speed: doc.Speed) -> tuple[int, int] | None:
    """The request shape of a scorecard's sweep; None without points or a recorded shape."""
    return workload_shape(speed.workload) if speed.points else None


def raw_points(rec: JobRecord) -> tuple[str, list[dict[str, Any]]]:
    """The sweep's mode and its points as recorded (dicts, repeats apart), a too-short steady window set aside
    (:func:`quantverdict.measure.bench_result.rebase_steady`)."""
    return sweep_mode(rec), [bench_result.rebase_steady(p.to_dict()) for p in rec.speed.points]


def sweep_mode(rec: JobRecord) -> str:
    """``speed.mode``, else ``config.bench.mode``, else ``rate``."""
    return str(rec.speed.mode or rec.cfg("bench").get("mode") or "rate")


def _levels(raw: list[dict[str, Any]], mode: str) -> list[aggregate.Level]:
    """The load levels with a valid repeat, by load."""
    levels = aggregate.levels(raw, lambda p: sweep_plan.load_of(p, mode), point_checks.point_valid)
    return [level for level in levels if level.valid]


def speed_points(rec: JobRecord) -> tuple[str, list[doc.SpeedPoint]]:
    """The sweep's mode and one point per load level, by load: the median of each of :data:`MEDIANS` over the
    level's valid repeats (:func:`quantverdict.measure.validity.point_valid`), ``spread`` ([min, max]) of
    :data:`SPREAD_KEYS`, and ``saturated``: most valid repeats' stored decision
    (:func:`quantverdict.measure.validity.point_saturation`)."""
    mode, raw = raw_points(rec)
    out = []
    for level in _levels(raw, mode):
        agg = aggregate.median_point(level.valid)
        spread = {k: r for k, v in aggregate.ranges(level.valid, SPREAD_KEYS).items() if (r := _minmax(*v))}
        fields: dict[str, Any] = {k: _finite(agg[k]) if k in agg else None for k in MEDIANS}
        votes = (point_checks.point_saturation(q)["saturated"] for q in level.valid)
        fields |= {"label": level_label(level.load, mode), "load": level.load, "saturated": aggregate.majority(votes)}
        fields |= {"valid_repeats": len(level.valid), "repeats": len(level.points), "spread": spread}
        out.append(doc.SpeedPoint.model_validate(fields))
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


def ceiling_is_floor(speed: doc.Speed) -> bool:
    """Whether a scorecard's ceiling is a lower bound (no point saturated, or the sweep stopped early)."""
    return speed.ceiling is not None and speed.ceiling.lower_bound


def _stopped_why(rec: JobRecord) -> str:
    """`` (job interrupted in stage benchmark)`` for an unfinished record, else ``""``."""
    status, stage = rec.status, rec.failed_stage
    if status in (None, "ok"):
        return ""
    return f" (job {status}" + (f" in stage {stage})" if stage else ")")


def slo_ok(p: Point, rc: ReviewConfig) -> bool | None:
    """Whether a point's TTFT p99 and ITL p99 meet the SLO; None when a needed value is missing."""
    ok = True
    for v, limit in ((p.ttft_ms_p99, rc.ttft_ms_p99), (p.itl_ms_p99, rc.itl_ms_p99)):
        if limit is None:
            continue
        if v is None:
            return None
        ok = ok and v <= limit
    return ok


def load_point(mode: str, points: list[doc.SpeedPoint], rc: ReviewConfig) -> tuple[doc.SpeedPoint | None, str]:
    """The point that stands for the stated load, and how it was chosen: rate sweep, the smallest rate >=
    ``load_rps`` (else the unlimited rate); concurrency sweep, the smallest concurrency reaching ``load_rps`` req/s
    or >= ``load_concurrency``; no load stated, the lowest load."""
    if not points:
        return None, "no speed points"
    if rc.load_rps is None and rc.load_concurrency is None:
        return points[0], f"no load stated: lowest measured load ({points[0].label})"
    if mode == "rate":
        if rc.load_rps is None:
            return None, "the sweep is open-loop (rates); a concurrency load needs bench.mode=concurrency"
        above = [p for p in points if p.load >= rc.load_rps - 1e-9]
        if not above:
            return None, f"no measured rate >= {rc.load_rps:g} req/s"
        p = above[0]
        nearest = f" (nearest measured rate above {rc.load_rps:g} req/s)"
        return p, p.label + ("" if p.load == rc.load_rps else nearest)
    if rc.load_concurrency is not None:
        above = [p for p in points if p.load >= rc.load_concurrency]
        if not above:
            return None, f"no measured concurrency >= {rc.load_concurrency}"
        return above[0], above[0].label
    rps = rc.load_rps or 0.0
    reach = [p for p in points if (p.achieved_rps or 0) >= rps]
    if not reach:
        return None, f"no measured concurrency reaches {rps:g} req/s"
    return reach[0], f"{reach[0].label} (the lowest concurrency reaching {rps:g} req/s)"


def p99_slo_max_rps(points: list[doc.SpeedPoint], rc: ReviewConfig) -> tuple[float | None, str]:
    """Achieved req/s at the highest sustained load (finite rate or concurrency) whose TTFT p99 and ITL p99
    meet the SLO, every lower load meeting them too; 0.0 when the lowest fails, None without an SLO or a sustained
    load. Not goodput: the p99s are separate percentiles."""
    if rc.ttft_ms_p99 is None and rc.itl_ms_p99 is None:
        return None, "no latency SLO set"
    held = [p for p in points if math.isfinite(p.load)]
    if not held:
        return None, "no sustained load measured (only the unlimited-rate burst)"
    best: doc.SpeedPoint | None = None
    for p in held:
        if not slo_ok(p, rc):
            break
        best = p
    if best is None:
        return 0.0, f"the SLO fails at the lowest load ({held[0].label})"
    return float(best.achieved_rps or 0.0), f"at {best.label}"


def slo_of(rc: ReviewConfig) -> Slo:
    """The per-request objectives: TTFT <= ``ttft_ms_p99``, TPOT <= ``itl_ms_p99``, E2E <= ``e2e_ms`` (those set)."""
    return Slo(ttft_ms=rc.ttft_ms_p99, tpot_ms=rc.itl_ms_p99, e2e_ms=rc.e2e_ms)


def result_file(rec: JobRecord, p: SweepPoint) -> Path | None:
    """The ``--save-detailed`` result file of point ``p``: beside the record first (``bench/<name>``, ``<name>``:
    a copied record reads its own copy, not a path of another machine), else where the job wrote it; None when
    none exists."""
    if not p.result_file:
        return None
    name, here = Path(p.result_file), rec.source_dir
    candidates = [Path(here) / "bench" / name.name, Path(here) / name.name] if here else []
    return next((c for c in [*candidates, name] if c.is_file()), None)


def point_goodput(rec: JobRecord, p: SweepPoint, slo: Slo) -> dict[str, Any] | None:
    """Goodput of one point (:meth:`quantverdict.measure.goodput.Goodput.to_dict`); None without per-request
    data."""
    path = result_file(rec, p)
    if path is None:
        return None
    try:
        return request_goodput(json.loads(path.read_text()), slo).to_dict()
    except (OSError, ValueError, KeyError):
        return None


def level_goodput(rec: JobRecord, mode: str, rc: ReviewConfig) -> dict[float, doc.Goodput]:
    """Per load level with per-request data in every valid repeat: the medians of goodput (req/s) and SLO
    attainment (%), the sums of good and judged requests and of the requests over each objective."""
    slo = slo_of(rc)
    if not slo.objectives():
        return {}
    _, raw = raw_points(rec)
    with_g = [{**q, "_goodput": point_goodput(rec, sp, slo)} for sp, q in zip(rec.speed.points, raw)]
    out: dict[float, doc.Goodput] = {}
    for level in _levels(with_g, mode):
        gs = [q["_goodput"] for q in level.valid]
        if any(g is None for g in gs):
            continue
        missed: dict[str, int] = {}
        for g in gs:
            for k, v in g["slo_missed"].items():
                missed[k] = missed.get(k, 0) + v
        out[level.load] = doc.Goodput(
            goodput_rps=statistics.median(g["goodput_rps"] for g in gs),
            slo_attainment_pct=statistics.median(g["slo_attainment_pct"] for g in gs),
            good_requests=sum(g["good_requests"] for g in gs),
            slo_requests=sum(g["slo_requests"] for g in gs),
            repeats=len(gs),
            slo_missed=missed,
        )
    return out


def goodput_at(at: doc.SpeedPoint | None, rc: ReviewConfig) -> tuple[float | None, str]:
    """Goodput at the stated load's point (req/s) and how it was counted; None without an SLO, a point or
    per-request data."""
    if not slo_of(rc).objectives():
        return None, "no latency SLO set"
    if at is None:
        return None, "no point at the stated load"
    g = at.goodput
    if g is None:
        return None, f"{NO_PER_REQUEST} (no --save-detailed result file beside it): not counted per request"
    reps = f", median of {g.repeats} repeats" if g.repeats > 1 else ""
    return g.goodput_rps, (
        f"at {at.label}: {g.good_requests} of {g.slo_requests} requests met the SLO ({g.slo_attainment_pct:.1f}%{reps})"
    )


def point_label(p: dict[str, Any], mode: str) -> str:
    """A raw point's load as text, its repeat after the first: ``1 req/s (repeat 1)``."""
    lbl = level_label(sweep_plan.load_of(p, mode), mode)
    return f"{lbl} (repeat {p['repeat']})" if p.get("repeat") else lbl


def _point_flags(sp: SweepPoint, q: dict[str, Any], mode: str) -> list[Flag]:
    """The honesty flags of one recorded point ``sp`` (``q``: the same as a dict, its steady window rebased)."""
    label = point_label(q, mode)
    want, got = sp.output_tokens_requested, sp.output_tokens_total
    pct = 100 * got / want if want and got is not None else None
    tokens = f"speed point {label}: {got or 0:,.0f} of {want or 0:,.0f} requested output tokens ({pct or 0:.0f}%)"
    short = bool(want and got is not None and got < point_checks.OUTPUT_VALID_FRACTION * want)
    out = []
    if not point_checks.point_valid(q):
        if short:
            msg = f"{tokens}: requests ended early; invalid, left out of every speed number"
            out.append(Flag(FlagCode.SPEED_POINT_SHORT, "", msg))
        others = [r for r in sp.invalid_reasons or [] if "requested output tokens" not in r]
        if others or not short:
            why = "; ".join(others) or "marked invalid"
            msg = f"speed point {label}: invalid ({why}); left out of every speed number"
            out.append(Flag(FlagCode.SPEED_POINT_INVALID, "", msg))
    elif want and got is not None and got < SHORT_OUTPUT_TOLERANCE * want:
        msg = f"{tokens}: some requests ended early; kept (>= 90%), tok/s slightly low"
        out.append(Flag(FlagCode.SPEED_POINT_SHORT_KEPT, "", msg))
    if sp.failed:
        out.append(Flag(FlagCode.SPEED_POINT_FAILED, "", f"speed point {label}: {sp.failed:g} failed requests"))
    diff = sp.vllm_max_rel_diff
    if diff is not None and diff > point_checks.VLLM_AGREEMENT_TOLERANCE:
        msg = (
            f"speed point {label}: latency percentiles recomputed from the per-request data differ from vLLM's own "
            f"by up to {100 * diff:.1f}%: the recomputed ones are reported"
        )
        out.append(Flag(FlagCode.PERCENTILE_DISAGREEMENT, "", msg))
    return out


def _roofline(rec: JobRecord) -> doc.Roofline | None:
    """The record's ``speed.roofline`` (a JSON object its measure function owns), non-finite numbers as None."""
    roof = rec.speed.roofline or {}
    finite = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in roof.items()}
    return (
        doc.Roofline.model_validate({k: v for k, v in finite.items() if k in doc.Roofline.model_fields})
        if roof
        else None
    )


def _ceiling(raw: list[dict[str, Any]], mode: str, stopped: bool) -> doc.Ceiling:
    """The sustained ceiling (:func:`quantverdict.measure.capacity.sustained_ceiling`); a concurrency sweep that
    ``stopped`` before its highest levels (a job interrupted mid-sweep) has a floor under the server's capacity,
    not its ceiling."""
    c = capacity.sustained_ceiling(sweep.summarize(raw, mode), mode)
    kind = "lower_bound" if stopped and c["kind"] == "closed_loop_max" else str(c["kind"])
    tok, whole = c.get("output_tok_s"), c.get("whole_run_tok_s")
    return doc.Ceiling(
        kind=kind,
        label=None if kind == "none" else level_label(sweep_plan.load_of(c, mode), mode),
        rps=_finite(c.get("rps")),
        output_tok_s=_finite(tok),
        output_tok_s_range=_minmax(c["output_tok_s_min"], c["output_tok_s_max"]) if tok else None,
        whole_run_output_tok_s=_finite(whole),
        whole_run_output_tok_s_range=_minmax(c["whole_run_tok_s_min"], c["whole_run_tok_s_max"]) if whole else None,
        repeats=c.get("repeats"),
        basis=c.get("basis"),  # steady_window | whole_run | mixed (over its repeats) | None
        lower_bound=kind == "lower_bound",
    )


def speed_summary(rec: JobRecord, rc: ReviewConfig) -> tuple[doc.Speed, list[Flag], list[str]]:
    """Single-stream speed (lowest load: ITL p50, ``1000 / TPOT p50`` tok/s), sustained ceiling
    (:func:`quantverdict.measure.capacity.sustained_ceiling`), goodput at the load, ``p99_slo_max_rps``, and latency at
    the load; every number a median over the valid repeats of its level (:func:`speed_points`). The kernel and the
    comparability with the baseline are left to the caller (``comparable`` True, no kernel).

    Returns:
        ``(speed, flags, missing)``.
    """
    mode, points = speed_points(rec)
    _, raw = raw_points(rec)
    found = [f for sp, q in zip(rec.speed.points, raw) for f in _point_flags(sp, q, mode)]
    speed = doc.Speed.unmeasured(mode)
    speed.workload, speed.roofline, speed.points = workload(rec), _roofline(rec), points
    speed.repeats = max((p.repeats for p in points), default=None)
    if not points:
        return speed, found, ["no valid speed results" if raw else "no speed results"]
    low = points[0]
    tpot = low.tpot_ms_p50 or low.itl_ms_p50
    speed.low_load = doc.LowLoad(
        label=low.label,
        itl_ms_p50=low.itl_ms_p50,
        itl_ms_p50_range=low.spread.get("itl_ms_p50"),
        output_tok_s_per_request=1000.0 / tpot if tpot else None,
    )
    planned = planned_loads(rec)
    missing = [load for load in planned if load not in {p.load for p in points}]
    above = [load for load in missing if load > points[-1].load]
    speed.ceiling = _ceiling(raw, mode, bool(above))
    speed.missing_levels = [level_label(x, mode) for x in missing]  # planned levels without a valid point
    speed.stopped_before = [level_label(x, mode) for x in above]  # ... and those above the last one measured
    if missing:
        why = (
            f"{_stopped_why(rec)}: "
            + ("its ceiling is a lower bound, and " if speed.ceiling.lower_bound else "")
            + "no speedup at saturation is claimed against it or from it"
            if above
            else ""
        )
        plan = ", ".join(level_label(x, mode) for x in planned)
        msg = f"speed: no valid point at {', '.join(speed.missing_levels)} of the planned sweep ({plan}){why}"
        found.append(Flag(FlagCode.SWEEP_INCOMPLETE, "", msg))
    speed.p99_slo_max_rps, speed.p99_slo_max_how = p99_slo_max_rps(points, rc)
    by_load = level_goodput(rec, mode, rc)
    for p in points:
        p.goodput = by_load.get(p.load)
    at, speed.load_how = load_point(mode, points, rc)
    speed.goodput_rps, speed.goodput_how = goodput_at(at, rc)
    if at is not None:
        speed.at_load = doc.AtLoad.model_validate({k: getattr(at, k) for k in doc.AtLoad.model_fields})
    return speed, found, []
