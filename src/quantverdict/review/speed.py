"""A scorecard's speed (:class:`quantverdict.review.document.Speed`): per load level the median over valid repeats,
ceiling, goodput (per request, from each point's ``--save-detailed`` file) and latency at the stated load."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from quantverdict.config.schema import ReviewConfig
from quantverdict.measure import aggregate, bench_result, capacity, sweep, sweep_plan
from quantverdict.measure import validity as point_checks
from quantverdict.measure.goodput import Goodput, Slo
from quantverdict.measure.goodput import goodput as request_goodput
from quantverdict.measure.points import HostWindow
from quantverdict.results.record import JobRecord, SweepPoint
from quantverdict.review import document as doc
from quantverdict.review.document import Flag, finite
from quantverdict.review.flags import FlagCode
from quantverdict.review.words import say

NO_PER_REQUEST = "no per-request data in this record"

SHORT_OUTPUT_TOLERANCE = 0.99  # a speed point whose output tokens are < 99% of those requested is flagged
# a loaded window (concurrency > 1, or a saturated rate) whose GPU ran no kernel in more than this share of its samples
# is flagged: requests were waiting, so the idle time is the host's (scheduler, API server, client), not the load's
GPU_IDLE_SHARE = 0.02
# which host process held such a window back, read from its host samples taken while the GPU idled (medians, percent of
# one core): vLLM's API server process at a full core (its event loop is one Python thread) while the engine core
# waits means the front end (HTTP, tokenization, streaming the outputs) had not handed the engine its next requests;
# the sweep client at a full core with the API server below it, the client
FULL_CORE_PCT = 90.0
WAITING_CORE_PCT = 10.0
# NVML's clocks-event reasons that slow the GPU below its power limit's clock: heat and hardware slowdowns (the power
# limit itself, sw_power_cap, is the normal state of a saturated GPU; its clock is in the energy table)
SLOWDOWNS = {"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
# metrics whose min/max over a level's valid repeats are kept next to the median
SPREAD_KEYS = tuple(
    "achieved_rps output_tok_s throughput_rps throughput_tok_s ttft_ms_p99 itl_ms_p50 itl_ms_p99 e2e_ms_p50 "
    "tpot_ms_p50".split()
)
MEDIANS = tuple(
    "achieved_rps output_tok_s ttft_ms_p50 ttft_ms_p99 itl_ms_p50 itl_ms_p99 tpot_ms_p50 tpot_ms_p99 e2e_ms_p50 "
    "e2e_ms_p99 e2e_ms_mean completed failed output_tokens_total output_tokens_requested".split()
)


def _minmax(lo: Any, hi: Any) -> doc.MinMax | None:
    a, b = finite(lo), finite(hi)
    return None if a is None or b is None else doc.MinMax(min=a, max=b)


def level_label(load: float, mode: str) -> str:
    """A load level as text: ``concurrency 16``, ``2 req/s``, ``unlimited rate``."""
    if mode == "concurrency":
        return f"concurrency {load:g}"
    return "unlimited rate" if math.isinf(load) else f"{load:g} req/s"


def _lengths(points: list[SweepPoint], key: str) -> str | None:
    """``p50 X (p1 A, p99 B)`` tokens of the points' ``input_len_dist`` or ``output_len_dist`` (each statistic the
    median over the points); None where no point has it."""
    dists = [d for p in points if (d := getattr(p, key)) is not None]
    stats = {s: [v for d in dists if (v := getattr(d, s)) is not None] for s in ("p1", "p50", "p99")}
    if not all(stats.values()):
        return None
    med = {s: statistics.median(v) for s, v in stats.items()}
    return f"p50 {med['p50']:,.0f} (p1 {med['p1']:,.0f}, p99 {med['p99']:,.0f})"


def workload_text(rec: JobRecord) -> str | None:
    """What a sweep sent when it was not vLLM's random prompts (``speed.workload``), with the prompt and output
    lengths actually sent (:func:`_lengths`); None for the random prompts (the fixed shape says it all)."""
    w = rec.speed.workload
    if w is None or w.kind in (None, "random"):
        return None
    if w.kind == "shared_prefix":
        what = (
            f"shared-prefix prompts of {w.input_len:,} tokens, the first {w.prefix_len:,} shared by each group "
            f"({w.num_prefixes} prefix{'es' if (w.num_prefixes or 0) > 1 else ''})"
        )
    elif w.kind == "text":
        what = f"WikiText-2 test paragraphs of {w.min_words}-{w.max_words} words ({w.prompts:,} prompts)"
    else:
        digest = f", sha256 {w.sha256[:12]}" if w.sha256 else ""
        what = f"prompts of {Path(w.source or '').name} ({w.prompts:,} lines{digest})"
    ins = _lengths(rec.speed.points, "input_len_dist")
    outs = _lengths(rec.speed.points, "output_len_dist")
    lengths = f"{ins or '?'} in / {outs or w.output_len or '?'} out tokens per request"
    return f"{what}: {lengths}"


def workload(rec: JobRecord) -> doc.Workload:
    """The request shape of a record's sweep, from ``config.bench``; a sweep of another dataset than vLLM's random
    prompts (``speed.workload``) is named with the prompt and output lengths it sent (:func:`workload_text`)."""
    b = rec.cfg.bench
    shape = "request shape not recorded"
    if b.input_len is not None and b.output_len is not None:
        shape = f"{b.input_len:,} in / {b.output_len:,} out tokens per request"
    shape = workload_text(rec) or shape
    text = shape + (f" (bench={b.name})" if b.name else "")
    return doc.Workload(bench=b.name, input_len=b.input_len, output_len=b.output_len, text=text)


def shape_of(w: doc.Workload | None) -> tuple[int, int] | None:
    """``(input_len, output_len)`` tokens per request; None where not recorded."""
    return None if w is None or w.input_len is None or w.output_len is None else (w.input_len, w.output_len)


def raw_points(rec: JobRecord) -> tuple[str, list[SweepPoint]]:
    """The sweep's mode (``speed.mode``, else ``config.bench.mode``, else rate) and its steady-window-rebased points."""
    mode = str(rec.speed.mode or rec.cfg.bench.mode or "rate")
    return mode, [bench_result.rebase_steady(p) for p in rec.speed.points]


def speed_points(
    mode: str, raw: list[SweepPoint], rec: JobRecord | None = None, slo: Slo | None = None
) -> list[doc.SpeedPoint]:
    """One point per load level of the raw points (:func:`raw_points`): medians, spread, majority ``saturated`` and,
    with ``rec`` and an ``slo`` that has objectives, goodput (:func:`_goodput`)."""
    out = []
    for level in aggregate.levels(raw, lambda p: p.load(mode), point_checks.point_valid):
        if not level.valid:
            continue
        spread = {k: r for k, v in aggregate.ranges(level.valid, SPREAD_KEYS).items() if (r := _minmax(*v))}
        fields: dict[str, Any] = {k: finite(v) for k, v in aggregate.medians(level.valid, MEDIANS).items()}
        votes = (point_checks.point_saturation(q)["saturated"] for q in level.valid)
        fields |= {"label": level_label(level.load, mode), "load": level.load, "saturated": aggregate.majority(votes)}
        fields |= {"valid_repeats": len(level.valid), "repeats": len(level.points), "spread": spread}
        energy = [e for q in level.valid if q.gpu and (e := q.gpu.energy_per_output_token_j) is not None]
        fields["energy_per_output_token_j"] = statistics.median(energy) if energy else None
        fields["goodput"] = _goodput(rec, level.valid, slo) if rec and slo and slo.objectives() else None
        out.append(doc.SpeedPoint.model_validate(fields))
    return out


def _planned_loads(rec: JobRecord, mode: str) -> list[float]:
    """The load levels ``config.bench`` planned, ascending (inf: unlimited); [] without a plan, or where a capacity
    search chose the loads (``speed.searches``)."""
    bench = rec.cfg.bench
    if rec.speed.searches:
        return []
    try:
        plan = sweep_plan.plan(mode, list(bench.rates or []), list(bench.concurrencies or []), 1)
    except (TypeError, ValueError):
        return []
    return sorted({sweep_plan.load_of(vars(q), mode) for q in plan})


def slo_ok(p: doc.SpeedPoint | doc.AtLoad, rc: ReviewConfig) -> bool | None:
    """Whether a point's TTFT p99 and ITL p99 meet the SLO; None when a needed value is missing."""
    pairs = [(v, lim) for v, lim in ((p.ttft_ms_p99, rc.ttft_ms_p99), (p.itl_ms_p99, rc.itl_ms_p99)) if lim is not None]
    return None if any(v is None for v, _ in pairs) else all(v is not None and v <= lim for v, lim in pairs)


def load_point(mode: str, points: list[doc.SpeedPoint], rc: ReviewConfig) -> tuple[doc.SpeedPoint | None, str]:
    """The point of ``points`` (not empty) standing for the stated load (rate, concurrency or lowest), and how."""
    if rc.load_rps is None and rc.load_concurrency is None:
        return points[0], f"no load stated: lowest measured load ({points[0].label})"
    if mode == "rate" and rc.load_rps is None:
        return None, "the sweep is open-loop (rates); a concurrency load needs bench.mode=concurrency"
    if mode == "rate" and rc.load_rps is not None:
        p = next((p for p in points if p.load >= rc.load_rps - 1e-9), None)
        nearest = "" if p is None or p.load == rc.load_rps else f" (nearest measured rate above {rc.load_rps:g} req/s)"
        return p, f"no measured rate >= {rc.load_rps:g} req/s" if p is None else p.label + nearest
    if rc.load_concurrency is not None:
        p = next((p for p in points if p.load >= rc.load_concurrency), None)
        return p, f"no measured concurrency >= {rc.load_concurrency}" if p is None else p.label
    rps = rc.load_rps or 0.0
    if (p := next((p for p in points if (p.achieved_rps or 0) >= rps), None)) is None:
        return None, f"no measured concurrency reaches {rps:g} req/s"
    return p, f"{p.label} (the lowest concurrency reaching {rps:g} req/s)"


def slo_of(rc: ReviewConfig) -> Slo:
    """The per-request objectives: TTFT <= ``ttft_ms_p99``, TPOT <= ``itl_ms_p99``, E2E <= ``e2e_ms`` (those set)."""
    return Slo(ttft_ms=rc.ttft_ms_p99, tpot_ms=rc.itl_ms_p99, e2e_ms=rc.e2e_ms)


def beside(rec: JobRecord, written: str | None, folder: str) -> Path | None:
    """A file the job wrote (``written``) beside the record, in ``folder`` or not, else where written; None when none
    exists. A copied record (docs/results) reads its own copy, not a path of another machine."""
    if not written:
        return None
    name, here = Path(written), rec.source_dir
    candidates = [Path(here) / folder / name.name, Path(here) / name.name] if here else []
    return next((c for c in [*candidates, name] if c.is_file()), None)


def _goodput(rec: JobRecord, valid: list[SweepPoint], slo: Slo) -> doc.Goodput | None:
    """A level's median goodput and summed counts over its valid repeats, from each one's ``--save-detailed`` file;
    None unless every repeat has per-request data."""
    got: list[Goodput] = []
    for p in valid:
        if (path := beside(rec, p.result_file, "bench")) is None:
            return None
        try:
            got.append(request_goodput(json.loads(path.read_text()), slo))
        except (OSError, ValueError, KeyError):
            return None
    return doc.Goodput(
        goodput_rps=statistics.median(g.goodput_rps for g in got),
        slo_attainment_pct=statistics.median(g.attainment_pct for g in got),
        good_requests=sum(g.good for g in got),
        slo_requests=sum(g.sent for g in got),
        repeats=len(got),
        slo_missed={k: sum(g.missed[k] for g in got) for k in slo.objectives()},
    )


def point_label(sp: SweepPoint, mode: str, repeats: int | None = 1) -> str:
    """A recorded point's load as text, with its server start where the job had several and its repeat inside that
    start after the first: ``1 req/s (repeat 1)``, ``concurrency 64 (start 2, repeat 1)``. ``repeats``: the job's
    repeats per start (a later start's points are numbered after the earlier starts', ``orchestrate.starts``)."""
    first = (sp.server_start - 1) * max(1, repeats or 1) if sp.server_start else 0
    where = [f"start {sp.server_start}"] if sp.server_start else []
    where += [f"repeat {sp.repeat - first}"] if sp.repeat and sp.repeat > first else []
    lbl = level_label(sp.load(mode), mode)
    return f"{lbl} ({', '.join(where)})" if where else lbl


def idle_cause(host: HostWindow | None) -> str | None:
    """Which host process held a loaded window's GPU idle, from the medians over the window's GPU-idle host samples
    (``speed.points[i].host.gpu_idle``, percent of one core): ``"api_server"`` (vLLM's API server at >=
    :data:`FULL_CORE_PCT` while its engine core ran <= :data:`WAITING_CORE_PCT`), ``"client"`` (the sweep client at
    >= :data:`FULL_CORE_PCT`, the API server below it), None (no host samples in the GPU's idle time, or neither)."""
    load = host.gpu_idle if host else None
    if load is None or not load.samples:
        return None
    roles = load.server_cpu_pct_median_by_role or {}
    api, engine, client = roles.get("api_server", 0.0), roles.get("engine_core", 0.0), load.client_cpu_pct_median
    if api >= FULL_CORE_PCT and engine <= WAITING_CORE_PCT:
        return "api_server"
    if client is not None and client >= FULL_CORE_PCT:
        return "client"
    return None


def _point_flags(sp: SweepPoint, mode: str, repeats: int | None) -> list[Flag]:
    want, got, diff = sp.output_tokens_requested, sp.output_tokens_total, sp.vllm_max_rel_diff or 0
    pct = 100 * got / want if want and got is not None else None
    short = bool(want and got is not None and got < point_checks.OUTPUT_VALID_FRACTION * want)
    others = [r for r in sp.invalid_reasons or [] if "requested output tokens" not in r]
    valid = point_checks.point_valid(sp)
    g, loaded = sp.gpu, (sp.concurrency or 0) > 1 or bool(sp.saturated)  # a load that leaves no GPU time idle
    slowed = sorted(set(g.throttle_reasons or []) & SLOWDOWNS) if g else []
    kinds = {
        FlagCode.SPEED_POINT_SHORT: not valid and short,
        FlagCode.SPEED_POINT_INVALID: not valid and (others or not short),
        FlagCode.SPEED_POINT_SHORT_KEPT: valid and want and got is not None and got < SHORT_OUTPUT_TOLERANCE * want,
        FlagCode.SPEED_POINT_FAILED: sp.failed,
        FlagCode.PERCENTILE_DISAGREEMENT: diff > point_checks.VLLM_AGREEMENT_TOLERANCE,
        FlagCode.GPU_IDLE: loaded and g and (g.idle_fraction or 0.0) > GPU_IDLE_SHARE,
        FlagCode.GPU_CLOCK: g and (g.drifting or slowed),
    }
    values = {"label": point_label(sp, mode, repeats), "got": got or 0, "want": want or 0, "pct": pct or 0}
    values |= {"why": "; ".join(others) or "marked invalid", "failed": sp.failed, "diff_pct": 100 * diff}
    values |= {"gpu": g, "slowed": slowed, "cause": idle_cause(sp.host)}
    values |= {"idle_load": sp.host.gpu_idle if sp.host else None}
    return [Flag.new(code, say("point_flag", "speed.j2", kind=code, **values)) for code, on in kinds.items() if on]


def _roofline(rec: JobRecord) -> doc.Roofline | None:
    """``speed.roofline``, non-finite numbers as None."""
    if not (roof := rec.speed.roofline):
        return None
    known = {k: v for k, v in roof.items() if k in doc.Roofline.model_fields}
    return doc.Roofline.model_validate({k: finite(v) if isinstance(v, float) else v for k, v in known.items()})


def _ceiling(raw: list[SweepPoint], mode: str, stopped: bool) -> doc.Ceiling:
    """The sustained ceiling; a lower bound for a concurrency sweep ``stopped`` before its top levels."""
    c = capacity.sustained_ceiling(sweep.summarize(raw, mode), mode)
    kind = "lower_bound" if stopped and c["kind"] == "closed_loop_max" else str(c["kind"])
    # basis: steady_window | whole_run | mixed (over its repeats) | None
    tok, whole, rps, repeats, basis = map(c.get, ("output_tok_s", "whole_run_tok_s", "rps", "repeats", "basis"))
    label = None if kind == "none" else level_label(sweep_plan.load_of(c, mode), mode)
    v: dict[str, Any] = dict(kind=kind, label=label, rps=finite(rps), repeats=repeats, basis=basis)
    v |= dict(output_tok_s=finite(tok), whole_run_output_tok_s=finite(whole), lower_bound=kind == "lower_bound")
    v["output_tok_s_range"] = _minmax(c["output_tok_s_min"], c["output_tok_s_max"]) if tok else None
    v["whole_run_output_tok_s_range"] = _minmax(c["whole_run_tok_s_min"], c["whole_run_tok_s_max"]) if whole else None
    return doc.Ceiling.model_validate(v)


def speed_summary(rec: JobRecord, rc: ReviewConfig) -> tuple[doc.Speed, list[Flag], list[str]]:
    """``(speed, flags, missing)``: single-stream speed (lowest load), sustained ceiling, goodput and latency at the
    load, each a median over its level's valid repeats; kernel and comparability are the caller's."""
    mode, raw = raw_points(rec)
    slo = slo_of(rc)
    points = speed_points(mode, raw, rec, slo)
    found = [f for sp in rec.speed.points for f in _point_flags(sp, mode, rec.cfg.bench.repeats)]
    speed = doc.Speed.unmeasured(mode)
    speed.workload, speed.roofline, speed.points = workload(rec), _roofline(rec), points
    speed.repeats = max((p.repeats for p in points), default=None)
    if not points:
        return speed, found, ["no valid speed results" if raw else "no speed results"]
    low = points[0]
    tpot = low.tpot_ms_p50 or low.itl_ms_p50
    spread = low.spread["itl_ms_p50"] if "itl_ms_p50" in low.spread else None
    v: dict[str, Any] = dict(label=low.label, itl_ms_p50=low.itl_ms_p50, itl_ms_p50_range=spread)
    speed.low_load = doc.LowLoad.model_validate(v | dict(output_tok_s_per_request=1000.0 / tpot if tpot else None))
    planned = _planned_loads(rec, mode)
    missing = [load for load in planned if load not in {p.load for p in points}]
    above = [load for load in missing if load > points[-1].load]
    speed.ceiling = _ceiling(raw, mode, bool(above))
    speed.missing_levels = [level_label(x, mode) for x in missing]  # planned levels without a valid point
    speed.stopped_before = [level_label(x, mode) for x in above]  # ... and those above the last one measured
    if missing:
        words = dict(missing=speed.missing_levels, planned=[level_label(x, mode) for x in planned], stopped=bool(above))
        words |= dict(status=rec.status, failed_stage=rec.failed_stage, lower_bound=speed.ceiling.lower_bound)
        found.append(Flag.new(FlagCode.SWEEP_INCOMPLETE, say("sweep_incomplete", "speed.j2", **words)))
    at, speed.load_how = load_point(mode, points, rc)
    if at is not None:
        speed.goodput_rps = at.goodput.goodput_rps if at.goodput else None
        speed.at_load = doc.AtLoad.model_validate({k: getattr(at, k) for k in doc.AtLoad.model_fields})
    if speed.goodput_rps is None:  # why not: no SLO, no point at the load, or no per-request data there
        why = doc.GoodputMissing
        speed.goodput_missing = (
            why.NO_SLO if not slo.objectives() else why.NO_POINT if at is None else why.NO_PER_REQUEST
        )
    return speed, found, []
