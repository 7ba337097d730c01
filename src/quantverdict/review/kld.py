"""The KL divergence to the baseline: ``accuracy.kld`` (:class:`quantverdict.measure.kld.KldSummary` fields, the
baseline's entry, or ``{"refused": reason}``) becomes :class:`AccuracyDelta` of kind ``kld``; ``review.max_mean_kld``
and ``review.min_top1_agreement_pct`` join the accuracy check. A top-k KLD is a lower bound of the true one: failing
on it is failing, passing is the bound's pass."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

from quantverdict.config.schema import ReviewConfig
from quantverdict.measure.stats import Interval
from quantverdict.results.record import Block, JobRecord
from quantverdict.review.document import (
    AccuracyDelta,
    Check,
    Criterion,
    CriterionMetric,
    DeltaKind,
    KldFigures,
    Outcome,
)
from quantverdict.review.document import Interval as DocInterval
from quantverdict.review.scorecard import Scorecard
from quantverdict.review.speed import finite
from quantverdict.review.words import say

KLD = DeltaKind.KLD  # the kind and name of the KLD deltas
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


FloorTest = Callable[[AccuracyDelta, ReviewConfig], str]


class _KldEntry(Block):
    """``accuracy.kld``: ``role`` ``baseline`` on the baseline's entry, ``refused`` why a scheme could not compare."""

    role: str | None = None
    refused: str | None = None


def _interval(f: KldFigures, estimate: float, low: float | None, high: float | None) -> DocInterval | None:
    method = f.interval_method or "paired bootstrap over windows"
    return None if low is None or high is None else DocInterval.of(Interval(estimate, low, high, method))


def kld_deltas(rec: JobRecord) -> list[AccuracyDelta]:
    """The KLD deltas of one scheme's record: mean KLD (nats, baseline 0) and top-1 agreement (%, baseline 100; its
    own recovery), each with the record's figures (``kld``); one ``refused`` delta (value None, the reason in
    ``note``) when the job could not compare; [] for the baseline and for a record without a KLD."""
    if rec.accuracy.kld is None or (entry := _KldEntry.of(rec.accuracy.kld)).role == "baseline":
        return []
    # the summary's figures, non-finite ones None (the entry's other keys are the job's bookkeeping)
    known = {k: v for k, v in entry.model_dump().items() if k in KldFigures.model_fields}
    f = KldFigures.model_validate({k: finite(v) if isinstance(v, float) else v for k, v in known.items()})
    if entry.refused is not None or f.mean_kld is None:
        why = f"KL divergence not compared: {entry.refused or 'no mean KLD in the record'}"
        return [AccuracyDelta.new(KLD, REFUSED, KLD, math.nan, 0.0, note=why, kld=f)]
    agree, lo, hi = float(f.top1_agreement_pct or 0.0), f.top1_agreement_pct_ci_low, f.top1_agreement_pct_ci_high
    mean_iv = _interval(f, f.mean_kld, f.mean_kld_ci_low, f.mean_kld_ci_high)
    top1_iv = None if lo is None or hi is None else _interval(f, agree - 100.0, lo - 100.0, hi - 100.0)
    return [
        AccuracyDelta.new(KLD, MEAN, KLD, f.mean_kld, 0.0, delta=f.mean_kld, interval=mean_iv, n=f.n_tokens, kld=f),
        AccuracyDelta.new(
            KLD,
            TOP1,
            KLD,
            agree,
            100.0,
            delta=agree - 100.0,
            interval=top1_iv,
            n=f.n_tokens,
            kld=f,
            recovery_pct=agree,
            recovery_interval=_interval(f, agree, lo, hi),
        ),
    ]


# the KLD limits: (delta metric, criterion metric, review key, comparison)
_LIMITS: tuple[tuple[str, CriterionMetric, str, Literal["<=", ">="]], ...] = (
    (MEAN, CriterionMetric.MEAN_KLD_NATS, "max_mean_kld", "<="),
    (TOP1, CriterionMetric.TOP1_AGREEMENT_PCT, "min_top1_agreement_pct", ">="),
)


def with_kld_constraint(check: Check, sc: Scorecard, rc: ReviewConfig, floor_test_of: FloorTest) -> Check:
    """``check`` (the accuracy check of ``sc``) with the KLD limits added as criteria, each judged on the delta's
    value or, under the interval test, its interval's end nearest to passing. Unchanged when neither limit is set,
    accuracy is not applicable or the deltas were refused; the baseline is the reference; a scheme without a KLD
    becomes ``unknown`` unless it already fails."""
    if rc.max_mean_kld is None and rc.min_top1_agreement_pct is None:
        return check
    if check.outcome == NOT_APPLICABLE or sc.accuracy_refused or (sc.is_baseline and check.outcome != OFF):
        return check
    if sc.is_baseline:
        reference = "the accuracy reference (KLD 0, top-1 agreement 100% by definition)"
        return check.model_copy(update={"outcome": PASS, "text": reference, "cite": "is the accuracy reference"})
    off = check.outcome == OFF
    texts, cites = ([], []) if off else ([check.text], [check.cite])
    kld = [d for d in sc.accuracy if d.kind == KLD]
    by = {d.metric: d for d in kld if d.metric != REFUSED}
    limits = [(s, m, key, op, t) for s, m, key, op in _LIMITS if (t := getattr(rc, key)) is not None]
    if not by:
        why = next((d.note for d in kld), "no KL divergence in the record")
        unmeasured = [_criterion(m, s, key, op, t, None, note=why) for s, m, key, op, t in limits]
        update: dict[str, Any] = {"outcome": FAIL if check.outcome == FAIL else UNKNOWN}
        update["text"] = "; ".join(t for t in (*texts, f"KLD limits not checked: {why}") if t)
        update["cite"] = "; ".join(c for c in (*cites, "KLD not measured") if c)
        return check.model_copy(update=update | {"criteria": [*check.criteria, *unmeasured]})
    crits, fails = [], list[tuple[float, str]]()
    for subject, metric, key, op, threshold in limits:
        if (d := by.get(subject)) is None or d.value is None:
            continue
        iv = d.interval if subject == MEAN else d.recovery_interval
        end = None if floor_test_of(d, rc) != "interval" or iv is None else iv.low if op == "<=" else iv.high
        test: Literal["point", "interval"] = "point" if end is None else "interval"
        crit = _criterion(metric, subject, key, op, threshold, d.value, judged=end, test=test)
        ok = crit.outcome == PASS
        crits.append(crit)
        texts.append(say("kld_limit", d=d, threshold=threshold, ok=ok, end=end))
        cites.append(say("kld_limit", d=d, threshold=threshold, ok=ok, end=None))
        if not ok:
            gap = d.value - threshold if op == "<=" else threshold - d.value
            fails.append((gap / max(threshold, 1e-12), say("kld_fails", d=d, threshold=threshold, gap=gap)))
    update = {"text": "; ".join(t for t in texts if t), "cite": " and ".join(c for c in cites if c)}
    update |= {"outcome": PASS if off else check.outcome, "criteria": [*check.criteria, *crits]}
    if fails:
        fails.sort(reverse=True)
        update |= {"outcome": FAIL, "excess": max(check.excess, fails[0][0])}
        update["shortfall"] = "; ".join(f for f in (check.shortfall, *(f for _, f in fails)) if f)
    return check.model_copy(update=update)
