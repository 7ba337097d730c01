"""The speed number of a scorecard: sweep points per load level (median over valid repeats), ceiling, goodput
(per request, :mod:`quantverdict.measure.goodput`) and latency at the stated load.

Goodput is read from each sweep point's ``vllm bench serve --save-detailed`` result file (the record's
``speed.points[i].result_file``, or the file of that name in ``bench/`` beside the record); a record whose
files are not there has no per-request data, and the review says so instead of estimating it.
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
from quantverdict.review import flags
from quantverdict.review.flags import Flag

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
    """The request shape a record's sweep ran: ``{"bench", "input_len", "output_len", "text"}`` from its
    ``config.bench`` (tokens per request; ``text`` e.g. ``"2,048 in / 128 out tokens per request
    (bench=gpu-concurrency-prefill)"``). Speedups hold for one shape only: the prefill share of the work moves
    the crossover (issue #16), so a scheme is compared only with a baseline swept at the same shape."""
    bench = rec.cfg("bench")
    name, n_in, n_out = bench.get("name"), bench.get("input_len"), bench.get("output_len")
    if is_number(n_in) and is_number(n_out):
        shape = f"{int(float(n_in)):,} in / {int(float(n_out)):,} out tokens per request"
    else:
        shape = "request shape not recorded"
    return {"bench": name, "input_len": n_in, "output_len": n_out, "text": shape + (f" (bench={name})" if name else "")}


def shape_of(speed: dict[str, Any]) -> tuple[Any, Any] | None:
    """``(input_len, output_len)`` of a scorecard's ``speed.workload`` (:func:`workload`); None when the sweep
    has no points or its shape was not recorded (no shape to compare)."""
    w = speed.get("workload") or {}
    if not speed.get("points") or w.get("input_len") is None or w.get("output_len") is None:
        return None
    return (w["input_len"], w["output_len"])


def raw_points(rec: JobRecord) -> tuple[str, list[dict[str, Any]]]:
    """The sweep's mode (``rate`` unless the record says ``concurrency``) and its points as the record holds
    them (dicts, for :mod:`quantverdict.measure.sweep`), a steady window too short to trust set aside in records
    measured before that rule (:func:`quantverdict.measure.bench_result.rebase_steady`)."""
    return sweep_mode(rec), [bench_result.rebase_steady(p.to_dict()) for p in rec.speed.points]


def sweep_mode(rec: JobRecord) -> str:
    """``speed.mode``, else the config's ``bench.mode`` (records that did not write it), else ``rate``."""
    return str(rec.speed.mode or rec.cfg("bench").get("mode") or "rate")


def speed_points(rec: JobRecord) -> tuple[str, list[dict[str, Any]]]:
    """The sweep points of a record, one per load level, sorted by load.

    Invalid points (:func:`quantverdict.measure.point_checks.point_valid`: output tokens under 90% of those requested,
    a wrong request count, ITL lists that are not gaps after the first token) are left out; a level
    with no valid repeat is left out. Each number is the **median** over the level's valid repeats;
    ``spread[metric] = [min, max]`` for ``SPREAD_KEYS``; ``load`` (req/s or concurrency, inf for an
    unlimited rate), ``repeats``, ``valid_repeats`` and ``saturated`` (most valid repeats saturated, by each
    point's stored decision: :func:`quantverdict.measure.validity.point_saturation`) are added.
    """
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
    """The load levels the job's config planned (``bench.concurrencies`` in closed loop, ``bench.rates`` in open
    loop, ``inf`` for an unlimited rate), ascending, as :func:`quantverdict.measure.sweep_plan.load_of` keys them;
    ``[]`` when the record keeps no sweep plan (older or hand-made records: nothing is called missing)."""
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
    """The planned load levels (:func:`planned_loads`) with no valid point among ``points`` (one per level, from
    :func:`speed_points`): a job stopped mid-sweep, or levels whose every repeat was invalid. Ascending."""
    have = {float(p["load"]) for p in points}
    return [load for load in planned if load not in have]


def ceiling_is_floor(speed: dict[str, Any]) -> bool:
    """Whether a scorecard's ceiling (:func:`speed_summary`) is a lower bound: no point saturated, or the sweep
    stopped before its planned top loads; its cost at the ceiling is then an upper bound."""
    return speed.get("ceiling_kind") == "lower_bound"


def _stopped_why(rec: JobRecord) -> str:
    """`` (job interrupted in stage benchmark)`` for a record that did not finish, else ``""``."""
    status, stage = rec.status, rec.failed_stage
    if status in (None, "ok"):
        return ""
    return f" (job {status}" + (f" in stage {stage})" if stage else ")")


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


def p99_slo_max_rps(points: list[dict[str, Any]], rc: ReviewConfig) -> tuple[float | None, str]:
    """Throughput at the highest sustained load whose p99s meet the SLO: the achieved req/s at the highest
    load whose TTFT p99 and ITL p99 (each computed over all its requests) meet the limits, every lower load
    meeting them too. Not goodput (a per-request count, :func:`level_goodput`): the p99s are separate
    percentiles, so a request can miss one objective and another request the other.

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


def slo_of(rc: ReviewConfig) -> Slo:
    """The per-request objectives: TTFT <= ``ttft_ms_p99``, TPOT (a request's mean ITL) <= ``itl_ms_p99``,
    E2E <= ``e2e_ms`` (each only when set)."""
    return Slo(ttft_ms=rc.ttft_ms_p99, tpot_ms=rc.itl_ms_p99, e2e_ms=rc.e2e_ms)


def result_file(rec: JobRecord, p: dict[str, Any]) -> Path | None:
    """The ``--save-detailed`` result file of sweep point ``p``: where the job wrote it, else ``bench/<name>``
    or ``<name>`` beside the record it was read from (:attr:`JobRecord.source_dir`); None when none is found."""
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
    """:meth:`quantverdict.measure.goodput.Goodput.to_dict` of one sweep point, or None without per-request data
    (no result file, or one without the ``--save-detailed`` lists)."""
    path = result_file(rec, p)
    if path is None:
        return None
    try:
        return request_goodput(json.loads(path.read_text()), slo).to_dict()
    except (OSError, ValueError, KeyError):
        return None


def level_goodput(rec: JobRecord, mode: str, rc: ReviewConfig) -> dict[float, dict[str, Any]]:
    """Per-request goodput of each load level with per-request data in every valid repeat.

    Returns:
        ``{load: {"goodput_rps", "slo_attainment_pct" (medians over the valid repeats), "good_requests",
        "slo_requests" (sums), "repeats", "slo_missed" ({objective: sum})}}``; a level missing data is absent.
    """
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
    """Goodput at the stated load's point (its ``goodput`` from :func:`level_goodput`), and how it was counted.

    Returns:
        ``(req/s, how)``: e.g. ``(0.4, "at 1 req/s: 4 of 8 requests met the SLO (50.0%)")``; None with no
        SLO set, no load point, or no per-request data (``how`` says which).
    """
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
    """One raw sweep point's load as text, with its repeat after the first: ``1 req/s (repeat 1)``."""
    lbl = load_label({**p, "load": sweep_plan.load_of(p, mode)}, mode)
    return f"{lbl} (repeat {p['repeat']})" if p.get("repeat") else lbl


def speed_summary(rec: JobRecord, rc: ReviewConfig) -> tuple[dict[str, Any], list[Flag], list[str]]:
    """Single-stream speed, sustained ceiling, goodput under the SLO, and latency at the stated load.

    * single stream: the lowest-load point; ITL p50 and ``1000 / TPOT p50`` tok/s per request;
    * ceiling: :func:`quantverdict.measure.capacity.sustained_ceiling` (open loop: the highest median achieved
      req/s over the valid levels, so never under a rate achieved nor under the goodput; median over repeats with
      its min-max range; invalid points never count);
    * goodput (``goodput_rps``, ``goodput_how``): requests meeting every objective per second at the stated
      load (:func:`goodput_at`; each level's in ``points[i]["goodput"]``), None without per-request data;
    * ``p99_slo_max_rps``: :func:`p99_slo_max_rps`, throughput at the highest load whose p99s meet the SLO
      (the number this review called "goodput" before issue #14);
    * saturation: each point's stored decision (:func:`quantverdict.measure.validity.point_saturation`), as the
      live log, the record and the grid table read it.

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
                flags.SWEEP_INCOMPLETE,
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
