"""The KL divergence to the baseline (``accuracy.kld``) as :class:`AccuracyDelta` of kind ``kld``. A top-k KLD is a
lower bound of the true one: failing on it is failing, passing is the bound's pass."""

from __future__ import annotations

import math
from typing import Any

from quantverdict.measure.stats import Interval
from quantverdict.results.record import Block, JobRecord
from quantverdict.review.document import AccuracyDelta, DeltaKind, KldFigures, finite
from quantverdict.review.document import Interval as DocInterval

KLD = DeltaKind.KLD  # the kind and name of the KLD deltas


class _KldEntry(Block):
    role: str | None = None
    refused: str | None = None


def _interval(f: KldFigures, estimate: float, low: float | None, high: float | None) -> DocInterval | None:
    method = f.interval_method or "paired bootstrap over windows"
    return None if low is None or high is None else DocInterval.of(Interval(estimate, low, high, method))


def kld_deltas(rec: JobRecord) -> list[AccuracyDelta]:
    """Mean KLD (nats, baseline 0) and top-1 agreement (%, baseline 100) of one scheme's record; one ``refused`` delta
    (the reason in ``note``) when the job could not compare; [] for the baseline and for a record without a KLD."""
    if rec.accuracy.kld is None or (entry := _KldEntry.of(rec.accuracy.kld)).role == "baseline":
        return []
    known = {k: v for k, v in entry.model_dump().items() if k in KldFigures.model_fields}
    f = KldFigures.model_validate({k: finite(v) if isinstance(v, float) else v for k, v in known.items()})
    if entry.refused is not None or f.mean_kld is None:
        why = f"KL divergence not compared: {entry.refused or 'no mean KLD in the record'}"
        return [AccuracyDelta.new(KLD, "refused", KLD, math.nan, 0.0, note=why, kld=f)]
    agree, lo, hi = float(f.top1_agreement_pct or 0.0), f.top1_agreement_pct_ci_low, f.top1_agreement_pct_ci_high
    figures: dict[str, Any] = {"n": f.n_tokens, "kld": f}
    mean_iv = _interval(f, f.mean_kld, f.mean_kld_ci_low, f.mean_kld_ci_high)
    top1_iv = None if lo is None or hi is None else _interval(f, agree - 100.0, lo - 100.0, hi - 100.0)
    top1 = {"delta": agree - 100.0, "interval": top1_iv, "recovery_pct": agree} | figures
    return [
        AccuracyDelta.new(KLD, "mean_kld", KLD, f.mean_kld, 0.0, delta=f.mean_kld, interval=mean_iv, **figures),
        AccuracyDelta.new(
            KLD, "top1_agreement_pct", KLD, agree, 100.0, recovery_interval=_interval(f, agree, lo, hi), **top1
        ),
    ]
