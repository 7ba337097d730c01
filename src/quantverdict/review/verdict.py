"""The three checks (memory, accuracy, latency) of each scheme and the verdict: the baseline passing all three is
kept; otherwise the constraints it fails bind, and the first of :func:`candidate_order` that finished and passes all
three is chosen. A check that cannot be made never passes; a not-applicable accuracy (random weights) never blocks.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from quantverdict.config.schema import ReviewConfig
from quantverdict.measure import stats
from quantverdict.measure.points import SweepPoint
from quantverdict.review import document as doc
from quantverdict.review.document import Check, ConstraintKind, Criterion, CriterionMetric, Decision, PassReason, finite
from quantverdict.review.headline import not_comparable
from quantverdict.review.speed import NO_PER_REQUEST, level_label, slo_of, slo_ok
from quantverdict.review.words import say

PASS, FAIL, UNKNOWN, OFF = doc.Outcome.PASS, doc.Outcome.FAIL, doc.Outcome.UNKNOWN, doc.Outcome.OFF
NOT_APPLICABLE = doc.Outcome.NOT_APPLICABLE

NON_BLOCKING = (PASS, OFF, NOT_APPLICABLE)  # outcomes that let a scheme be chosen
PAYS = 1.05  # a speedup >= 1.05x pays; <= 1/1.05 costs; between: no change


def _check(kind: str, outcome: doc.Outcome, text: str, **kw: Any) -> Check:
    blank: dict[str, Any] = {"shortfall": "", "excess": 0.0, "cite": "", "criteria": []}
    return Check(constraint=ConstraintKind(kind), outcome=outcome, text=text, **(blank | kw))


Fails = list[tuple[float, str]]  # a check's shortfalls: (excess relative to the limit, sentence)


def _judged(kind: str, text: str, cite: str, fails: Fails, crits: list[Criterion]) -> Check:
    shortfall, excess = "; ".join(f for _, f in fails), max((e for e, _ in fails), default=0.0)
    return _check(kind, FAIL if fails else PASS, text, shortfall=shortfall, excess=excess, cite=cite, criteria=crits)


def _miss(c: Criterion) -> float:
    """How far ``c``'s point value lies on the failing side of its threshold (> 0: it fails under the point test)."""
    v = c.observed or 0.0
    return c.threshold - v if c.comparison == ">=" else v - c.threshold


def _fails(kind: str, crits: list[Criterion], tiny: float = 0.0, **values: Any) -> Fails:
    """A shortfall per failing criterion: how far it misses (:func:`_miss`) relative to its threshold, floored at
    ``tiny``, and its sentence (macro ``<kind>_fails`` with ``over``, the miss, and ``pct``, the miss in %)."""
    missed = [(c, _miss(c), max(c.threshold, tiny)) for c in crits if c.outcome == FAIL]
    return [(m / t, say(f"{kind}_fails", c=c, over=m, pct=100 * m / t, **values)) for c, m, t in missed]


def _said(macro: str, **values: Any) -> tuple[str, str]:
    """The sentence of ``macro`` in full (``text``) and the numbers alone (``cite``)."""
    return say(macro, **values, full=True), say(macro, **values, full=False)


def memory_check(sc: doc.Scheme, rc: ReviewConfig) -> Check:
    m, budget, need = sc.memory, rc.memory_budget_gib, sc.memory.need_gib
    if budget is None:
        return _check("memory", OFF, "no memory budget set")
    crit = [doc.criterion(CriterionMetric.NEED_GIB, "", "memory_budget_gib", "<=", budget, need)]
    if need is None:
        return _check("memory", UNKNOWN, say("memory_unknown", weights_known=m.weights_gib is not None), criteria=crit)
    block_tokens = int(m.hybrid_paging.block_tokens) if m.hybrid_paging and not rc.kv_cache_tokens else None
    text, cite = _said("memory", need=need, budget=budget, m=m, rc=rc, block_tokens=block_tokens)
    return _judged("memory", text, cite, _fails("memory", crit), crit)


def floor_test_of(d: doc.AccuracyDelta, rc: ReviewConfig) -> str:
    """``review.floor_test``; ``auto`` is ``interval`` for a delta over fewer than ``review.interval_test_below_n``
    items (one item of 30 moves a recovery by 100 / (30 × baseline) points: 8.3 at a 0.400 baseline), else ``point``."""
    if rc.floor_test != "auto":
        return rc.floor_test
    return "interval" if d.n is not None and d.n < rc.interval_test_below_n else "point"


# the limit on a delta, by its kind (a KLD delta: by its metric): (the delta's value judged, its interval, the review
# key, the comparison, the criterion's metric)
FLOORS: dict[str, tuple[str, str, str, Literal["<=", ">="], str]] = {
    "score": ("recovery_pct", "recovery_interval", "min_recovery_pct", ">=", "recovery_pct"),
    "perplexity": ("delta_pct", "interval", "max_perplexity_increase_pct", "<=", "perplexity_increase_pct"),
    "mean_kld": ("delta", "interval", "max_mean_kld", "<=", "mean_kld_nats"),
    "top1_agreement_pct": ("recovery_pct", "recovery_interval", "min_top1_agreement_pct", ">=", "top1_agreement_pct"),
}


def _accuracy_criterion(d: doc.AccuracyDelta, rc: ReviewConfig) -> Criterion:
    """The limit of :data:`FLOORS` held against one delta's value or, under the interval test (:func:`floor_test_of`),
    against the end of its interval nearest to passing; a refused delta is left unjudged."""
    value, interval, limit, comparison, metric = FLOORS[d.metric if d.kind == "kld" else d.kind]
    iv = getattr(d, interval) if floor_test_of(d, rc) == "interval" else None
    end = None if iv is None else iv.high if comparison == ">=" else iv.low
    subject = d.metric if d.name == d.metric or d.kind == "kld" else f"{d.name} {d.metric}"
    args = (CriterionMetric(metric), subject, limit, comparison, float(getattr(rc, limit) or 0.0), getattr(d, value))
    crit = doc.criterion(*args, judged=end, test="point" if iv is None else "interval")
    if d.refused:
        return crit.model_copy(update={"judged": None, "outcome": UNKNOWN, "note": f"cannot be checked: {d.refused}"})
    return crit


def _held(name: str, judged: list[tuple[doc.AccuracyDelta, Criterion]], tiny: float) -> tuple[str, str, Fails]:
    """The worst of ``judged`` against its limit (macro ``worst_<name>``: in full, and the numbers alone) and a
    shortfall per failing delta (``<name>_fails``; its excess relative to the threshold, floored at ``tiny``)."""
    d, c = min(judged, key=lambda dc: (dc[1].observed or 0.0) * (1 if dc[1].comparison == ">=" else -1))
    by_interval = c.test == "interval" and _miss(c) > 0  # judged on its interval while the estimate fails
    text, cite = _said(f"worst_{name}", d=d, c=c, by_interval=by_interval)
    return text, cite, [f for d, c in judged for f in _fails(name, [c], tiny, d=d)]


def accuracy_check(sc: doc.Scheme, rc: ReviewConfig) -> Check:
    floor, limit, acc = rc.min_recovery_pct, rc.max_perplexity_increase_pct, sc.accuracy
    if acc.not_applicable:
        text, cite = _said("accuracy_na", reason=acc.not_applicable, floor=floor, limit=limit)
        return _check("accuracy", NOT_APPLICABLE, text, cite=cite)
    if floor is None and limit is None:
        return _check("accuracy", OFF, "no accuracy floor set")
    if sc.is_baseline:
        ok = (floor is None or floor <= 100.0) and (limit is None or limit >= 0.0)
        reference = "the accuracy reference (recovery 100%, perplexity +0% by definition)"
        return _check("accuracy", PASS if ok else FAIL, reference, cite="is the accuracy reference")
    if acc.refused:
        return _check("accuracy", UNKNOWN, f"delta excluded: {acc.refused}")
    # a comparison that cannot be made (refused) is left unjudged, and the check cannot pass while one is
    held = [d for d in acc.deltas if d.kind == "score" or d.kind == "perplexity" and d.metric in rc.perplexity_kinds]
    measured = [d for d in held if not d.refused and getattr(d, FLOORS[d.kind][0]) is not None]
    floored = [d for d in held if getattr(rc, FLOORS[d.kind][2]) is not None and (d.refused or d in measured)]
    judged = [(d, _accuracy_criterion(d, rc)) for d in floored]
    crits, cannot = [c for _, c in judged], say("cannot", unjudged=[d for d, _ in judged if d.refused])
    if not measured:
        why = cannot or "; ".join(sc.missing) or "no comparable accuracy results"
        return _check("accuracy", UNKNOWN, f"not checked: {why}", criteria=crits)
    groups = [[(d, c) for d, c in judged if d.kind == kind and not d.refused] for kind in ("score", "perplexity")]
    said = [_held(group[0][0].kind, group, 1e-9) for group in groups if group]
    text, cite = "; ".join(s[0] for s in said), " and ".join(s[1] for s in said)
    fails = sorted((f for s in said for f in s[2]), reverse=True)
    if cannot and not fails:
        rest = dict(cite=f"{cannot}; the rest: {cite}", criteria=crits)
        return _check("accuracy", UNKNOWN, f"not checked: {cannot}; the rest: {text}", **rest)
    return _judged("accuracy", "; ".join(p for p in (text, cannot) if p), cite, fails, crits)


def with_kld_limits(check: Check, sc: doc.Scheme, rc: ReviewConfig) -> Check:
    """The accuracy ``check`` of ``sc`` with the KLD limits set (``max_mean_kld``, ``min_top1_agreement_pct``) added
    as criteria (:func:`_accuracy_criterion`); ``unknown`` without a KLD unless it already fails."""
    limits = {m: FLOORS[m] for m in ("mean_kld", "top1_agreement_pct") if getattr(rc, FLOORS[m][2]) is not None}
    if not limits or check.outcome == NOT_APPLICABLE or sc.accuracy.refused:
        return check
    off = check.outcome == OFF
    if sc.is_baseline:
        reference = "the accuracy reference (KLD 0, top-1 agreement 100% by definition)"
        return _check("accuracy", PASS, reference, cite="is the accuracy reference") if off else check
    kld = {d.metric: d for d in sc.accuracy.deltas if d.kind == "kld"}
    judged = [(kld[m], _accuracy_criterion(kld[m], rc)) for m in limits if m in kld]
    said, crits, sep = [_held("kld", [dc], 1e-12) for dc in judged], [c for _, c in judged], " and "
    if not judged:
        why = next((d.note for d in kld.values()), "no KL divergence in the record")
        crits = [
            doc.criterion(CriterionMetric(f[4]), m, f[2], f[3], getattr(rc, f[2]), None, note=why)
            for m, f in limits.items()
        ]
        said, sep = [(f"KLD limits not checked: {why}", "KLD not measured", Fails())], "; "
    parts = ([] if off else [(check.text, check.cite, Fails())]) + said
    fails = sorted((f for *_, fs in parts for f in fs), reverse=True)
    update: dict[str, Any] = {
        "outcome": FAIL if fails or check.outcome == FAIL else (PASS if off else check.outcome) if judged else UNKNOWN,
        "text": "; ".join(t for t, *_ in parts if t),
        "cite": sep.join(c for _, c, _ in parts if c),
        "shortfall": "; ".join(f for f in (check.shortfall, *(f for _, f in fails)) if f),
        "excess": max([check.excess, *(e for e, _ in fails)]),
        "criteria": [*check.criteria, *crits],
    }
    return check.model_copy(update=update)


def latency_check(sc: doc.Scheme, rc: ReviewConfig) -> Check:
    if rc.ttft_ms_p99 is None and rc.itl_ms_p99 is None and rc.e2e_ms is None:
        return _check("latency", OFF, "no latency SLO set")
    sp, at = sc.speed, sc.speed.at_load
    if not sp.points:
        return _check("latency", UNKNOWN, "not checked: no speed results")
    if at is None:
        return _check("latency", UNKNOWN, f"not checked: {sp.load_how}")
    if g := at.goodput:  # per-request goodput at the load
        need, pct, slo = rc.slo_attainment_pct, g.slo_attainment_pct, slo_of(rc).describe()
        text, cite = _said("attainment", g=g, at=at, load_how=sp.load_how, need=need, pct=pct, slo=slo)
        crits = [doc.criterion(CriterionMetric.SLO_ATTAINMENT_PCT, at.label, "slo_attainment_pct", ">=", need, pct)]
    elif (rc.ttft_ms_p99 is None and rc.itl_ms_p99 is None) or slo_ok(at, rc) is None:
        return _check("latency", UNKNOWN, f"not checked: no per-request data and no p99 latency at {at.label}")
    else:  # no per-request data: the p99s with a limit at the load (slo_ok said None above if one is missing)
        limits = [(k, lim) for k in ("ttft_ms_p99", "itl_ms_p99") if (lim := getattr(rc, k)) is not None]
        crits = [doc.criterion(CriterionMetric(k), at.label, k, "<=", lim, getattr(at, k)) for k, lim in limits]
        spread = {k: (r.min, r.max) for k, r in at.spread.items()} if (sp.repeats or 1) > 1 else None
        text, cite = _said("p99s", cs=crits, at=at, load_how=sp.load_how, spread=spread, no_per_request=NO_PER_REQUEST)
    if rc.load_rps is not None and sp.ceiling is not None and sp.ceiling.rps is not None:
        ceiling, lower_bound = sp.ceiling.rps, sp.ceiling.lower_bound
        text += f"; ceiling {'>= ' if lower_bound else ''}{ceiling:.2f} req/s"
        # a rate sweep's level at the load that kept pace with it (not saturated) sustained the load, whatever
        # its whole-run rate (ramp-up and drain read low on a short run)
        kept_up = sp.mode == "rate" and at.load >= rc.load_rps
        kept_up = kept_up and any(lv.load == at.load and lv.saturated is False for lv in sp.points)
        below = ceiling < rc.load_rps and not lower_bound and not kept_up
        note = "a lower bound (no point saturated, or the sweep stopped early): never fails" if lower_bound else ""
        metric, subject = CriterionMetric.CEILING_RPS, sp.ceiling.label or ""
        crits.append(doc.criterion(metric, subject, "load_rps", ">=", rc.load_rps, ceiling, ok=not below, note=note))
    return _judged("latency", text, cite, _fails("latency", crits, g=at.goodput), crits)


def checks(sc: doc.Scheme, rc: ReviewConfig) -> doc.Checks:
    accuracy = with_kld_limits(accuracy_check(sc, rc), sc, rc)
    return doc.Checks(memory=memory_check(sc, rc), accuracy=accuracy, latency=latency_check(sc, rc))


def kv_step(sc: doc.Scheme) -> int:
    return 0 if sc.kv_cache in ("auto", "") else 1


def kv_lever(base: doc.Scheme, cards: list[doc.Scheme], rc: ReviewConfig) -> doc.KvLever:
    """The KV lever weighed on the baseline: whether its failing memory check binds on the weights (they alone,
    with recurrent state and reserve, exceed the budget) or on the KV cache, and its need with an FP8 cache."""
    m, budget, fp8 = base.memory, rc.memory_budget_gib, finite(base.memory.need_gib_kv_fp8)
    binds_on: Literal["kv_cache", "weights"] | None = None
    if base.checks.memory.outcome == FAIL and budget is not None and m.weights_gib is not None:
        binds_on = "weights" if m.weights_gib + (m.state_needed_gib or 0.0) + rc.reserved_gib > budget else "kv_cache"
    return doc.KvLever(
        binds_on=binds_on,
        fp8_fits=None if budget is None or fp8 is None else fp8 <= budget,
        measured=[sc.scheme for sc in cards if kv_step(sc) and sc.status == "ok"],  # refused/failed: not measured
    )


def candidate_order(cards: list[doc.Scheme]) -> list[doc.Scheme]:
    """Least aggressive first: levers pulled (one per 8-bit step of the weights, one for a quantized KV
    cache), then weight tier, then lowest E2E p50 at the load, highest ceiling (req/s), name."""

    def key(sc: doc.Scheme) -> tuple[int, int, float, float, str]:
        at, top = sc.speed.at_load, sc.speed.ceiling
        e2e = at.e2e_ms_p50 if at and at.e2e_ms_p50 is not None else math.inf
        return (sc.weight_tier + kv_step(sc), sc.weight_tier, e2e, -((top.rps if top else None) or 0.0), sc.scheme)

    return sorted(cards, key=key)


def _passed_over(sc: doc.Scheme, if_eligible: PassReason) -> doc.PassedOver:
    """Why ``sc`` was not chosen: job not ok, else a failing check, else an unknown one, else ``if_eligible``."""
    cs = sc.checks.in_order()
    fails = [c.constraint for c in cs if c.outcome == FAIL]
    unknown = [c.constraint for c in cs if c.outcome == UNKNOWN]
    checked = PassReason.FAILS_CONSTRAINT if fails else PassReason.NOT_CHECKED if unknown else if_eligible
    job = {"ok": checked, "interrupted": PassReason.JOB_INTERRUPTED, "running": PassReason.JOB_NOT_FINISHED}
    crits = [k for c in cs if c.outcome in (FAIL, UNKNOWN) for k in c.criteria if k.outcome != PASS]
    return doc.PassedOver(
        scheme=sc.scheme,
        reason=job.get(sc.status, PassReason.JOB_FAILED),
        fails=fails,
        not_checked=unknown,
        criteria=crits,
    )


def decide(model: str, cards: list[doc.Scheme], rc: ReviewConfig) -> doc.ModelVerdict:
    """The verdict for one model's schemes, from their checks (:func:`checks`)."""
    base = next((sc for sc in cards if sc.is_baseline), None)
    order = candidate_order([sc for sc in cards if not sc.is_baseline])
    bc = base.checks.in_order() if base is not None else []
    binding = [c.constraint for c in bc if c.outcome == FAIL]

    def rank(sc: doc.Scheme) -> tuple[int, float]:  # its blocking checks, then their summed excess
        cs = sc.checks.in_order()
        return sum(c.outcome not in NON_BLOCKING for c in cs), sum(c.excess for c in cs)

    chosen = next((sc for sc in order if sc.status == "ok" and rank(sc)[0] == 0), None)
    if binding:
        decision = Decision.QUANTIZE if chosen is not None else Decision.NO_SCHEME
    elif base is None or base.status != "ok" or any(c.outcome == UNKNOWN for c in bc):
        decision, chosen = Decision.NO_BASELINE if base is None else Decision.BASELINE_NOT_CHECKED, None
    else:
        decision, chosen = Decision.DO_NOT_QUANTIZE, base

    def passes(sc: doc.Scheme) -> PassReason:  # why a scheme that passes was not chosen
        if decision == Decision.QUANTIZE:
            harsher = chosen and sc.weight_tier > chosen.weight_tier
            return PassReason.MORE_AGGRESSIVE if harsher else PassReason.SLOWER_SAME_TIER
        return PassReason.NOT_NEEDED if decision == Decision.DO_NOT_QUANTIZE else PassReason.NO_VERDICT

    closest = min(order, key=rank) if decision == Decision.NO_SCHEME and order else None  # no scheme passes
    shapes = {sc.name: sc.speed.workload.text for sc in cards if sc.speed.points and sc.speed.workload}
    levers = (("weights", chosen and chosen.weight_tier > 0), ("KV cache", chosen and kv_step(chosen)))
    pulled = [n for n, on in levers if on]
    return doc.ModelVerdict(
        model=model,
        decision=decision,
        chosen_scheme=chosen.scheme if chosen else None,
        chosen_label=chosen.label if chosen else None,
        binding=binding,
        passed_over=[_passed_over(sc, passes(sc)) for sc in order if sc is not chosen],
        order=[sc.scheme for sc in order],
        lever=doc.Lever(" and ".join(pulled)) if decision == Decision.QUANTIZE else doc.Lever.NONE,
        kv_lever=None if base is None else kv_lever(base, cards, rc),
        accuracy_not_measured=next((a for sc in cards if (a := sc.accuracy.not_applicable)), ""),
        baseline_scheme=base.scheme if base else None,
        request_shape=next(iter(shapes.values())) if len(set(shapes.values())) == 1 else None,
        request_shapes=shapes,
        ceilings_differ_in_basis=ceilings_differ_in_basis(cards),
        compute_reported=any(sc.speed.compute for sc in cards),
        closest_scheme=closest.scheme if closest else None,
        gpus=None,
    )


# --- regime: where a scheme pays against its baseline, at low load and at saturation ---------------------

# the metrics paired by repeat against the baseline, per load level: (point key, higher is better, name)
PAIRED_METRICS = (
    ("output_tok_s", True, "output tok/s"),
    ("itl_ms_p50", False, "ITL p50"),
    ("tpot_ms_p50", False, "TPOT p50"),
)
PAIRED_WORDS = {"faster": doc.RegimeClass.PAYS, "slower": doc.RegimeClass.COSTS}  # a paired verdict -> its class
Raw = tuple[str, list[SweepPoint]]  # a sweep's mode and raw points (quantverdict.review.speed.raw_points)
Speedup = tuple[float | None, doc.MinMax | None]  # a speedup and its min-max range over repeats


def ceilings_differ_in_basis(cards: list[doc.Scheme]) -> bool:
    """Whether the ceilings rest on different windows (``speed.ceiling_basis``: steady window, whole run, or mixed
    over repeats); :func:`_ceilings` then compares whole runs."""
    bases = {c.basis for sc in cards if (c := sc.speed.ceiling) and c.output_tok_s} - {None}
    return len(bases) > 1 or "mixed" in bases


def _ceilings(sc: doc.Scheme, base: doc.Scheme) -> Speedup:
    """Ceiling output tok/s of the scheme over the baseline's on one window: the whole runs when the bases differ
    (:func:`ceilings_differ_in_basis`), else the ceilings."""
    a, b = sc.speed.ceiling, base.speed.ceiling
    if a is None or b is None:
        return None, None
    whole = ceilings_differ_in_basis([sc, base]) and a.whole_run_output_tok_s and b.whole_run_output_tok_s
    k = "whole_run_output_tok_s" if whole else "output_tok_s"
    return _speedup(getattr(a, k), getattr(a, k + "_range"), getattr(b, k), getattr(b, k + "_range"))


def _low_itl(sc: doc.Scheme, base: doc.Scheme) -> Speedup:
    """The baseline's ITL p50 over the scheme's at the lowest load both measured (Nones without a common load)."""
    mine, theirs = ({p.load: p for p in card.speed.points} for card in (sc, base))
    if not (common := sorted(set(mine) & set(theirs))):
        return None, None
    a, b = theirs[common[0]], mine[common[0]]
    return _speedup(a.itl_ms_p50, a.spread.get("itl_ms_p50"), b.itl_ms_p50, b.spread.get("itl_ms_p50"))


def _speedup(a: float | None, ra: doc.MinMax | None, b: float | None, rb: doc.MinMax | None) -> Speedup:
    """``a / b`` and its min-max range ``[a_min / b_max, a_max / b_min]``; None where missing or not finite."""
    if not a or not b:
        return None, None
    if not ra or not rb or min(ra.min, rb.min) <= 0:
        return finite(a / b), None
    lo, hi = ra.min / rb.max, ra.max / rb.min
    return finite(a / b), doc.MinMax(min=lo, max=hi) if math.isfinite(lo) and math.isfinite(hi) else None


def paired_speedups(sc: doc.Scheme, base: doc.Scheme, mine: Raw, theirs: Raw) -> list[doc.PairedSpeedup]:
    """Per metric of :data:`PAIRED_METRICS` and load with >= 1 pair, the scheme's ratio to its baseline paired by
    repeat (:func:`quantverdict.measure.stats.paired_ratio`) and as a speedup; [] when not compared or modes differ."""
    (mode, points), (base_mode, base_points) = mine, theirs
    if not_comparable(sc, base) or mode != base_mode:
        return []
    rows = []
    for metric, higher, name in PAIRED_METRICS:
        for e in stats.paired_ratio(points, base_points, metric, mode, higher):
            if not e["pairs"]:
                continue
            load = float(e["load"])  # "inf": the unlimited rate
            ratio = [e["ratio"], e["low"], e["high"]]
            speedup = ratio if higher else [None if x is None else 1.0 / x for x in (e["ratio"], e["high"], e["low"])]
            row = e | dict(zip(("ratio", "low", "high"), map(finite, ratio)))
            row |= dict(zip(("speedup", "speedup_low", "speedup_high"), map(finite, speedup)))
            row |= {"metric": metric, "name": name, "load": load, "label": level_label(load, mode)}
            rows.append(doc.PairedSpeedup.model_validate(row))
    return rows


def regime_side(median: float | None, rng: doc.MinMax | None, test: doc.PairedSpeedup | None) -> doc.RegimeClaim | None:
    """One regime claim: with a paired test of 2+ pairs its speedup, 95% interval and verdict (an
    established difference inside (1 / 1.05, 1.05) is ``no change``); else the median speedup and its min-max range
    (``pays`` when the whole range is >= :data:`PAYS`, ``costs`` when <= 1 / :data:`PAYS`); None without either."""
    R, C = doc.RegimeRule, doc.RegimeClass
    if test is not None and test.pairs >= 2 and test.speedup is not None:
        # established is not the same as large: a significant 1.01x neither pays nor costs
        cls = C.NO_CHANGE if 1 / PAYS < test.speedup < PAYS else PAIRED_WORDS.get(test.verdict, C.NO_CHANGE)
        rule, speedup, low, high = R.PAIRED_T, test.speedup, test.speedup_low, test.speedup_high
    elif median is None:
        return None
    else:
        test, speedup, ranged = None, median, bool(rng and rng.min != rng.max)
        lo, hi = (rng.min, rng.max) if rng and ranged else (median, median)
        cls = C.PAYS if lo >= PAYS else C.COSTS if hi <= 1 / PAYS else C.NO_CHANGE
        rule, low, high = (R.MIN_MAX_RANGE, lo, hi) if ranged else (R.SINGLE_RUN, None, None)
    of_test = {k: getattr(test, k) if test else None for k in ("pairs", "load", "metric", "verdict")}
    return doc.RegimeClaim(rule=rule, speedup=speedup, low=low, high=high, class_=cls, **of_test)


def saturation_gap(sc: doc.Scheme, base: doc.Scheme) -> str | None:
    """Why no saturation speedup can be claimed (a sweep with planned levels left unmeasured, sweeps ending at
    different loads, one load in common); None when it can."""
    mine, theirs = sc.speed.points, base.speed.points
    if not mine or not theirs or not_comparable(sc, base):
        return None  # speed missing or not compared: regime_reading says so
    for card, whose in ((sc, f"{sc.scheme}'s"), (base, "the baseline's")):
        if card.speed.stopped_before:
            return f"{whose} sweep has no valid point at {', '.join(card.speed.stopped_before)}"
    if mine[-1].load != theirs[-1].load:
        return f"the sweeps end at different loads ({mine[-1].label}; the baseline's {theirs[-1].label})"
    if len({p.load for p in mine} & {p.load for p in theirs}) == 1:
        return f"one load level measured by both ({mine[-1].label}): its speedup is the low-load claim"
    return None


def regime_reading(
    sc: doc.Scheme, lo: doc.RegimeClaim | None, sat: doc.RegimeClaim | None, gap: str | None
) -> doc.RegimeReading:
    """Where the scheme pays, from the classes of its two claims."""
    R = doc.RegimeReading
    if not_comparable(sc):
        return R.EXCLUDED
    if lo is not None and gap is not None:
        return R.SATURATION_NOT_MEASURED
    if lo is None or sat is None:
        return R.SPEED_MISSING
    low, high = lo.class_ == doc.RegimeClass.PAYS, sat.class_ == doc.RegimeClass.PAYS
    if low:
        return R.KEEPS_PAYING if high else R.PAYS_AT_LOW_LOAD_ONLY
    return R.PAYS_AT_SATURATION_ONLY if high else R.DOES_NOT_PAY


def regime(sc: doc.Scheme, base: doc.Scheme, mine: Raw, theirs: Raw, pairable: bool) -> doc.Regime:
    """Where ``sc`` pays against ``base`` (raw points ``mine``, ``theirs``); unless ``pairable`` (one grid on one
    GPU: :func:`quantverdict.review.gpus.pairable`) the claims rest on medians and ranges."""
    comparable = not not_comparable(sc, base)
    low, low_iv = _low_itl(sc, base) if comparable else (None, None)
    sat, sat_iv = _ceilings(sc, base) if comparable else (None, None)
    paired = paired_speedups(sc, base, mine, theirs)
    if not pairable:
        if any(row.pairs >= 2 for row in paired):
            sc.validity.append(
                f"{sc.model} / {sc.scheme} vs {base.scheme}: repeats not paired (not one grid on one GPU): "
                "the regime claims rest on medians and ranges"
            )
        paired = []
    # the paired rows (by metric, then load): at low load the lowest load's ITL p50 (else TPOT p50), at saturation the
    # highest load's output tok/s
    low_test = next((r for m in ("itl_ms_p50", "tpot_ms_p50") for r in paired if r.metric == m), None)
    sat_test = next((r for r in reversed(paired) if r.metric == "output_tok_s"), None)
    if (gap := saturation_gap(sc, base)) is not None:  # the sweeps' tops do not meet: no saturation number
        sat, sat_iv, sat_test = None, None, None
    low_claim, sat_claim = regime_side(low, low_iv, low_test), regime_side(sat, sat_iv, sat_test)
    return doc.Regime(
        scheme=sc.scheme,
        label=sc.label,
        low_load_speedup=low,
        low_load_range=low_iv,
        saturation_speedup=sat,
        saturation_range=sat_iv,
        low_load_claim=low_claim,
        saturation_claim=sat_claim,
        saturation_not_compared=gap,
        paired=paired,
        reading=regime_reading(sc, low_claim, sat_claim, gap),
    )
