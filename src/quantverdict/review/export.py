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
from quantverdict.review.headline import Headline, Ratio, headlines
from quantverdict.review.model import Review
from quantverdict.review.scorecard import Scorecard, TaskDelta
from quantverdict.review.speed import ceiling_is_floor
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
    cost = cost_json(review)
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
        cost=None if cost is None else doc.Cost.model_validate(_finite_tree(cost)),
        cross_model=crossmodel.cross_model(review),
        plots=[doc.Plot(name=n, file=f"plots/{n}.png", alt=alt) for n, alt in (plots or {}).items()],
    )


# --- numbers -----------------------------------------------------------------------------------------


def _finite(v: Any) -> float | None:
    """A finite number as float; None for None, a bool, NaN and infinity."""
    return None if v is None or isinstance(v, bool) or not math.isfinite(float(v)) else float(v)


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


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


# --- per model -----------------------------------------------------------------------------------------


def _verdict(v: Verdict, cards: list[Scorecard]) -> doc.ModelVerdict:
    swept = [sc for sc in cards if sc.speed.get("points") and sc.speed.get("workload")]
    shapes = {sc.name: str(sc.speed["workload"]["text"]) for sc in swept}
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
        compute_reported=any(sc.speed.get("compute") for sc in cards),
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
        headline=_headline(head),
        memory=sc.memory,
        accuracy=doc.Accuracy(
            not_applicable=sc.accuracy_not_applicable,
            refused=sc.accuracy_refused,
            deltas=[_delta(d) for d in sc.accuracy],
        ),
        speed=_speed(sc.speed),
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


def _speed(sp: dict[str, Any]) -> doc.Speed:
    at = sp.get("at_load")
    roof = sp.get("roofline")
    workload = sp.get("workload")
    return doc.Speed(
        mode=sp.get("mode"),
        workload=None if not workload else doc.Workload.model_validate(_known(doc.Workload, workload)),
        repeats=_int(sp.get("repeats")),
        comparable=sp.get("comparable") is not False,
        excluded_why=sp.get("excluded_why") or sp.get("kernel_reason"),
        kernel=sp.get("kernel"),
        compute=sp.get("compute"),
        compute_reason=sp.get("compute_reason"),
        low_load=None
        if sp.get("low_label") is None
        else doc.LowLoad(
            label=sp["low_label"],
            itl_ms_p50=_finite(sp.get("single_itl_ms_p50")),
            itl_ms_p50_range=_minmax(sp.get("single_itl_ms_p50_range")),
            output_tok_s_per_request=_finite(sp.get("single_tok_s")),
        ),
        ceiling=None
        if sp.get("ceiling_kind") is None
        else doc.Ceiling(
            kind=sp["ceiling_kind"],
            label=sp.get("saturation_label"),
            rps=_finite(sp.get("ceiling_rps")),
            output_tok_s=_finite(sp.get("ceiling_tok_s")),
            output_tok_s_range=_minmax(sp.get("ceiling_tok_s_range")),
            whole_run_output_tok_s=_finite(sp.get("ceiling_whole_run_tok_s")),
            whole_run_output_tok_s_range=_minmax(sp.get("ceiling_whole_run_tok_s_range")),
            repeats=_int(sp.get("ceiling_repeats")),
            basis=sp.get("ceiling_basis"),
            lower_bound=ceiling_is_floor(sp),
        ),
        at_load=None if not at else _at_load(at),
        load_how=sp.get("load_how"),
        goodput_rps=_finite(sp.get("goodput_rps")),
        goodput_how=sp.get("goodput_how"),
        p99_slo_max_rps=_finite(sp.get("p99_slo_max_rps")),
        p99_slo_max_how=sp.get("p99_slo_max_how"),
        missing_levels=list(sp.get("missing_levels") or []),
        stopped_before=list(sp.get("stopped_before") or []),
        roofline=doc.Roofline.model_validate(_known(doc.Roofline, roof)) if isinstance(roof, dict) and roof else None,
        points=[_point(p) for p in sp.get("points") or []],
    )


def _point(p: dict[str, Any]) -> doc.SpeedPoint:
    known = _known(doc.SpeedPoint, p)
    fields = {k: known.get(k) for k in doc.SpeedPoint.model_fields}
    fields.update(
        label=str(p["label"]),
        load=_load(p["load"]),
        valid_repeats=int(p.get("valid_repeats", 1)),
        repeats=int(p.get("repeats", 1)),
        saturated=p.get("saturated"),
    )
    return doc.SpeedPoint.model_validate(fields)


def _at_load(at: dict[str, Any]) -> doc.AtLoad:
    spread = {k: r for k, v in (at.get("spread") or {}).items() if (r := _minmax(v)) is not None}
    g = at.get("goodput")
    return doc.AtLoad(
        label=str(at["label"]),
        load=_load(at["load"]),
        achieved_rps=_finite(at.get("achieved_rps")),
        output_tok_s=_finite(at.get("output_tok_s")),
        ttft_ms_p99=_finite(at.get("ttft_ms_p99")),
        itl_ms_p99=_finite(at.get("itl_ms_p99")),
        e2e_ms_p50=_finite(at.get("e2e_ms_p50")),
        e2e_ms_p99=_finite(at.get("e2e_ms_p99")),
        valid_repeats=_int(at.get("valid_repeats")),
        spread=spread,
        goodput=None if not g else doc.Goodput.model_validate(_finite_tree(g)),
    )


def _ratio(r: Ratio | None) -> doc.SpeedRatio | None:
    if r is None or _finite(r.value) is None:
        return None
    return doc.SpeedRatio(
        value=r.value, low=_finite(r.low), high=_finite(r.high), load=_load(r.load), label=r.label, repeats=r.repeats
    )


def _headline(h: Headline) -> doc.Headline:
    d = h.accuracy
    acc = None
    if d is not None:
        pct = d.kind == "perplexity"  # a perplexity's change in %, a score's in points (as mlflow_metrics logs them)
        k = 1.0 if pct else 100.0
        v = d.delta_pct if pct else d.delta
        iv = d.interval
        acc = doc.HeadlineAccuracy(
            name=d.name,
            metric=d.metric,
            kind=doc.DeltaKind(d.kind),
            unit="%" if pct else "points",
            delta=None if v is None else _finite(k * v),
            low=None if iv is None else _finite(k * iv.low),
            high=None if iv is None else _finite(k * iv.high),
            n=d.n,
        )
    return doc.Headline(
        memory_need_gib=_finite(h.mem_gib),
        accuracy=acc,
        speed_ratio_c1=_ratio(h.speed_c1),
        speed_ratio_at_load=_ratio(h.speed_load),
        speed_note=h.speed_note,
    )


# --- regime and flags ------------------------------------------------------------------------


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
