"""Checks and the verdict: score each scheme, check three constraints, choose the least aggressive scheme that
passes.

* **memory**: ``weights + KV cache for the capacity needed + reserve <= budget`` (GiB);
* **accuracy**: every task's recovery ``100 · score / baseline >= min_recovery_pct``, every perplexity kind in
  ``perplexity_kinds`` up by at most ``max_perplexity_increase_pct`` (:func:`floor_test_of`: point estimate or
  interval), and the KL divergence limits (:func:`quantverdict.review.kld.with_kld_constraint`);
* **latency**: at the stated load, ``slo_attainment_pct`` % of the requests meet every objective (per-request
  goodput, :mod:`quantverdict.measure.goodput`; a record without per-request data: its TTFT p99 and ITL p99), and
  the sweep's ceiling reaches the load.

The baseline passing all three: do not quantize. Otherwise the constraints it fails bind, and the chosen scheme is
the first of :func:`candidate_order` that finished and passes all three. A check that cannot be made never passes;
a not-applicable accuracy (synthetic model, random weights) never blocks, and the verdict says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from quantverdict.config.schema import ReviewConfig
from quantverdict.measure import stats
from quantverdict.results.format import number
from quantverdict.review.document import (
    AtLoad,
    Ceiling,
    ConstraintKind,
    Criterion,
    CriterionMetric,
    Decision,
    Goodput,
    JobStatus,
    MinMax,
    PassedOver,
    PassReason,
    RegimeReading,
    Speed,
)

# the check statuses by their short names, defined once in review.kld (re-exported: checks and tests read them here)
from quantverdict.review.kld import FAIL as FAIL
from quantverdict.review.kld import NOT_APPLICABLE as NOT_APPLICABLE
from quantverdict.review.kld import OFF as OFF
from quantverdict.review.kld import PASS as PASS
from quantverdict.review.kld import UNKNOWN as UNKNOWN
from quantverdict.review.kld import with_kld_constraint
from quantverdict.review.scorecard import TIER_NAMES, Scorecard, TaskDelta, na_label
from quantverdict.review.speed import NO_PER_REQUEST, ceiling_is_floor, load_label, slo_of, slo_ok

NON_BLOCKING = (PASS, OFF, NOT_APPLICABLE)  # statuses that let a scheme be chosen
PAYS = 1.05  # a speedup >= 1.05x pays; <= 1/1.05 costs; between: no change


@dataclass
class Check:
    """One constraint checked for one scheme: ``text`` cites the numbers, ``shortfall`` says by how much a failing
    scheme misses, ``excess`` is that relative to the limit (for ranking), ``criteria`` each limit held against a
    number."""

    constraint: str
    status: str  # pass | fail | unknown | off | not_applicable (an Outcome)
    text: str
    shortfall: str = ""
    excess: float = 0.0
    cite: str = ""  # the numbers alone, for the verdict sentence (default: ``text``)
    criteria: list[Criterion] = field(default_factory=list)

    def short(self) -> str:
        return self.cite or self.text


@dataclass
class Verdict:
    """The decision for one model (``decision`` a :class:`~quantverdict.review.document.Decision`)."""

    model: str
    # "do not quantize" | "quantize" | "no scheme meets all three" | "no baseline" | "baseline not checked"
    decision: str
    scheme: str | None
    label: str | None
    sentence: str  # the verdict, citing the three numbers
    binding_constraints: list[str] = field(default_factory=list)  # the constraints the baseline fails
    evidence: list[str] = field(default_factory=list)  # the chosen scheme's (or the baseline's) full checks
    others: list[str] = field(default_factory=list)  # one sentence per other scheme
    passed_over: list[PassedOver] = field(default_factory=list)  # the same, typed: why each was not chosen
    order: list[str] = field(default_factory=list)  # the order schemes were tried in
    # set when accuracy was not measured for this model (synthetic, random weights): the verdict rests
    # on memory and latency alone; the reason
    accuracy_not_measured: str = ""
    # which lever the chosen combination pulls: "weights", "KV cache", "weights and KV cache" ("" unless quantize)
    lever: str = ""
    # the KV lever weighed (:func:`kv_lever`): what memory binds on, and what an FP8 cache would need
    kv_lever: dict[str, Any] = field(default_factory=dict)


def _n(v: float | None, fmt: str = ".2f") -> str:
    return number(v, fmt, missing="n/a")


def _gib(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.3f} GiB" if v < 10 else f"{v:.1f} GiB"


# --- the three checks -------------------------------------------------------------------------------


def _criterion(
    metric: CriterionMetric,
    subject: str,
    limit: str,
    comparison: Literal["<=", ">="],
    threshold: float,
    observed: float | None,
    *,
    judged: float | None = None,
    test: Literal["point", "interval"] = "point",
    ok: bool | None = None,
    note: str = "",
) -> Criterion:
    """``observed`` held against ``threshold`` (the ``review.<limit>`` value); ``judged`` is the value compared
    (default ``observed``); the outcome is ``ok`` where given, else the comparison, ``unknown`` without a finite
    value."""
    value = observed if judged is None else judged
    if value is not None and not math.isfinite(value):  # NaN or inf: nothing to judge
        value = None
    if ok is None and value is not None:
        ok = value <= threshold if comparison == "<=" else value >= threshold
    return Criterion(
        metric=metric,
        subject=subject,
        limit=limit,
        comparison=comparison,
        threshold=threshold,
        observed=_finite(observed),
        judged=_finite(value),
        test=test,
        outcome=UNKNOWN if ok is None or value is None else PASS if ok else FAIL,
        note=note,
    )


def _finite(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


def _test(d: TaskDelta, rc: ReviewConfig) -> Literal["point", "interval"]:
    """The test that judged ``d``: :func:`floor_test_of`'s, ``point`` when the delta has no interval."""
    iv = d.recovery_interval if d.kind == "score" else d.interval
    return "interval" if floor_test_of(d, rc) == "interval" and iv is not None else "point"


def _subject(d: TaskDelta) -> str:
    """``arc_easy acc_norm``; a perplexity kind named once."""
    return d.metric if d.name == d.metric else f"{d.name} {d.metric}"


def memory_check(sc: Scorecard, rc: ReviewConfig) -> Check:
    m = sc.memory
    if rc.memory_budget_gib is None:
        return Check("memory", OFF, "no memory budget set")
    if m.need_gib is None:
        why = "weight size" if m.weights_gib is None else "KV-cache size (model dimensions or request length)"
        crit = _criterion(CriterionMetric.NEED_GIB, "", "memory_budget_gib", "<=", rc.memory_budget_gib, None)
        return Check("memory", UNKNOWN, f"not checked: {why} unknown", criteria=[crit])
    need, budget = m.need_gib, rc.memory_budget_gib
    crits = [_criterion(CriterionMetric.NEED_GIB, "", "memory_budget_gib", "<=", budget, need)]
    parts = f"weights {_gib(m.weights_gib)} + KV {_gib(m.kv_needed_gib)} for {m.kv_needed_tokens:,} tokens"
    if m.kv_dtype:
        parts += f" in {m.kv_dtype}"
    paging = m.hybrid_paging
    if paging and not rc.kv_cache_tokens:
        parts += f" (whole {int(paging.block_tokens)}-token blocks)"
    if m.state_needed_gib:  # a hybrid model's recurrent (Gated DeltaNet) state, one per request
        parts += f" + recurrent state {_gib(m.state_needed_gib)} for {rc.concurrent_requests:,} requests"
    if rc.reserved_gib:
        parts += f" + reserve {_gib(rc.reserved_gib)}"
    if need <= budget:
        return Check(
            "memory",
            PASS,
            f"needs {_gib(need)} ({parts}) <= {_gib(budget)} budget",
            cite=f"needs {_gib(need)} <= {_gib(budget)} budget",
            criteria=crits,
        )
    over = need - budget
    return Check(
        "memory",
        FAIL,
        f"needs {_gib(need)} ({parts}) > {_gib(budget)} budget",
        shortfall=f"{_gib(over)} ({100 * over / budget:.0f}%) over the {_gib(budget)} budget",
        excess=over / budget,
        cite=f"needs {_gib(need)} > {_gib(budget)} budget",
        criteria=crits,
    )


def _reference_score(sc: Scorecard) -> str:
    return "the accuracy reference (recovery 100%, perplexity +0% by definition)"


def accuracy_check(sc: Scorecard, rc: ReviewConfig) -> Check:
    if sc.accuracy_not_applicable:
        floors = []
        if rc.min_recovery_pct is not None:
            floors.append(f"recovery >= {rc.min_recovery_pct:g}%")
        if rc.max_perplexity_increase_pct is not None:
            floors.append(f"perplexity <= +{rc.max_perplexity_increase_pct:g}%")
        na = na_label(sc.accuracy_not_applicable)
        what = f"the accuracy floor ({', '.join(floors)}) does not apply" if floors else "no accuracy floor is set"
        return Check(
            "accuracy",
            NOT_APPLICABLE,
            f"{na}: accuracy was not measured; {what} and does not block",
            cite="accuracy not measured (" + na.replace(" (", ": ").rstrip(")") + ")",
        )
    if rc.min_recovery_pct is None and rc.max_perplexity_increase_pct is None:
        return Check("accuracy", OFF, "no accuracy floor set")
    if sc.is_baseline:
        ok = (rc.min_recovery_pct is None or rc.min_recovery_pct <= 100.0) and (
            rc.max_perplexity_increase_pct is None or rc.max_perplexity_increase_pct >= 0.0
        )
        return Check("accuracy", PASS if ok else FAIL, _reference_score(sc), cite="is the accuracy reference")
    if sc.accuracy_refused:
        return Check("accuracy", UNKNOWN, f"delta excluded: {sc.accuracy_refused}")
    # a comparison that cannot be made (the two runs did not score the same items) is left unjudged: its point
    # value neither fails nor passes the scheme, and the check cannot pass while one is unjudged
    floored = [
        d
        for d in sc.accuracy
        if (d.kind == "score" and rc.min_recovery_pct is not None)
        or (d.kind == "perplexity" and d.metric in rc.perplexity_kinds and rc.max_perplexity_increase_pct is not None)
    ]
    unjudged = [d for d in floored if d.refused]
    scores = [d for d in sc.accuracy if d.kind == "score" and d.recovery_pct is not None and not d.refused]
    ppls = [
        d
        for d in sc.accuracy
        if d.kind == "perplexity" and d.metric in rc.perplexity_kinds and d.delta_pct is not None and not d.refused
    ]
    cannot = "; ".join(f"{d.name} {d.metric} cannot be checked ({d.refused})" for d in unjudged)
    judged_ids = {id(d) for d in (*unjudged, *scores, *ppls)}
    crits = [_accuracy_criterion(d, rc) for d in floored if id(d) in judged_ids]  # in the record's order
    if not scores and not ppls:
        why = cannot or "; ".join(sc.missing) or "no comparable accuracy results"
        return Check("accuracy", UNKNOWN, f"not checked: {why}", criteria=crits)
    fails: list[tuple[float, str]] = []
    parts: list[str] = []
    cites: list[str] = []
    if rc.min_recovery_pct is not None and scores:
        floor = rc.min_recovery_pct
        worst = min(scores, key=lambda d: d.recovery_pct or 0.0)
        op = ">=" if _score_ok(worst, floor, rc) else "<"
        below = (worst.recovery_pct or 0.0) < floor
        if floor_test_of(worst, rc) == "interval" and worst.recovery_interval is not None and below:
            # judged on the interval: the estimate alone sits below the floor, so say what passed or failed
            verb = "does not rule out" if op == ">=" else "stays below"
            judged = (
                f"worst recovery {_n(worst.recovery_pct, '.1f')}% (its interval, up to "
                f"{worst.recovery_interval.high:.1f}%, {verb} the {floor:g}% floor)"
            )
            parts.append(f"{judged[:-1]}; {worst.name} {worst.metric}, interval test, n={worst.n})")
            cites.append(judged)
        else:
            parts.append(
                f"worst recovery {_n(worst.recovery_pct, '.1f')}% ({worst.name} {worst.metric}"
                f"{_ci_pct(worst.recovery_interval)}) {op} {floor:g}%"
            )
            cites.append(f"worst recovery {_n(worst.recovery_pct, '.1f')}% {op} {floor:g}%")
        for d in scores:
            if not _score_ok(d, floor, rc):
                gap = floor - (d.recovery_pct or 0.0)
                note = ""
                if d.significant is False:
                    note = " (the drop itself is not significant"
                    if d.recovery_interval is not None and d.recovery_interval.high >= floor:
                        note += (
                            f": its interval reaches {d.recovery_interval.high:.1f}%, so "
                            "review.floor_test=interval would pass it"
                        )
                    note += ")"
                fails.append(
                    (
                        gap / floor,
                        (
                            f"{d.name} recovery {d.recovery_pct:.1f}% is {gap:.1f} points below "
                            f"the {floor:g}% floor{note}"
                        ),
                    )
                )
    if rc.max_perplexity_increase_pct is not None and ppls:
        limit = rc.max_perplexity_increase_pct
        worst_p = max(ppls, key=lambda d: d.delta_pct or 0.0)
        op = "<=" if _ppl_ok(worst_p, limit, rc) else ">"
        above = (worst_p.delta_pct or 0.0) > limit
        if floor_test_of(worst_p, rc) == "interval" and worst_p.interval is not None and above:
            verb = "does not rule out" if op == "<=" else "stays above"
            judged = (
                f"{worst_p.metric} {_n(worst_p.delta_pct, '+.1f')}% (its interval, down to "
                f"{worst_p.interval.low:+.1f}%, "
                f"{verb} the +{limit:g}% limit)"
            )
            parts.append(f"{judged[:-1]}; interval test, n={worst_p.n})")
            cites.append(judged)
        else:
            parts.append(
                f"{worst_p.metric} {_n(worst_p.delta_pct, '+.1f')}%{_ci_pct(worst_p.interval)} {op} +{limit:g}%"
            )
            cites.append(f"{worst_p.metric} {_n(worst_p.delta_pct, '+.1f')}% {op} +{limit:g}%")
        for d in ppls:
            if not _ppl_ok(d, limit, rc):
                gap = (d.delta_pct or 0.0) - limit
                hint = (
                    f" (its interval reaches down to {d.interval.low:+.1f}%, so review.floor_test=interval would "
                    "pass it)"
                    if d.interval is not None and d.interval.low <= limit
                    else ""
                )
                fails.append(
                    (
                        gap / max(limit, 1e-9),
                        (f"{d.metric} rises {d.delta_pct:+.1f}%, {gap:.1f} points over the +{limit:g}% limit{hint}"),
                    )
                )
    text, cite = "; ".join(parts), " and ".join(cites)
    if fails:
        fails.sort(reverse=True)
        text = _join_text(text, cannot)
        shortfall = "; ".join(f for _, f in fails)
        return Check("accuracy", FAIL, text, shortfall=shortfall, excess=fails[0][0], cite=cite, criteria=crits)
    if unjudged:
        return Check(
            "accuracy",
            UNKNOWN,
            f"not checked: {cannot}; the rest: {text}",
            cite=f"{cannot}; the rest: {cite}",
            criteria=crits,
        )
    return Check("accuracy", PASS, text, cite=cite, criteria=crits)


def _accuracy_criterion(d: TaskDelta, rc: ReviewConfig) -> Criterion:
    """The floor held against one delta, as :func:`_score_ok` / :func:`_ppl_ok` judge it; ``unknown``
    for a delta that cannot be compared."""
    test = _test(d, rc)
    op: Literal["<=", ">="]
    if d.kind == "score":
        threshold = float(rc.min_recovery_pct or 0.0)
        iv = d.recovery_interval if test == "interval" else None  # judged on its upper end
        metric, limit, op = CriterionMetric.RECOVERY_PCT, "min_recovery_pct", ">="
        observed, judged = d.recovery_pct, iv.high if iv is not None else d.recovery_pct
        ok = _score_ok(d, threshold, rc)
    else:
        threshold = float(rc.max_perplexity_increase_pct or 0.0)
        iv = d.interval if test == "interval" else None  # judged on its lower end
        metric, limit, op = CriterionMetric.PERPLEXITY_INCREASE_PCT, "max_perplexity_increase_pct", "<="
        observed, judged = d.delta_pct, iv.low if iv is not None else d.delta_pct
        ok = _ppl_ok(d, threshold, rc)
    if d.refused:
        return Criterion(
            metric=metric,
            subject=_subject(d),
            limit=limit,
            comparison=op,
            threshold=threshold,
            observed=_finite(observed),
            judged=None,
            test=test,
            outcome=UNKNOWN,
            note=f"cannot be checked: {d.refused}",
        )
    return _criterion(metric, _subject(d), limit, op, threshold, observed, judged=judged, test=test, ok=ok)


def _join_text(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _ci_pct(iv: Any) -> str:
    return f", CI {iv.low:.1f} to {iv.high:.1f}" if iv is not None else ""


def floor_test_of(d: TaskDelta, rc: ReviewConfig) -> str:
    """``review.floor_test``; ``auto`` is ``interval`` for a delta over fewer than ``review.interval_test_below_n``
    items (one item of 30 moves a recovery by 100 / (30 × baseline) points: 8.3 at a 0.400 baseline), else ``point``."""
    if rc.floor_test != "auto":
        return rc.floor_test
    return "interval" if d.n is not None and d.n < rc.interval_test_below_n else "point"


def _score_ok(d: TaskDelta, floor: float, rc: ReviewConfig) -> bool:
    if floor_test_of(d, rc) == "interval" and d.recovery_interval is not None:
        return d.recovery_interval.high >= floor
    return (d.recovery_pct or 0.0) >= floor


def _ppl_ok(d: TaskDelta, limit: float, rc: ReviewConfig) -> bool:
    if floor_test_of(d, rc) == "interval" and d.interval is not None:
        return d.interval.low <= limit
    return (d.delta_pct or 0.0) <= limit


Judged = tuple[str, str, list[str], float, list[Criterion]]  # (text, cite, fails, excess, criteria)


def _attainment(at: AtLoad, g: Goodput, sp: Speed, rc: ReviewConfig) -> Judged:
    """The latency check on per-request goodput at the load: ``(text, cite, fails, excess, criteria)``."""
    need = rc.slo_attainment_pct
    pct = g.slo_attainment_pct
    slo = slo_of(rc).describe()
    op = ">=" if pct >= need else "<"
    reps = f", median of {g.repeats} repeats" if g.repeats > 1 else ""
    cite = f"{slo} for {pct:.1f}% of requests ({op} {need:g}%) at {at.label}"
    text = (
        f"{g.good_requests} of {g.slo_requests} requests ({pct:.1f}%{reps}) met {slo} ({op} {need:g}% "
        f"needed) at {sp.load_how}: goodput {g.goodput_rps:.2f} req/s"
    )
    fails, excess = [], 0.0
    if pct < need:
        missed = ", ".join(f"{k.upper()} {v}" for k, v in g.slo_missed.items() if v)
        fails.append(
            f"only {pct:.1f}% of requests met every objective, {need - pct:.1f} points under {need:g}% "
            f"(requests over each objective: {missed or 'none'})"
        )
        excess = (need - pct) / need
    crit = _criterion(CriterionMetric.SLO_ATTAINMENT_PCT, at.label, "slo_attainment_pct", ">=", need, pct)
    return text, cite, fails, excess, [crit]


def _p99s(at: AtLoad, sp: Speed, rc: ReviewConfig) -> Judged | None:
    """The latency check on the TTFT p99 and ITL p99 at the load (no per-request data); None when a needed p99 is
    missing or only the E2E objective is set."""
    if (rc.ttft_ms_p99 is None and rc.itl_ms_p99 is None) or slo_ok(at, rc) is None:
        return None
    parts, fails = [], []
    crits = []
    excess = 0.0
    for key, name, limit, v in (
        ("ttft_ms_p99", "TTFT p99", rc.ttft_ms_p99, at.ttft_ms_p99),
        ("itl_ms_p99", "ITL p99", rc.itl_ms_p99, at.itl_ms_p99),
    ):
        if limit is None or v is None:  # a missing p99 with its limit set: slo_ok said None above
            continue
        crits.append(_criterion(CriterionMetric(key), at.label, key, "<=", limit, v))
        parts.append(f"{name} {v:,.0f} ms {'<=' if v <= limit else '>'} {limit:,.0f} ms")
        if v > limit:
            fails.append(
                f"{name} {v:,.0f} ms is {v - limit:,.0f} ms ({100 * (v - limit) / limit:.0f}%) over "
                f"the {limit:,.0f} ms SLO"
            )
            excess = max(excess, (v - limit) / limit)
    text = ", ".join(parts) + f" at {sp.load_how}"
    cite = " and ".join(parts) + f" at {at.label}"
    if (sp.repeats or 1) > 1 and at.spread:
        rng = at.spread
        bits = [
            f"{name} {rng[k].min:,.0f}-{rng[k].max:,.0f} ms"
            for k, name in (("ttft_ms_p99", "TTFT p99"), ("itl_ms_p99", "ITL p99"))
            if k in rng
        ]
        text += f" (median of {at.valid_repeats} repeats; range {', '.join(bits)})"
    text += f" ({NO_PER_REQUEST}: judged on the p99s, not per request)"
    return text, cite, fails, excess, crits


def latency_check(sc: Scorecard, rc: ReviewConfig) -> Check:
    if rc.ttft_ms_p99 is None and rc.itl_ms_p99 is None and rc.e2e_ms is None:
        return Check("latency", OFF, "no latency SLO set")
    sp = sc.speed
    if not sp.points:
        return Check("latency", UNKNOWN, "not checked: no speed results")
    at = sp.at_load
    if at is None:
        return Check("latency", UNKNOWN, f"not checked: {sp.load_how}")
    if at.goodput:
        text, cite, fails, excess, crits = _attainment(at, at.goodput, sp, rc)
    else:
        judged = _p99s(at, sp, rc)
        if judged is None:
            return Check("latency", UNKNOWN, f"not checked: no per-request data and no p99 latency at {at.label}")
        text, cite, fails, excess, crits = judged
    if rc.load_rps is not None and sp.ceiling is not None and sp.ceiling.rps is not None:
        ceiling = sp.ceiling.rps
        lower_bound = ceiling_is_floor(sp)
        text += f"; ceiling {'>= ' if lower_bound else ''}{ceiling:.2f} req/s"
        # a rate sweep's level at the load that kept pace with it (not saturated) sustained the load, whatever
        # its whole-run rate (ramp-up and drain read low on a short run)
        kept_up = (
            sp.mode == "rate"
            and at.load >= rc.load_rps
            and any(lv.load == at.load and lv.saturated is False for lv in sp.points)
        )
        below = ceiling < rc.load_rps and not lower_bound and not kept_up
        if below:
            fails.append(f"its ceiling {ceiling:.2f} req/s is below the {rc.load_rps:g} req/s load")
            excess = max(excess, (rc.load_rps - ceiling) / rc.load_rps)
        note = "a lower bound (no point saturated, or the sweep stopped early): never fails" if lower_bound else ""
        crits.append(
            _criterion(
                CriterionMetric.CEILING_RPS,
                sp.ceiling.label or "",
                "load_rps",
                ">=",
                rc.load_rps,
                ceiling,
                ok=not below,
                note=note,
            )
        )
    if fails:
        return Check("latency", FAIL, text, shortfall="; ".join(fails), excess=excess, cite=cite, criteria=crits)
    return Check("latency", PASS, text, cite=cite, criteria=crits)


def checks(sc: Scorecard, rc: ReviewConfig) -> dict[str, Check]:
    """The three checks of one scheme, keyed by constraint."""
    accuracy = with_kld_constraint(accuracy_check(sc, rc), sc, rc, floor_test_of)
    return {"memory": memory_check(sc, rc), "accuracy": accuracy, "latency": latency_check(sc, rc)}


def passes(cs: dict[str, Check]) -> bool:
    """No check fails or is unknown."""
    return all(c.status in NON_BLOCKING for c in cs.values())


# --- ordering and the verdict -----------------------------------------------------------------------


def kv_step(sc: Scorecard) -> int:
    """1 for a quantized KV cache, else 0."""
    return 0 if sc.kv in ("auto", "") else 1


def lever_of(sc: Scorecard) -> str:
    """``weights``, ``KV cache``, ``weights and KV cache``, or ``""``."""
    pulled = [name for name, on in (("weights", sc.tier > 0), ("KV cache", kv_step(sc) > 0)) if on]
    return " and ".join(pulled)


def kv_lever(base: Scorecard, cs: dict[str, Check], cards: list[Scorecard], rc: ReviewConfig) -> dict[str, Any]:
    """The KV lever weighed on the baseline: whether its failing memory check binds on the weights (they alone,
    with recurrent state and reserve, exceed the budget) or on the KV cache, and its need with an FP8 cache
    (``need_gib_kv_fp8`` of :func:`quantverdict.review.memory.memory_summary`).

    Returns:
        ``{"binds_on": "kv_cache" | "weights" | None, "need_gib", "budget_gib", "weights_gib", "kv_gib",
        "fp8_need_gib", "fp8_fits", "measured" (quantized-cache schemes that finished ok)}``.
    """
    m = base.memory
    out: dict[str, Any] = {
        "binds_on": None,
        "need_gib": m.need_gib,
        "budget_gib": rc.memory_budget_gib,
        "weights_gib": m.weights_gib,
        "kv_gib": m.kv_needed_gib,
        "fp8_need_gib": m.need_gib_kv_fp8,
        "fp8_fits": None,
        "measured": [sc.scheme for sc in cards if kv_step(sc) and sc.status == "ok"],  # refused/failed: not measured
    }
    budget = rc.memory_budget_gib
    if budget is not None and out["fp8_need_gib"] is not None:
        out["fp8_fits"] = out["fp8_need_gib"] <= budget
    if cs["memory"].status != FAIL or budget is None or m.weights_gib is None:
        return out
    fixed = m.weights_gib + (m.state_needed_gib or 0.0) + rc.reserved_gib
    out["binds_on"] = "weights" if fixed > budget else "kv_cache"
    return out


def candidate_order(cards: list[Scorecard]) -> list[Scorecard]:
    """Least aggressive first: levers pulled (one per 8-bit step of the weights, one for a quantized KV
    cache), then weight tier (16-bit weights with an FP8 cache before 8-bit weights), then lowest E2E p50 at the load,
    highest ceiling (req/s), name."""

    def key(sc: Scorecard) -> tuple[int, int, float, float, str]:
        sp = sc.speed
        e2e = sp.at_load.e2e_ms_p50 if sp.at_load else None
        steps = sc.tier + kv_step(sc)  # levers pulled: one per 8-bit step of the weights, one for an FP8 cache
        top = sp.ceiling.rps if sp.ceiling else None
        return (steps, sc.tier, e2e if e2e is not None else math.inf, -(top or 0.0), sc.scheme)

    return sorted(cards, key=key)


def _three(cs: dict[str, Check]) -> str:
    """The three numbers of one scheme as the verdict cites them."""
    m, a, lat = cs["memory"], cs["accuracy"], cs["latency"]
    mem = "has no memory budget to meet" if m.status == OFF else m.short()
    if a.status == OFF:
        acc = "has no accuracy floor to meet"
    elif a.status == NOT_APPLICABLE:
        acc = a.short()
    else:
        acc = a.short() if a.status != PASS or a.cite == "is the accuracy reference" else f"keeps {a.short()}"
    if lat.status == OFF:
        latency = "has no latency SLO to meet"
    else:
        latency = lat.short() if lat.status == UNKNOWN else f"holds {lat.short()}"
    return f"{mem}, {acc}, and {latency}"


def _cite(cs: dict[str, Check]) -> str:
    return "; ".join(f"{c.constraint}: {c.text}" for c in cs.values())


def short_error(error: str | None, limit: int = 160) -> str:
    """The first line of an error message, cut to ``limit`` characters."""
    line = (error or "no error message").strip().splitlines()[0] if (error or "").strip() else "no error message"
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _eligible(sc: Scorecard, cs: dict[str, Check]) -> bool:
    """Passes all three and its job finished ok."""
    return sc.status == "ok" and passes(cs)


def _why_not(sc: Scorecard, cs: dict[str, Check]) -> str:
    fails = [c for c in cs.values() if c.status == FAIL]
    unknown = [c for c in cs.values() if c.status == UNKNOWN]
    if sc.status == "interrupted":  # the process was stopped from outside (machine given back), no error
        bits = [f"its job was interrupted in stage {sc.failed_stage} (stopped from outside before it finished)"]
    elif sc.status == "running":  # read while running, or stopped from outside without bench_gpu's marking
        bits = [f"its job has not finished (still running, or stopped from outside, in stage {sc.failed_stage})"]
    else:
        bits = [f"its job failed in stage {sc.failed_stage} ({short_error(sc.error)})"] if sc.status != "ok" else []
    bits += [f"fails {c.constraint}: {c.shortfall}" for c in fails]
    bits += [f"cannot be checked on {c.constraint} ({c.text.removeprefix('not checked: ')})" for c in unknown]
    return "; ".join(bits)


def decide(model: str, cards: list[Scorecard], rc: ReviewConfig) -> tuple[Verdict, dict[str, dict[str, Check]]]:
    """The verdict for one model's scorecards, and every scheme's checks (keyed by scheme)."""
    all_checks = {sc.scheme: checks(sc, rc) for sc in cards}
    base = next((sc for sc in cards if sc.is_baseline), None)
    quantized = [sc for sc in cards if not sc.is_baseline]
    order = candidate_order(quantized)
    v = Verdict(model, "", None, None, "", order=[sc.scheme for sc in order])
    v.accuracy_not_measured = next((sc.accuracy_not_applicable for sc in cards if sc.accuracy_not_applicable), "")
    _decide(model, v, base, order, all_checks)
    if base is not None:
        v.kv_lever = kv_lever(base, all_checks[base.scheme], cards, rc)
        chosen = next((sc for sc in cards if sc.scheme == v.scheme), None) if v.decision == "quantize" else None
        v.lever = lever_of(chosen) if chosen is not None else ""
    return v, all_checks


def passed_over(sc: Scorecard, cs: dict[str, Check], if_eligible: PassReason, sentence: str) -> PassedOver:
    """Why ``sc`` was not chosen, typed: job not ok, else a failing check, else an unknown one, else
    ``if_eligible``."""
    fails = [ConstraintKind(c.constraint) for c in cs.values() if c.status == FAIL]
    unknown = [ConstraintKind(c.constraint) for c in cs.values() if c.status == UNKNOWN]
    job = {"interrupted": PassReason.JOB_INTERRUPTED, "running": PassReason.JOB_NOT_FINISHED}
    if sc.status != "ok":
        reason = job.get(sc.status, PassReason.JOB_FAILED)
    else:
        reason = PassReason.FAILS_CONSTRAINT if fails else PassReason.NOT_CHECKED if unknown else if_eligible
    return PassedOver(
        scheme=sc.scheme,
        label=sc.label,
        reason=reason,
        job_status=JobStatus(sc.status),
        failed_stage=sc.failed_stage,
        fails=fails,
        not_checked=unknown,
        criteria=[k for c in cs.values() if c.status in (FAIL, UNKNOWN) for k in c.criteria if k.outcome != PASS],
        sentence=sentence,
    )


def _other(v: Verdict, sc: Scorecard, cs: dict[str, Check], if_eligible: PassReason, tail: str) -> None:
    """``sc`` not chosen: its sentence in ``v.others``, its reason in ``v.passed_over``."""
    v.others.append(f"{sc.name}: {tail}")
    v.passed_over.append(passed_over(sc, cs, if_eligible, v.others[-1]))


def _decide(
    model: str, v: Verdict, base: Scorecard | None, order: list[Scorecard], all_checks: dict[str, dict[str, Check]]
) -> None:
    """Fill ``v``: decision, sentence, evidence, others (memory and latency alone where accuracy was not measured)."""
    alone = "On memory and speed alone: " if v.accuracy_not_measured else ""
    three = "both memory and latency" if v.accuracy_not_measured else "all three"
    if base is None:
        v.decision = Decision.NO_BASELINE
        v.sentence = (
            f"**No verdict for {model}: its baseline did not run**, so no accuracy delta can be computed "
            "and 'do not quantize' cannot be weighed."
        )
        for sc in order:
            _other(v, sc, all_checks[sc.scheme], PassReason.NO_VERDICT, _cite(all_checks[sc.scheme]))
        return
    bc = all_checks[base.scheme]
    v.binding_constraints = [c.constraint for c in bc.values() if c.status == FAIL]
    unverified = [c for c in bc.values() if c.status == UNKNOWN]
    if not v.binding_constraints and (unverified or base.status != "ok"):
        v.decision = Decision.BASELINE_NOT_CHECKED
        hint = {"memory": "review.memory_budget_gib=null", "latency": "review.ttft_ms_p99=null review.itl_ms_p99=null"}
        offs = " ".join(hint[c.constraint] for c in unverified if c.constraint in hint)
        if unverified:
            names = " and ".join(c.constraint for c in unverified)
            what = f"could not be checked on {names}** (" + "; ".join(f"{c.constraint} {c.text}" for c in unverified)
            what += ")"
        else:
            what = f"did not finish** (job {base.status} in stage {base.failed_stage}: {short_error(base.error)})"
        v.sentence = (
            f"**No verdict for {model}: {base.name} {what}. Whether to quantize at all depends on the baseline; "
            "rerun its missing stages" + (f" or review without that constraint ({offs})." if offs else ".")
        )
        for sc in order:
            cs = all_checks[sc.scheme]
            _other(v, sc, cs, PassReason.NO_VERDICT, f"passes {three}" if _eligible(sc, cs) else _why_not(sc, cs))
        return
    if not v.binding_constraints:
        v.decision, v.scheme, v.label = Decision.DO_NOT_QUANTIZE, base.scheme, base.label
        head = f"{alone}do not quantize, keep {base.name}." if alone else f"Do not quantize: keep {base.name}."
        v.sentence = f"**{head}** No constraint binds: it {_three(bc)}."
        v.evidence = [f"{base.name} {c.constraint}: {c.text}" for c in bc.values()]
        for sc in order:
            cs = all_checks[sc.scheme]
            tail = f"would also pass {three}, but nothing needs it" if _eligible(sc, cs) else _why_not(sc, cs)
            _other(v, sc, cs, PassReason.NOT_NEEDED, tail)
        return
    chosen = next((sc for sc in order if _eligible(sc, all_checks[sc.scheme])), None)
    binding_names = ", ".join(c.constraint for c in bc.values() if c.status == FAIL)
    if chosen is None:
        v.decision = Decision.NO_SCHEME
        ranked = sorted(
            order,
            key=lambda sc: (
                sum(c.status not in NON_BLOCKING for c in all_checks[sc.scheme].values()),
                sum(c.excess for c in all_checks[sc.scheme].values()),
            ),
        )
        closest = ranked[0] if ranked else None
        v.sentence = (
            f"**No scheme meets {three} constraints for {model}.** {base.name} fails {binding_names} "
            f"({'; '.join(c.shortfall for c in bc.values() if c.status == FAIL)})"
        )
        if closest is not None:
            v.sentence += (
                f"; the closest is {closest.name}: {_why_not(closest, all_checks[closest.scheme])}. "
                "Relax that constraint or measure more schemes."
            )
        else:
            v.sentence += "; no quantized scheme ran."
        if closest is not None:
            v.evidence = [f"{closest.name} {c.constraint}: {c.text}" for c in all_checks[closest.scheme].values()]
        for sc in order:
            _other(v, sc, all_checks[sc.scheme], PassReason.NO_VERDICT, _why_not(sc, all_checks[sc.scheme]))
        return
    cc = all_checks[chosen.scheme]
    v.decision, v.scheme, v.label = Decision.QUANTIZE, chosen.scheme, chosen.label
    same_tier = [
        sc for sc in order if sc.tier == chosen.tier and sc is not chosen and _eligible(sc, all_checks[sc.scheme])
    ]
    tier_name = f"{TIER_NAMES.get(chosen.tier, chosen.tier)} tier"
    if kv_step(chosen):  # a combination with a quantized cache: both levers named
        weights = "16-bit" if chosen.tier == 0 else TIER_NAMES.get(chosen.tier, str(chosen.tier))
        tier_name = f"{weights} weights with a quantized KV cache ({chosen.kv})"
    why_tier = f"the least aggressive scheme that meets {three} ({tier_name}"
    if same_tier:
        e2e = chosen.speed.at_load.e2e_ms_p50 if chosen.speed.at_load else None
        why_tier += f"; E2E p50 {_n(e2e, ',.0f')} ms at the load, ahead of " + ", ".join(sc.scheme for sc in same_tier)
    why_tier += ")"
    v.sentence = (
        f"**{alone}{'deploy' if alone else 'Deploy'} {chosen.name}.** {base.name} fails {binding_names} "
        f"({'; '.join(c.shortfall for c in bc.values() if c.status == FAIL)}). "
        f"{chosen.name} {_three(cc)}: {why_tier}."
    )
    v.evidence = [f"{chosen.name} {c.constraint}: {c.text}" for c in cc.values()]
    for sc in order:
        if sc is chosen:
            continue
        cs = all_checks[sc.scheme]
        more = sc.tier > chosen.tier
        why = PassReason.MORE_AGGRESSIVE if more else PassReason.SLOWER_SAME_TIER
        if _eligible(sc, cs):
            tail = f"passes {three} too, not chosen ({'more aggressive' if more else 'same tier, slower at the load'})"
            _other(v, sc, cs, why, tail)
        else:
            _other(v, sc, cs, why, _why_not(sc, cs))
    return


# --- regime -----------------------------------------------------------------------------------------

# the metrics paired by repeat against the baseline, per load level: (point key, higher is better, name)
PAIRED_METRICS = (
    ("output_tok_s", True, "output tok/s"),
    ("itl_ms_p50", False, "ITL p50"),
    ("tpot_ms_p50", False, "TPOT p50"),
)
LOW_LOAD_METRICS = ("itl_ms_p50", "tpot_ms_p50")  # the low-load claim: ITL p50 (as today's rule), else TPOT p50
SATURATION_METRIC = "output_tok_s"  # the saturation claim: output tok/s at the highest load both sweeps measured
PAIRED_WORDS = {"faster": "pays", "slower": "costs"}  # a paired verdict -> the regime class it stands for


def ceilings_differ_in_basis(cards: list[Scorecard]) -> bool:
    """Whether the ceilings rest on different windows (``speed.ceiling_basis``: steady window,
    whole run, or mixed over repeats); :func:`speedups` then compares whole runs."""
    bases = {c.basis for sc in cards if (c := sc.speed.ceiling) and c.output_tok_s} - {None}
    return len(bases) > 1 or "mixed" in bases


def speedups(sc: Scorecard, base: Scorecard) -> tuple[float | None, float | None]:
    """(low-load, saturation) speedup of ``sc`` over ``base`` (> 1 is faster): baseline ITL p50 over the scheme's
    at the lowest load both measured (:func:`_low_itl`), and ceiling output tok/s over the baseline's
    (:func:`_ceilings`); None where missing or not comparable for speed."""
    if not sc.speed.comparable or not base.speed.comparable:
        return None, None
    (a, _), (b, _) = _low_itl(sc, base)
    low = b / a if a and b else None
    (c, _), (d, _) = _ceilings(sc, base)
    sat = c / d if c and d else None
    return low, sat


def _ceilings(sc: Scorecard, base: Scorecard) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """``((ceiling output tok/s, [min, max]) of the scheme, the same of the baseline)`` on one window: the whole
    runs (``ceiling_whole_run_tok_s``) when the bases differ (:func:`ceilings_differ_in_basis`), else the ceilings."""
    a, b = sc.speed.ceiling or _NO_CEILING, base.speed.ceiling or _NO_CEILING
    if ceilings_differ_in_basis([sc, base]) and a.whole_run_output_tok_s and b.whole_run_output_tok_s:
        return (
            (a.whole_run_output_tok_s, _pair(a.whole_run_output_tok_s_range)),
            (b.whole_run_output_tok_s, _pair(b.whole_run_output_tok_s_range)),
        )
    return (a.output_tok_s, _pair(a.output_tok_s_range)), (b.output_tok_s, _pair(b.output_tok_s_range))


_NO_CEILING = Ceiling.model_validate(dict.fromkeys(Ceiling.model_fields) | {"kind": "none", "lower_bound": False})


def _pair(r: MinMax | None) -> tuple[float, float] | None:
    return None if r is None else (r.min, r.max)


def _low_itl(sc: Scorecard, base: Scorecard) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """``((ITL p50, [min, max]) of the scheme, the same of the baseline)`` at the lowest load both measured
    (``single_itl_ms_p50`` for cards without points; Nones without a common load)."""
    mine = {p.load: p for p in sc.speed.points}
    theirs = {p.load: p for p in base.speed.points}
    common = sorted(set(mine) & set(theirs))
    if not common:  # (points without a low load have none either)
        return (None, None), (None, None)
    a, b = mine[common[0]], theirs[common[0]]
    return (
        (a.itl_ms_p50, _pair(a.spread.get("itl_ms_p50"))),
        (b.itl_ms_p50, _pair(b.spread.get("itl_ms_p50"))),
    )


def speedup_intervals(sc: Scorecard, base: Scorecard) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
    """The min-max range over repeats of each speedup of :func:`speedups` (``[b_min / a_max, b_max /
    a_min]``); None where a range or the speedup is missing."""
    low, sat = speedups(sc, base)

    def iv(num: Any, den: Any, invert: bool) -> tuple[float, float] | None:
        if not num or not den or min(num[0], den[0]) <= 0:
            return None
        if invert:  # baseline / scheme
            return den[0] / num[1], den[1] / num[0]
        return num[0] / den[1], num[1] / den[0]

    (_, mine), (_, theirs) = _low_itl(sc, base)
    lo = iv(mine, theirs, True)
    (_, mine), (_, theirs) = _ceilings(sc, base)
    sa = iv(mine, theirs, False)
    return (lo if low is not None else None), (sa if sat is not None else None)


def _inverse(v: float | None) -> float | None:
    return None if v is None else 1.0 / v


def paired_speedups(
    sc: Scorecard,
    base: Scorecard,
    mine: tuple[str, list[dict[str, Any]]],
    theirs: tuple[str, list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    """Per metric of :data:`PAIRED_METRICS` and per load, the scheme's ratio to its baseline paired by repeat
    (:func:`quantverdict.measure.stats.paired_ratio`) and as a speedup (the inverse for a latency).

    Args:
        mine, theirs: ``(mode, raw points)`` of the scheme and of the baseline
            (:func:`quantverdict.review.speed.raw_points`).

    Returns:
        Rows with >= 1 pair: ``{"metric", "name", "load" ("inf" unlimited), "label", "pairs", "ratios", "ratio",
        "low", "high", "speedup", "speedup_low", "speedup_high", "verdict"}``; [] when either is not comparable for
        speed or the modes differ.
    """
    (mode, points), (base_mode, base_points) = mine, theirs
    if not sc.speed.comparable or not base.speed.comparable or mode != base_mode:
        return []
    rows = []
    for metric, higher, name in PAIRED_METRICS:
        for e in stats.paired_ratio(points, base_points, metric, mode, higher):
            if not e["pairs"]:
                continue
            load = e["load"]
            label = load_label({"load": load, "concurrency": load}, mode)
            if higher:
                sp, sp_low, sp_high = e["ratio"], e["low"], e["high"]
            else:
                sp, sp_low, sp_high = _inverse(e["ratio"]), _inverse(e["high"]), _inverse(e["low"])
            rows.append(
                {
                    "metric": metric,
                    "name": name,
                    "load": "inf" if math.isinf(load) else load,
                    "label": label,
                    "pairs": e["pairs"],
                    "ratios": e["ratios"],
                    "ratio": e["ratio"],
                    "low": e["low"],
                    "high": e["high"],
                    "speedup": sp,
                    "speedup_low": sp_low,
                    "speedup_high": sp_high,
                    "verdict": e["verdict"],
                }
            )
    return rows


def regime_tests(paired: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The paired rows the regime claims rest on: at low load the lowest load's ITL p50 (else TPOT p50), at
    saturation the highest load's output tok/s; None under 2 pairs."""

    def pick(metrics: tuple[str, ...], highest: bool) -> dict[str, Any] | None:
        for metric in metrics:
            rows = [r for r in paired if r["metric"] == metric]
            if rows:
                row = max(rows, key=_load_key) if highest else min(rows, key=_load_key)
                return row if row["pairs"] >= 2 else None
        return None

    return pick(LOW_LOAD_METRICS, False), pick((SATURATION_METRIC,), True)


def _load_key(row: dict[str, Any]) -> float:
    return math.inf if row["load"] == "inf" else float(row["load"])


def regime_side(
    median: float | None, rng: tuple[float, float] | None, test: dict[str, Any] | None
) -> dict[str, Any] | None:
    """One regime claim and its rule: with a paired test (>= 2 pairs) its speedup, 95% interval and verdict
    (an established difference inside (1 / 1.05, 1.05) is ``no change``); else the median speedup and its min-max range
    (``pays`` when the whole range is >= :data:`PAYS`, ``costs`` when <= 1 / :data:`PAYS`).

    Returns:
        ``{"rule", "speedup", "low", "high", "pairs", "load", "metric", "word", "class", "note"}``; None without a
        median or a test.
    """
    if test is not None and test["pairs"] >= 2:
        v = test["verdict"]
        cls = PAIRED_WORDS.get(v, "no change")
        # established is not the same as large: a significant 1.01x neither pays nor costs (the 1.05x of the
        # single-run rule applies to the point estimate)
        small = cls != "no change" and 1 / PAYS < test["speedup"] < PAYS
        if small:
            cls = "no change"
        note = (
            f"{test['label']}, {test['name']}; {v}"
            + (f" but under {PAYS:g}x" if small else "")
            + f": paired t over n={test['pairs']} repeats, 95% CI [{test['speedup_low']:.2f}, "
            f"{test['speedup_high']:.2f}]"
        )
        return {
            "rule": "paired t",
            "speedup": test["speedup"],
            "low": test["speedup_low"],
            "high": test["speedup_high"],
            "pairs": test["pairs"],
            "load": test["load"],
            "metric": test["metric"],
            "word": v + (f", under {PAYS:g}x" if small else ""),
            "class": cls,
            "note": note,
        }
    if median is None:
        return None
    ranged = bool(rng and rng[0] != rng[1])
    lo, hi = rng if rng and ranged else (median, median)
    cls = "pays" if lo >= PAYS else "costs" if hi <= 1 / PAYS else "no change"
    if ranged:
        note = f"min-max range over repeats, no paired test; {PAYS:g}x rule on the whole range: {cls}"
    else:
        note = f"single run, no interval; {PAYS:g}x rule: {cls}"
    return {
        "rule": "min-max range" if ranged else "single run",
        "speedup": median,
        "low": lo if ranged else None,
        "high": hi if ranged else None,
        "pairs": None,
        "load": None,
        "metric": None,
        "word": cls,
        "class": cls,
        "note": note,
    }


def saturation_gap(sc: Scorecard, base: Scorecard) -> str | None:
    """Why no saturation speedup can be claimed (a sweep with planned levels left unmeasured, sweeps ending at
    different loads, one load in common); None when it can."""
    mine, theirs = sc.speed.points, base.speed.points
    if not mine or not theirs or not sc.speed.comparable or not base.speed.comparable:
        return None  # speed missing or not compared: regime_reading says so
    if sc.speed.stopped_before:
        return f"{sc.scheme}'s sweep has no valid point at {', '.join(sc.speed.stopped_before)}"
    if base.speed.stopped_before:
        return f"the baseline's sweep has no valid point at {', '.join(base.speed.stopped_before)}"
    if mine[-1].load != theirs[-1].load:
        return f"the sweeps end at different loads ({mine[-1].label}; the baseline's {theirs[-1].label})"
    common = {p.load for p in mine} & {p.load for p in theirs}
    if len(common) == 1:
        return f"one load level measured by both ({mine[-1].label}): its speedup is the low-load claim"
    return None


def regime_reading(
    sc: Scorecard, lo_side: dict[str, Any] | None, sat_side: dict[str, Any] | None, sat_gap: str | None = None
) -> RegimeReading:
    """Where the scheme pays, from the classes of its two claims (:func:`regime_side`); ``saturation_not_measured``
    when ``sat_gap`` says why no saturation claim is made."""
    if not sc.speed.comparable:
        return RegimeReading.EXCLUDED
    if lo_side is not None and sat_gap is not None:
        return RegimeReading.SATURATION_NOT_MEASURED
    if lo_side is None or sat_side is None:
        return RegimeReading.SPEED_MISSING
    low, sat = lo_side["class"] == "pays", sat_side["class"] == "pays"
    if low:
        return RegimeReading.KEEPS_PAYING if sat else RegimeReading.PAYS_AT_LOW_LOAD_ONLY
    return RegimeReading.PAYS_AT_SATURATION_ONLY if sat else RegimeReading.DOES_NOT_PAY
