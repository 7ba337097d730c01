"""``review.json``: :func:`to_document` assembles what :func:`quantverdict.review.core.build_review` computed into
the typed document (:class:`quantverdict.review.document.ReviewDocument`), one function per part, and the models
validate it before anything is written. Non-finite floats become None and an unlimited rate's load ``"inf"``, so
the file is strict JSON.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from quantverdict import __version__
from quantverdict.config.schema import ReviewConfig
from quantverdict.measure.stats import Interval
from quantverdict.review import crossmodel
from quantverdict.review import document as doc
from quantverdict.review.constraints import load_set, target_budget_gib
from quantverdict.review.cost import cost_json
from quantverdict.review.flags import FlagCode
from quantverdict.review.headline import Headline, headlines
from quantverdict.review.model import Review
from quantverdict.review.scorecard import Scorecard, TaskDelta
from quantverdict.review.verdict import floor_test_of


def to_document(review: Review, plots: Mapping[str, str] | None = None) -> doc.ReviewDocument:
    """``review`` as the typed ``review.json`` document.

    Args:
        review: the computed review.
        plots: the plots written beside ``review.md``, name -> alt text, in reading order (none when omitted).

    Raises:
        ValueError: a value the document's schema refuses (a flag code, decision or check status outside its
            enum; a ``pydantic.ValidationError`` for a field of the wrong type).
    """
    heads = {(h.model, h.scheme): h for m in dict.fromkeys(c.model for c in review.cards) for h in headlines(review, m)}
    n_ok = sum(sc.status == "ok" for sc in review.cards)
    n_cut = sum(sc.status == "interrupted" for sc in review.cards)
    return doc.ReviewDocument(
        schema_version=doc.SCHEMA_VERSION,
        tool=doc.Tool(name="quantverdict", version=__version__),
        source=review.source,
        generated_at=review.generated_at,
        constraints_label=review.label,
        constraints_how=review.constraints_how,
        constraints=review.config,
        constraint_settings=_settings(review.config),
        floor_tests=_floor_tests(review),
        jobs=doc.JobCounts(
            total=len(review.cards), finished=n_ok, failed=len(review.cards) - n_ok - n_cut, interrupted=n_cut
        ),
        environment=list(review.environment),
        verdicts=list(review.verdicts),
        scorecards=[_scheme(review, sc, heads[(sc.model, sc.scheme)]) for sc in review.cards],
        regime={model: list(rows) for model, rows in review.regime.items()},
        flags=_flags(review),
        validity=list(review.validity),
        notes=list(review.notes),
        cost=cost_json(review),
        cross_model=crossmodel.cross_model(review),
        plots=[doc.Plot(name=n, file=f"plots/{n}.png", alt=alt) for n, alt in (plots or {}).items()],
    )


# --- numbers -----------------------------------------------------------------------------------------


def _finite(v: Any) -> float | None:
    """A finite number as float; None for None, a bool, NaN and infinity."""
    return None if v is None or isinstance(v, bool) or not math.isfinite(float(v)) else float(v)


def _load(v: Any) -> doc.Load:
    """A load level: req/s or concurrency; ``"inf"`` for an unlimited rate."""
    return "inf" if v == "inf" or (isinstance(v, float) and math.isinf(v)) else float(v)


def _minmax(v: Sequence[Any] | None) -> doc.MinMax | None:
    """``[min, max]`` (or a tuple) as a range; None when either end is missing or not finite."""
    if not v or len(v) != 2:
        return None
    lo, hi = _finite(v[0]), _finite(v[1])
    return None if lo is None or hi is None else doc.MinMax(min=lo, max=hi)


def _interval(iv: Interval | None) -> doc.Interval | None:
    """``iv`` as the document's interval; None when any of its three numbers is missing or not finite."""
    est, lo, hi = (None, None, None) if iv is None else (_finite(iv.estimate), _finite(iv.low), _finite(iv.high))
    if iv is None or est is None or lo is None or hi is None:
        return None
    return doc.Interval(estimate=est, low=lo, high=hi, method=iv.method, n=iv.n, unit=iv.unit)


def _finite_tree(obj: Any) -> Any:
    """``obj`` (dicts and lists walked) with every non-finite float replaced by None."""
    if isinstance(obj, Mapping):
        return {str(k): _finite_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_tree(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _known(model: type[BaseModel], d: Mapping[str, Any] | None) -> dict[str, Any]:
    """The keys of ``d`` that ``model`` has (its other keys are the review's working data, not the document's)."""
    return {k: v for k, v in _finite_tree(d or {}).items() if k in model.model_fields}


# --- per scheme ----------------------------------------------------------------------------------------


def _scheme(review: Review, sc: Scorecard, head: Headline) -> doc.Scheme:
    cs = review.checks[sc.model][sc.scheme]
    return doc.Scheme(
        job_id=sc.job_id,
        model=sc.model,
        scheme=sc.scheme,
        label=sc.label,
        name=sc.name,
        weight_tier=sc.tier,
        kv_cache=sc.kv,
        is_baseline=sc.is_baseline,
        status=doc.JobStatus(sc.status),
        failed_stage=sc.failed_stage,
        error=sc.error,
        gpus=sc.gpus,
        headline=head.numbers,
        memory=sc.memory,
        accuracy=doc.Accuracy(
            not_applicable=sc.accuracy_not_applicable,
            refused=sc.accuracy_refused,
            deltas=[_delta(d) for d in sc.accuracy],
        ),
        speed=sc.speed,
        checks=doc.Checks(memory=cs["memory"], accuracy=cs["accuracy"], latency=cs["latency"]),
        missing=list(sc.missing),
        validity=list(sc.validity),
    )


def _delta(d: TaskDelta) -> doc.AccuracyDelta:
    return doc.AccuracyDelta(
        name=d.name,
        metric=d.metric,
        kind=doc.DeltaKind(d.kind),
        value=_finite(d.value),
        baseline=_finite(d.baseline),
        delta=_finite(d.delta),
        delta_pct=_finite(d.delta_pct),
        recovery_pct=_finite(d.recovery_pct),
        interval=_interval(d.interval),
        recovery_interval=_interval(d.recovery_interval),
        mcnemar_b=d.mcnemar_b,
        mcnemar_c=d.mcnemar_c,
        mcnemar_p=_finite(d.mcnemar_p),
        n=d.n,
        paired=d.paired,
        significant=d.significant,
        note=d.note,
        refused=d.refused,
        kld=d.kld,
    )


# --- regime, flags, cross-model ------------------------------------------------------------------------


def _flags(review: Review) -> list[doc.Flag]:
    """Every flag of the review, each with the model and scheme of the scorecard that raised it."""
    owner = {id(f): sc for sc in review.cards for f in sc.flags}
    out = []
    for f in review.flags:
        sc = owner.get(id(f))
        out.append(
            doc.Flag(
                code=FlagCode(f.code),
                model=sc.model if sc is not None else "",
                scheme=sc.scheme if sc is not None else "",
                message=f.message,
            )
        )
    return out


# --- the constraints' settings and floor tests ------------------------------------------------------------


def _settings(rc: ReviewConfig) -> list[doc.ConstraintSetting]:
    """Every ``review.*`` key with its value and where it comes from: the set's file (``conf/review/<name>.yaml``;
    the schema's defaults for a set built in code), an override, or ``review.target``'s derived budget
    (:func:`quantverdict.review.constraints.target_budget_gib`)."""
    try:
        default, where = load_set(rc.name), f"{rc.name}.yaml"
    except Exception:  # noqa: BLE001  (a set built in code: compare with the schema's defaults)
        default, where = ReviewConfig(), "default"
    derived = target_budget_gib(rc)
    out = []
    for f in dataclasses.fields(ReviewConfig):
        v, d = getattr(rc, f.name), getattr(default, f.name)
        source = doc.SettingSource.SET_FILE if v == d else doc.SettingSource.OVERRIDE
        if f.name == "memory_budget_gib" and v != d and derived is not None and v == derived:
            source = doc.SettingSource.TARGET
        out.append(
            doc.ConstraintSetting(
                key=f"review.{f.name}", value=_json(v), source=source, set_file=where, set_file_value=_json(d)
            )
        )
    return out


def _json(v: Any) -> Any:
    """A config value as JSON: tuples as lists, mappings with string keys."""
    return _finite_tree(v)


def _floor_tests(review: Review) -> doc.FloorTests | None:
    """Which test judged each delta against its floor (:func:`quantverdict.review.verdict.floor_test_of`), with
    its item count; None without any delta."""
    rc = review.config
    by: dict[str, dict[str, int | None]] = {"interval": {}, "point": {}}
    for sc in review.cards:
        for d in sc.accuracy:
            by[floor_test_of(d, rc)].setdefault(d.name if d.kind == "score" else d.metric, d.n)
    if not by["interval"] and not by["point"]:
        return None
    return doc.FloorTests(
        mode=rc.floor_test, interval_test_below_n=rc.interval_test_below_n, interval=by["interval"], point=by["point"]
    )
