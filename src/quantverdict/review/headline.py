"""Per scheme, the three headline numbers: memory (GiB to serve the stated load, :mod:`.memory`'s ``need_gib``),
accuracy (the delta the accuracy check judges worst, :func:`accuracy_headline`) and speed (per-user output speed over
the baseline's at concurrency 1 and at the stated load, :func:`speed_ratio`); logged by :func:`mlflow_metrics`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quantverdict.config.schema import ReviewConfig
from quantverdict.review.model import Review
from quantverdict.review.scorecard import Scorecard, TaskDelta

# short MLflow metric names of the three numbers (the runs table's and compare view's columns)
MEM_GIB = "mem_gib"
ACC_DELTA = "acc_delta"
SPEED_C1 = "speed_ratio_c1"
SPEED_LOAD = "speed_ratio_load"


@dataclass(frozen=True)
class Ratio:
    """A speed ratio of a scheme over its baseline at one load level.

    ``value = baseline TPOT p50 / scheme TPOT p50`` (= the scheme's per-user output tok/s, ``1000 / TPOT``,
    over the baseline's; > 1: faster). ``low``/``high``: the run-to-run range from the min/max over the
    valid repeats of both (``[b_min / s_max, b_max / s_min]``), None with one run each.
    """

    value: float
    low: float | None
    high: float | None
    load: float  # req/s (inf: unlimited) or concurrency
    label: str  # "concurrency 1", "1 req/s"
    repeats: int  # the fewer valid repeats of the two points


@dataclass(frozen=True)
class Headline:
    """One scheme's line on the first screen. Speed ratios are None for the baseline itself, for a scheme
    that ran on a fallback kernel (``speed_note`` says so) and where either TPOT is missing."""

    model: str
    scheme: str
    name: str  # "gptq (W4A16)"
    is_baseline: bool
    mem_gib: float | None
    accuracy: TaskDelta | None
    speed_c1: Ratio | None
    speed_load: Ratio | None
    speed_note: str = ""


def tpot(p: dict[str, Any]) -> float | None:
    """TPOT p50 (ms) of a review speed point, else None."""
    v = p.get("tpot_ms_p50")
    return float(v) if isinstance(v, (int, float)) and v > 0 else None


def per_user_tok_s(p: dict[str, Any]) -> float | None:
    """Per-user interactivity of a speed point: ``1000 / TPOT p50`` output tok/s per user (vLLM's sweep
    plots and public inference benchmarks plot throughput against it)."""
    t = tpot(p)
    return 1000.0 / t if t else None


def speed_ratio(p: dict[str, Any], base: dict[str, Any]) -> Ratio | None:
    """The scheme's per-user output speed over the baseline's at the same load level (see :class:`Ratio`).

    Args:
        p, base: review speed points (:func:`quantverdict.review.speed.speed_points`: medians over valid
            repeats, ``spread["tpot_ms_p50"] = [min, max]`` when known, ``valid_repeats``, ``load``, ``label``).
    """
    a, b = tpot(p), tpot(base)
    if a is None or b is None:
        return None
    sa, sb = (p.get("spread") or {}).get("tpot_ms_p50"), (base.get("spread") or {}).get("tpot_ms_p50")
    reps = min(int(p.get("valid_repeats") or 1), int(base.get("valid_repeats") or 1))
    low = high = None
    if sa and sb and reps > 1 and min(sa[0], sb[0]) > 0:
        low, high = sb[0] / sa[1], sb[1] / sa[0]
    return Ratio(b / a, low, high, float(p["load"]), str(p["label"]), reps)


def _point_at(sc: Scorecard, load: float) -> dict[str, Any] | None:
    return next((p for p in sc.speed.get("points", []) if p["load"] == load), None)


def comparable(sc: Scorecard, base: Scorecard) -> str:
    """'' when the two may be compared for speed, else why not (``speed.comparable`` False: a fallback kernel,
    ``kernel_reason``, or a request shape other than the baseline's, ``excluded_why``)."""
    for who in (sc, base):
        if who.speed.get("comparable") is False:
            why = who.speed.get("excluded_why") or who.speed.get("kernel_reason") or "ran on a fallback kernel"
            return f"{who.name} {why}: not compared"
    return ""


def ratio_curve(sc: Scorecard, base: Scorecard) -> list[Ratio]:
    """The speed ratio at every load level both measured, by load; empty when not comparable."""
    if comparable(sc, base):
        return []
    out = []
    for p in sc.speed.get("points", []):
        q = _point_at(base, p["load"])
        r = speed_ratio(p, q) if q is not None else None
        if r is not None:
            out.append(r)
    return out


def low_load_point(sc: Scorecard) -> dict[str, Any] | None:
    """The point standing for concurrency 1: concurrency 1 in a concurrency sweep, else the lowest
    measured load (a rate sweep has no concurrency 1; its lowest rate is the closest to a single user)."""
    pts = sc.speed.get("points") or []
    if not pts:
        return None
    if sc.speed.get("mode") == "concurrency":
        return _point_at(sc, 1.0)
    first: dict[str, Any] = pts[0]
    return first


def accuracy_headline(sc: Scorecard, rc: ReviewConfig) -> TaskDelta | None:
    """The delta the accuracy check cites as worst: the largest rise among the perplexity kinds of
    ``review.perplexity_kinds``; without one, the task with the lowest recovery. None for the baseline
    and when nothing was compared."""
    judged = [d for d in sc.accuracy if not d.refused]  # a comparison that cannot be made is never the worst
    ppls = [d for d in judged if d.kind == "perplexity" and d.metric in rc.perplexity_kinds and d.delta_pct is not None]
    if ppls:
        return max(ppls, key=lambda d: d.delta_pct or 0.0)
    scores = [d for d in judged if d.kind == "score" and d.recovery_pct is not None]
    return min(scores, key=lambda d: d.recovery_pct or 0.0) if scores else None


def headlines(review: Review, model: str) -> list[Headline]:
    """One :class:`Headline` per scheme of ``model``, in review order (baseline first)."""
    rc = review.config
    cards = review.cards_of(model)
    base = next((c for c in cards if c.is_baseline), None)
    out = []
    for sc in cards:
        c1 = at = None
        note = ""
        if base is not None and not sc.is_baseline:
            note = comparable(sc, base)
            if not note:
                p, q = low_load_point(sc), low_load_point(base)
                c1 = speed_ratio(p, q) if p and q and p["load"] == q["load"] else None
                at_p = sc.speed.get("at_load")
                q = _point_at(base, at_p["load"]) if at_p else None
                full = _point_at(sc, at_p["load"]) if at_p else None
                at = speed_ratio(full, q) if full and q else None
        out.append(
            Headline(
                model=sc.model,
                scheme=sc.scheme,
                name=sc.name,
                is_baseline=sc.is_baseline,
                mem_gib=sc.memory.need_gib,
                accuracy=None if sc.is_baseline else accuracy_headline(sc, rc),
                speed_c1=c1,
                speed_load=at,
                speed_note=note,
            )
        )
    return out


def memory_load_text(rc: ReviewConfig) -> str:
    """What the memory number serves: ``16 requests`` or ``4,608 KV tokens`` (``review.kv_cache_tokens``)."""
    if rc.kv_cache_tokens:
        return f"{rc.kv_cache_tokens:,} KV tokens"
    return f"{rc.concurrent_requests} concurrent requests"


def mlflow_metrics(h: Headline) -> dict[str, float]:
    """The three numbers under short names for a job's MLflow run: ``mem_gib``, ``acc_delta`` (% change of a
    perplexity, or points of a task score; ``acc_delta_low``/``_high``: its interval), ``speed_ratio_c1`` and
    ``speed_ratio_load`` (``_low``/``_high``: the range over repeats). Missing numbers are left out."""
    out: dict[str, float] = {}
    if h.mem_gib is not None:
        out[MEM_GIB] = float(h.mem_gib)
    d = h.accuracy
    if d is not None:
        k = 1.0 if d.kind == "perplexity" else 100.0
        v = d.delta_pct if d.kind == "perplexity" else d.delta
        if v is not None:
            out[ACC_DELTA] = k * v
            if d.interval is not None:
                out[ACC_DELTA + "_low"], out[ACC_DELTA + "_high"] = k * d.interval.low, k * d.interval.high
    for name, r in ((SPEED_C1, h.speed_c1), (SPEED_LOAD, h.speed_load)):
        if r is not None:
            out[name] = r.value
            if r.low is not None and r.high is not None:
                out[name + "_low"], out[name + "_high"] = r.low, r.high
    return out


def accuracy_metric_tag(h: Headline) -> str:
    """What ``acc_delta`` measures for this run: ``word_perplexity change (%)``, ``arc_easy acc_norm (points)``."""
    d = h.accuracy
    if d is None:
        return ""
    return f"{d.metric} change (%)" if d.kind == "perplexity" else f"{d.name} {d.metric} (points)"
