"""The KL divergence to the baseline: ``accuracy.kld`` (:class:`quantverdict.measure.kld.KldSummary` fields, the
baseline's entry, or ``{"refused": reason}``) becomes :class:`TaskDelta` of kind ``kld``; ``review.max_mean_kld`` and
``review.min_top1_agreement_pct`` join the accuracy check, judged like the other floors. A top-k KLD is a lower bound
of the true one: failing on it is failing, passing is the bound's pass."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

from quantverdict.config.schema import ReviewConfig
from quantverdict.measure.stats import Interval
from quantverdict.results.record import Block, JobRecord
from quantverdict.review.document import Check, Criterion, CriterionMetric, KldFigures, Outcome
from quantverdict.review.scorecard import Scorecard, TaskDelta
from quantverdict.review.speed import finite
from quantverdict.review.words import say

KLD = "kld"  # TaskDelta.kind and .name of the KLD deltas
MEAN, TOP1 = "mean_kld", "top1_agreement_pct"
REFUSED = "refused"
# the check statuses by the short names the checks use (review.verdict imports them from here)
PASS, FAIL, UNKNOWN, OFF = Outcome.PASS, Outcome.FAIL, Outcome.UNKNOWN, Outcome.OFF
NOT_APPLICABLE = Outcome.NOT_APPLICABLE
_finite = finite  # the name review.verdict imports


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
    """``judged`` (default ``observed``) held against ``threshold``; the outcome is ``ok`` where given, else the
    comparison; ``unknown`` without a finite value."""
    value = finite(observed if judged is None else judged)
    if ok is None and value is not None:
        ok = value <= threshold if comparison == "<=" else value >= threshold
    outcome = UNKNOWN if ok is None or value is None else PASS if ok else FAIL
    v: dict[str, Any] = dict(metric=metric, subject=subject, limit=limit, comparison=comparison, threshold=threshold)
    v |= dict(observed=finite(observed), judged=value, test=test, outcome=outcome, note=note)
    return Criterion.model_validate(v)


FloorTest = Callable[[TaskDelta, ReviewConfig], str]


class _KldEntry(Block):
    """``accuracy.kld``: ``role`` ``baseline`` on the baseline's entry, ``refused`` why a scheme could not compare."""

    role: str | None = None
    refused: str | None = None


def _interval(estimate: float, low: float | None, high: float | None, method: str | None) -> Interval | None:
    if low is None or high is None:
        return None
    return Interval(estimate, float(low), float(high), method or "paired bootstrap over windows")


def kld_deltas(rec: JobRecord) -> list[TaskDelta]:
    """The KLD deltas of one scheme's record: mean KLD (nats, baseline 0) and top-1 agreement (%, baseline 100),
    each with the record's figures (``kld``); one ``refused`` delta (value NaN, the reason in ``note``) when the
    job could not compare; [] for the baseline and for a record without a KLD (``eval.kld.enabled=false``)."""
    if rec.accuracy.kld is None:
        return []
    entry = _KldEntry.of(rec.accuracy.kld)
    if entry.role == "baseline":
        return []
    # the summary's figures, non-finite ones None (the entry's other keys are the job's bookkeeping)
    known = {k: v for k, v in entry.model_dump().items() if k in KldFigures.model_fields}
    f = KldFigures.model_validate(
        {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in known.items()}
    )
    if entry.refused is not None or f.mean_kld is None:
        why = entry.refused or "no mean KLD in the record"
        return [TaskDelta(KLD, REFUSED, KLD, math.nan, 0.0, note=f"KL divergence not compared: {why}", kld=f)]
    method, n, agree = f.interval_method, f.n_tokens, float(f.top1_agreement_pct or 0.0)
    mean_iv = _interval(f.mean_kld, f.mean_kld_ci_low, f.mean_kld_ci_high, method)
    mean = TaskDelta(KLD, MEAN, KLD, f.mean_kld, 0.0, delta=f.mean_kld, interval=mean_iv, n=n, kld=f)
    iv = _interval(agree, f.top1_agreement_pct_ci_low, f.top1_agreement_pct_ci_high, method)
    top1_iv = None if iv is None else Interval(iv.estimate - 100.0, iv.low - 100.0, iv.high - 100.0, iv.method)
    top1 = TaskDelta(KLD, TOP1, KLD, agree, 100.0, delta=agree - 100.0, interval=top1_iv, n=n, kld=f)
    top1.recovery_pct, top1.recovery_interval = agree, iv  # the agreement is its own recovery (baseline 100%)
    return [mean, top1]


def _kld_of(sc: Scorecard) -> list[TaskDelta]:
    return [d for d in sc.accuracy if d.kind == KLD]


# the KLD limits: (delta metric, criterion metric, review key, comparison)
_LIMITS: tuple[tuple[str, CriterionMetric, str, Literal["<=", ">="]], ...] = (
    (MEAN, CriterionMetric.MEAN_KLD_NATS, "max_mean_kld", "<="),
    (TOP1, CriterionMetric.TOP1_AGREEMENT_PCT, "min_top1_agreement_pct", ">="),
)


def _verdict_parts(
    ds: list[TaskDelta], rc: ReviewConfig, floor_test_of: FloorTest
) -> tuple[list[str], list[str], list[tuple[float, str]], list[Criterion]]:
    """(text parts, cite parts, fails as (excess, sentence), criteria) of the KLD limits for one scheme's deltas."""
    parts, cites, crits = list[str](), list[str](), list[Criterion]()
    fails: list[tuple[float, str]] = []
    by = {d.metric: d for d in ds}
    for subject, metric, key, op in _LIMITS:
        threshold, d = getattr(rc, key), by.get(subject)
        if threshold is None or d is None:
            continue
        iv = d.interval if subject == MEAN else d.recovery_interval  # under the interval test: its end nearest passing
        end = None if floor_test_of(d, rc) != "interval" or iv is None else iv.low if op == "<=" else iv.high
        judged = d.value if end is None else end
        ok = judged <= threshold if op == "<=" else judged >= threshold
        test: Literal["point", "interval"] = "point" if end is None else "interval"
        crits.append(_criterion(metric, subject, key, op, threshold, d.value, judged=judged, test=test, ok=ok))
        parts.append(say("kld_limit", d=d, threshold=threshold, ok=ok, end=end))
        cites.append(say("kld_limit", d=d, threshold=threshold, ok=ok, end=None))
        if not ok:
            gap = d.value - threshold if op == "<=" else threshold - d.value
            fails.append((gap / max(threshold, 1e-12), say("kld_fails", d=d, threshold=threshold, gap=gap)))
    return parts, cites, fails, crits


def _unmeasured(rc: ReviewConfig, why: str) -> list[Criterion]:
    """The KLD limits that are set, each ``unknown``: no KL divergence to hold against them (``why``)."""
    set_ = [(s, m, key, op, t) for s, m, key, op in _LIMITS if (t := getattr(rc, key)) is not None]
    return [_criterion(m, s, key, op, t, None, note=why) for s, m, key, op, t in set_]


def with_kld_constraint(check: Check, sc: Scorecard, rc: ReviewConfig, floor_test_of: FloorTest) -> Check:
    """``check`` (the accuracy check of ``sc``) with the KLD limits added: unchanged when neither is
    set, accuracy is not applicable or the deltas were refused; the baseline is the reference; a scheme without a KLD
    becomes ``unknown`` unless it already fails. Returns a new check."""
    if rc.max_mean_kld is None and rc.min_top1_agreement_pct is None:
        return check
    if check.outcome == NOT_APPLICABLE or sc.accuracy_refused:
        return check
    if sc.is_baseline:
        if check.outcome == OFF:
            reference = "the accuracy reference (KLD 0, top-1 agreement 100% by definition)"
            return check.model_copy(update={"outcome": PASS, "text": reference, "cite": "is the accuracy reference"})
        return check
    ds = [d for d in _kld_of(sc) if d.metric != REFUSED]
    status = PASS if check.outcome == OFF else check.outcome
    text = "" if check.outcome == OFF else check.text
    cite = "" if check.outcome == OFF else check.cite
    if not ds:
        why = next((d.note for d in _kld_of(sc) if d.metric == REFUSED), "no KL divergence in the record")
        text = "; ".join(t for t in (text, f"KLD limits not checked: {why}") if t)
        cite = "; ".join(t for t in (cite, "KLD not measured") if t)
        outcome, criteria = FAIL if status == FAIL else UNKNOWN, [*check.criteria, *_unmeasured(rc, why)]
        return check.model_copy(update={"outcome": outcome, "text": text, "cite": cite, "criteria": criteria})
    parts, cites, fails, crits = _verdict_parts(ds, rc, floor_test_of)
    text = "; ".join(t for t in (text, *parts) if t)
    cite = " and ".join(t for t in (cite, *cites) if t)
    update: dict[str, Any] = {"outcome": status, "text": text, "cite": cite, "criteria": [*check.criteria, *crits]}
    if fails:
        fails.sort(reverse=True)
        update |= {"outcome": FAIL, "excess": max(check.excess, fails[0][0])}
        update["shortfall"] = "; ".join(f for f in (check.shortfall, *(f for _, f in fails)) if f)
    return check.model_copy(update=update)
