"""The KL divergence to the baseline in the review: deltas beside the perplexity delta, and its limits.

``accuracy.kld`` (:class:`quantverdict.measure.kld.KldSummary` fields, the baseline's stored entry, or
``{"refused": reason}``) becomes two :class:`TaskDelta` of kind ``kld`` (mean KLD, top-1 agreement;
:func:`kld_deltas`); :func:`with_kld_constraint` adds ``review.max_mean_kld`` and ``review.min_top1_agreement_pct``
to the accuracy check, judged like the other floors (:func:`quantverdict.review.verdict.floor_test_of`). A top-k KLD
is a lower bound of the true one: failing on it is failing, passing is the bound's pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from quantverdict.config.schema import ReviewConfig
from quantverdict.measure.stats import Interval
from quantverdict.results.record import Block, JobRecord
from quantverdict.review.document import Check, Criterion, CriterionMetric, KldFigures, Outcome
from quantverdict.review.scorecard import Scorecard, TaskDelta

__all__ = ["KLD", "kld_deltas", "with_kld_constraint"]

KLD = "kld"  # TaskDelta.kind and .name of the KLD deltas
MEAN, TOP1 = "mean_kld", "top1_agreement_pct"
REFUSED = "refused"
# the check statuses by the short names the checks use (review.verdict imports them from here)
PASS, FAIL, UNKNOWN, OFF, NOT_APPLICABLE = (
    Outcome.PASS,
    Outcome.FAIL,
    Outcome.UNKNOWN,
    Outcome.OFF,
    Outcome.NOT_APPLICABLE,
)


FloorTest = Callable[[TaskDelta, ReviewConfig], str]


class _KldEntry(Block):
    """``accuracy.kld`` as the job wrote it: ``role`` ``baseline`` on the baseline's stored entry, ``refused`` the
    reason a scheme could not compare."""

    role: str | None = None
    refused: str | None = None


def _figures(entry: _KldEntry) -> KldFigures:
    """The summary's figures (non-finite ones None; the entry's other keys are the job's bookkeeping)."""
    known = {k: v for k, v in entry.model_dump().items() if k in KldFigures.model_fields}
    return KldFigures.model_validate(
        {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in known.items()}
    )


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
    f = _figures(entry)
    if entry.refused is not None or f.mean_kld is None:
        why = entry.refused or "no mean KLD in the record"
        return [TaskDelta(KLD, REFUSED, KLD, math.nan, 0.0, note=f"KL divergence not compared: {why}", kld=f)]
    method, n, agree = f.interval_method, f.n_tokens, float(f.top1_agreement_pct or 0.0)
    mean = TaskDelta(
        KLD,
        MEAN,
        KLD,
        f.mean_kld,
        0.0,
        delta=f.mean_kld,
        interval=_interval(f.mean_kld, f.mean_kld_ci_low, f.mean_kld_ci_high, method),
        n=n,
        kld=f,
    )
    iv = _interval(agree, f.top1_agreement_pct_ci_low, f.top1_agreement_pct_ci_high, method)
    top1 = TaskDelta(
        KLD,
        TOP1,
        KLD,
        agree,
        100.0,
        delta=agree - 100.0,
        interval=None if iv is None else Interval(iv.estimate - 100.0, iv.low - 100.0, iv.high - 100.0, iv.method),
        recovery_pct=agree,
        recovery_interval=iv,
        n=n,
        kld=f,
    )
    return [mean, top1]


def _kld_of(sc: Scorecard) -> list[TaskDelta]:
    return [d for d in sc.accuracy if d.kind == KLD]


def _criterion(
    d: TaskDelta, rc: ReviewConfig, floor_test_of: FloorTest, judged: float, threshold: float, ok: bool
) -> Criterion:
    """The KLD limit (mean KLD) or floor (top-1 agreement) held against ``d``, as :func:`_verdict_parts` judged it."""
    mean = d.metric == MEAN
    iv = d.interval if mean else d.recovery_interval  # without one, the point estimate was judged
    return Criterion(
        metric=CriterionMetric.MEAN_KLD_NATS if mean else CriterionMetric.TOP1_AGREEMENT_PCT,
        subject=d.metric,
        limit="max_mean_kld" if mean else "min_top1_agreement_pct",
        comparison="<=" if mean else ">=",
        threshold=threshold,
        observed=d.value,
        judged=judged,
        test="interval" if floor_test_of(d, rc) == "interval" and iv is not None else "point",
        outcome=PASS if ok else FAIL,
    )


def _unmeasured(rc: ReviewConfig, why: str) -> list[Criterion]:
    """The KLD limits that are set, each ``unknown``: no KL divergence to hold against them (``why``)."""
    limits = (
        (CriterionMetric.MEAN_KLD_NATS, MEAN, "max_mean_kld", "<=", rc.max_mean_kld),
        (CriterionMetric.TOP1_AGREEMENT_PCT, TOP1, "min_top1_agreement_pct", ">=", rc.min_top1_agreement_pct),
    )
    return [
        Criterion(
            metric=metric,
            subject=subject,
            limit=limit,
            comparison="<=" if op == "<=" else ">=",
            threshold=threshold,
            observed=None,
            judged=None,
            test="point",
            outcome=UNKNOWN,
            note=why,
        )
        for metric, subject, limit, op, threshold in limits
        if threshold is not None
    ]


def _verdict_parts(
    ds: list[TaskDelta], rc: ReviewConfig, floor_test_of: FloorTest
) -> tuple[list[str], list[str], list[tuple[float, str]], list[Criterion]]:
    """(text parts, cite parts, fails as (excess, sentence), criteria) of the KLD limits for one scheme's deltas."""
    parts: list[str] = []
    cites: list[str] = []
    fails: list[tuple[float, str]] = []
    crits: list[Criterion] = []
    by = {d.metric: d for d in ds}
    limit = rc.max_mean_kld
    if limit is not None and MEAN in by:
        d = by[MEAN]
        judged = d.value
        how = ""
        if floor_test_of(d, rc) == "interval" and d.interval is not None:
            judged, how = d.interval.low, f" (interval test: its interval starts at {d.interval.low:.4g})"
        ok = judged <= limit
        crits.append(_criterion(d, rc, floor_test_of, judged, limit, ok))
        op = "<=" if ok else ">"
        parts.append(f"mean KLD {d.value:.4g} nats{how} {op} {limit:g}")
        cites.append(f"mean KLD {d.value:.4g} nats {op} {limit:g}")
        if not ok:
            fails.append(
                ((d.value - limit) / max(limit, 1e-12), f"mean KLD {d.value:.4g} nats is over the {limit:g} limit")
            )
    floor = rc.min_top1_agreement_pct
    if floor is not None and TOP1 in by:
        d = by[TOP1]
        judged = d.value
        how = ""
        if floor_test_of(d, rc) == "interval" and d.recovery_interval is not None:
            judged = d.recovery_interval.high
            how = f" (interval test: its interval reaches {d.recovery_interval.high:.2f}%)"
        ok = judged >= floor
        crits.append(_criterion(d, rc, floor_test_of, judged, floor, ok))
        op = ">=" if ok else "<"
        parts.append(f"top-1 agreement {d.value:.2f}%{how} {op} {floor:g}%")
        cites.append(f"top-1 agreement {d.value:.2f}% {op} {floor:g}%")
        if not ok:
            gap = floor - d.value
            fails.append(
                (gap / max(floor, 1e-12), f"top-1 agreement {d.value:.2f}% is {gap:.2f} points below {floor:g}%")
            )
    return parts, cites, fails, crits


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
        refused = next((d.note for d in _kld_of(sc) if d.metric == REFUSED), "no KL divergence in the record")
        extra = f"KLD limits not checked: {refused}"
        return check.model_copy(
            update={
                "outcome": FAIL if status == FAIL else UNKNOWN,
                "text": "; ".join(t for t in (text, extra) if t),
                "cite": "; ".join(t for t in (cite, "KLD not measured") if t),
                "criteria": [*check.criteria, *_unmeasured(rc, refused)],
            }
        )
    parts, cites, fails, crits = _verdict_parts(ds, rc, floor_test_of)
    text = "; ".join(t for t in (text, *parts) if t)
    cite = " and ".join(t for t in (cite, *cites) if t)
    criteria = [*check.criteria, *crits]
    if not fails:
        return check.model_copy(update={"outcome": status, "text": text, "cite": cite, "criteria": criteria})
    fails.sort(reverse=True)
    shortfall = "; ".join(f for f in (check.shortfall, *(f for _, f in fails)) if f)
    excess = max(check.excess, fails[0][0])
    update = {"outcome": FAIL, "text": text, "shortfall": shortfall, "excess": excess, "cite": cite}
    return check.model_copy(update={**update, "criteria": criteria})
