"""Per scheme, the three headline numbers (:class:`quantverdict.review.document.Headline`)."""

from __future__ import annotations

from quantverdict.config.schema import ReviewConfig
from quantverdict.review import document as doc
from quantverdict.review.words import say


def per_user_tok_s(p: doc.SpeedPoint) -> float | None:
    """Per-user output tok/s of a speed point: ``1000 / TPOT p50``; None without a TPOT."""
    t = p.tpot_ms_p50
    return 1000.0 / t if t is not None and t > 0 else None


def speed_ratio(p: doc.SpeedPoint, base: doc.SpeedPoint) -> doc.SpeedRatio | None:
    """``baseline TPOT p50 / scheme TPOT p50`` at one load, range ``[b_min / s_max, b_max / s_min]``."""
    a, b = p.tpot_ms_p50, base.tpot_ms_p50
    if a is None or b is None or a <= 0 or b <= 0:
        return None
    sa, sb = p.spread.get("tpot_ms_p50"), base.spread.get("tpot_ms_p50")
    reps, low, high = min(p.valid_repeats, base.valid_repeats), None, None
    if sa and sb and reps > 1 and min(sa.min, sb.min) > 0:
        low, high = sb.min / sa.max, sb.max / sa.min
    return doc.SpeedRatio(value=b / a, low=low, high=high, load=p.load, label=p.label, repeats=reps)


def _point_at(sc: doc.Scheme, load: float) -> doc.SpeedPoint | None:
    return next((p for p in sc.speed.points if p.load == load), None)


def not_comparable(*cards: doc.Scheme) -> str:
    """Why ``cards`` (a scheme and its baseline) may not be compared for speed; '' when they may."""
    for who in cards:
        if not who.speed.comparable:
            return f"{who.name} {who.speed.excluded_why or 'ran on a fallback kernel'}: not compared"
    return ""


def low_load_point(sc: doc.Scheme) -> doc.SpeedPoint | None:
    """Concurrency 1 in a concurrency sweep, else the lowest measured load."""
    if sc.speed.mode == "concurrency":
        return _point_at(sc, 1.0)
    return sc.speed.points[0] if sc.speed.points else None


def accuracy_headline(sc: doc.Scheme, rc: ReviewConfig) -> doc.HeadlineAccuracy | None:
    """The worst judged delta: largest rise of ``review.perplexity_kinds``, else lowest task recovery; a perplexity's
    change in %, a score's in points (``100 · delta``)."""
    judged = [d for d in sc.accuracy.deltas if not d.refused]  # a comparison that cannot be made is never the worst
    ppls = [d for d in judged if d.kind == "perplexity" and d.metric in rc.perplexity_kinds and d.delta_pct is not None]
    scores = [d for d in judged if d.kind == "score" and d.recovery_pct is not None]
    worst = max(ppls, key=lambda d: d.delta_pct or 0.0, default=None)
    d = worst or min(scores, key=lambda d: d.recovery_pct or 0.0, default=None)
    if d is None:
        return None
    pct, iv = d.kind == "perplexity", d.interval
    k, v = (1.0, d.delta_pct) if pct else (100.0, d.delta)
    return doc.HeadlineAccuracy(
        name=d.name,
        metric=d.metric,
        kind=doc.DeltaKind(d.kind),
        unit="%" if pct else "points",
        delta=None if v is None else doc.finite(k * v),
        low=None if iv is None else doc.finite(k * iv.low),
        high=None if iv is None else doc.finite(k * iv.high),
        n=d.n,
    )


def headline(sc: doc.Scheme, base: doc.Scheme | None, rc: ReviewConfig) -> doc.Headline:
    """The three numbers of ``sc`` against its model's baseline ``base`` (the baseline's own: its memory alone)."""
    h = doc.Headline(memory_need_gib=doc.finite(sc.memory.need_gib))
    if sc.is_baseline:
        return h
    h.accuracy = accuracy_headline(sc, rc)
    h.speed_note = not_comparable(sc, base) if base else ""
    if base is None or h.speed_note:
        return h
    p, q = low_load_point(sc), low_load_point(base)
    h.speed_ratio_c1 = speed_ratio(p, q) if p and q and p.load == q.load else None
    if here := sc.speed.at_load:
        p, q = _point_at(sc, here.load), _point_at(base, here.load)
        h.speed_ratio_at_load = speed_ratio(p, q) if p and q else None
    return h


def headlines(cards: list[doc.Scheme], rc: ReviewConfig) -> list[doc.Headline]:
    """:func:`headline` of each of one model's scorecards, in their order."""
    base = next((c for c in cards if c.is_baseline), None)
    return [headline(sc, base, rc) for sc in cards]


def memory_load_text(rc: ReviewConfig) -> str:
    """What the memory number serves: ``16 concurrent requests`` or ``4,608 KV tokens`` (``text.j2``'s macro)."""
    return say("memory_load_text", "text.j2", rc=rc)


def mlflow_metrics(n: doc.Headline) -> dict[str, float]:
    """The three numbers under short MLflow names (``_low``/``_high``: interval or repeat range); missing left out."""
    out = dict[str, float]()
    if n.memory_need_gib is not None:
        out["mem_gib"] = n.memory_need_gib
    ranged: list[tuple[str, doc.HeadlineAccuracy | doc.SpeedRatio | None]] = [("acc_delta", n.accuracy)]
    ranged += [("speed_ratio_c1", n.speed_ratio_c1), ("speed_ratio_load", n.speed_ratio_at_load)]
    for name, x in ranged:
        v = x.delta if isinstance(x, doc.HeadlineAccuracy) else x.value if x else None
        if x is not None and v is not None:
            out[name] = v
            if x.low is not None and x.high is not None:
                out[name + "_low"], out[name + "_high"] = x.low, x.high
    return out


def accuracy_metric_tag(h: doc.Headline) -> str:
    """What ``acc_delta`` measures: ``word_perplexity change (%)``, ``arc_easy acc_norm (points)``."""
    if (a := h.accuracy) is None:
        return ""
    return f"{a.metric} change (%)" if a.kind == "perplexity" else f"{a.name} {a.metric} (points)"
