"""The review as its typed document (:class:`quantverdict.review.document.ReviewDocument`): ``review.json``.

:func:`to_document` reads what :func:`quantverdict.review.core.build_review` computed (scorecards, checks,
verdicts, regime rows, flags, the cross-model comparison) field by field into the document's models, which
validate it: a value of the wrong type or an unknown code is refused here, before anything is written. What the
pages show beyond the decision (where each constraint's value comes from, which test judged each floor, the
sweep points) is worked out here too, so that the templates (:mod:`quantverdict.review.render`) only format.
Non-finite floats (a refused KLD's NaN) become None and an unlimited rate's load ``"inf"``, so the file is strict
JSON.
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
from quantverdict.review.verdict import Check, Verdict, ceilings_differ_in_basis, floor_test_of


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
        verdicts=[_verdict(v, review.cards_of(v.model)) for v in review.verdicts],
        scorecards=[_scheme(review, sc, heads[(sc.model, sc.scheme)]) for sc in review.cards],
        regime={model: [_regime(row) for row in rows] for model, rows in review.regime.items()},
        flags=_flags(review),
        validity=list(review.validity),
        notes=list(review.notes),
        cost=cost_json(review),
        cross_model=crossmodel.cross_model(review),
        plots=[doc.Plot(name=n, file=f"plots/{n}.png", alt=alt) for n, alt in (plots or {}).items()],
    )


# --- numbers -----------------------------------------------------------------------------------------


def _finite(v: Any) -> float | None:
    """A finite number as float; None for None, NaN and infinity."""
    if v is None or isinstance(v, bool):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _load(v: Any) -> doc.Load:
    """A load level: req/s or concurrency; ``"inf"`` for an unlimited rate."""
    if v == "inf" or (isinstance(v, float) and math.isinf(v)):
        return "inf"
    return float(v)


def _minmax(v: Sequence[Any] | None) -> doc.MinMax | None:
    """``[min, max]`` (or a tuple) as a range; None when either end is missing or not finite."""
    if not v or len(v) != 2:
        return None
    lo, hi = _finite(v[0]), _finite(v[1])
    return None if lo is None or hi is None else doc.MinMax(min=lo, max=hi)


def _interval(iv: Interval | None) -> doc.Interval | None:
    if iv is None:
        return None
    est, lo, hi = _finite(iv.estimate), _finite(iv.low), _finite(iv.high)
    if est is None or lo is None or hi is None:
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


# --- per model -----------------------------------------------------------------------------------------


def _verdict(v: Verdict, cards: list[Scorecard]) -> doc.ModelVerdict:
    shapes = {sc.name: sc.speed.workload.text for sc in cards if sc.speed.points and sc.speed.workload}
    return doc.ModelVerdict(
        model=v.model,
        decision=doc.Decision(v.decision),
        chosen_scheme=v.scheme,
        chosen_label=v.label,
        binding=[doc.ConstraintKind(c) for c in v.binding_constraints],
        passed_over=list(v.passed_over),
        order=list(v.order),
        lever=doc.Lever(v.lever),
        kv_lever=doc.KvLever.model_validate(_finite_tree(v.kv_lever)) if v.kv_lever else None,
        accuracy_not_measured=v.accuracy_not_measured,
        baseline_scheme=next((sc.scheme for sc in cards if sc.is_baseline), None),
        request_shape=next(iter(shapes.values())) if len(set(shapes.values())) == 1 else None,
        request_shapes=shapes,
        ceilings_differ_in_basis=ceilings_differ_in_basis(cards),
        compute_reported=any(sc.speed.compute for sc in cards),
        sentence=v.sentence,
        evidence=list(v.evidence),
        others=list(v.others),
    )


def _check(c: Check) -> doc.Check:
    return doc.Check(
        constraint=doc.ConstraintKind(c.constraint),
        outcome=doc.Outcome(c.status),
        criteria=list(c.criteria),
        excess=c.excess,
        text=c.text,
        shortfall=c.shortfall,
        cite=c.cite,
    )


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
        checks=doc.Checks(memory=_check(cs["memory"]), accuracy=_check(cs["accuracy"]), latency=_check(cs["latency"])),
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


def _claim(c: dict[str, Any] | None) -> doc.RegimeClaim | None:
    if c is None:
        return None
    c = _finite_tree(c)
    if c.get("load") is not None:
        c["load"] = _load(c["load"])
    return doc.RegimeClaim.model_validate(c)


def _regime(row: dict[str, Any]) -> doc.Regime:
    paired = []
    for p in row.get("paired") or []:
        p = _finite_tree(p)
        paired.append(doc.PairedSpeedup.model_validate({**p, "load": _load(p["load"])}))
    return doc.Regime(
        scheme=row["scheme"],
        label=row["label"],
        low_load_speedup=_finite(row.get("low")),
        low_load_range=_minmax(row.get("low_range")),
        saturation_speedup=_finite(row.get("sat")),
        saturation_range=_minmax(row.get("sat_range")),
        low_load_claim=_claim(row.get("low_claim")),
        saturation_claim=_claim(row.get("sat_claim")),
        saturation_not_compared=row.get("sat_gap"),
        paired=paired,
        reading=doc.RegimeReading(row["reading"]),
    )


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
    if isinstance(v, Mapping):
        return {str(k): _json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json(x) for x in v]
    return v


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
