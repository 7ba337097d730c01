"""The review's plots (matplotlib, Agg) as figures or PNG bytes (:data:`ALT` says what each shows); every axis names
its quantity and unit, legends sit outside the data."""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from quantverdict.review import headline
from quantverdict.review.document import AccuracyDelta, Review, Scheme, SpeedRatio

DPI = 110
COLORS = dict(bf16="#222222", int8="#1f77b4", fp8="#2ca02c", w8a8="#17becf", gptq="#d62728", awq="#ff7f0e")
MARKERS = dict(bf16="s", int8="o", fp8="^", w8a8="v", gptq="D", awq="P")
OUTSIDE = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0, "fontsize": 8}


def _style(sc: Scheme, i: int) -> dict[str, Any]:
    return {"color": COLORS.get(sc.scheme, f"C{i % 10}"), "marker": MARKERS.get(sc.scheme, "o")}


def _namer(cards: list[Scheme]) -> Callable[[Scheme], str]:
    """A scheme's legend name: ``model/scheme`` in a figure of several models."""
    many = len({sc.model for sc in cards}) > 1
    return lambda sc: f"{sc.model}/{sc.name}" if many else sc.name


def _by_model(review: Review) -> dict[str, list[Scheme]]:
    models = dict.fromkeys(sc.model for sc in review.scorecards)
    return {m: [sc for sc in review.scorecards if sc.model == m] for m in models}


def _ratio_curve(sc: Scheme, base: Scheme) -> list[SpeedRatio]:
    """The speed ratio at every load level both measured, by load; empty when not compared (``speed_note``)."""
    theirs = {p.load: p for p in base.speed.points}
    pairs = [(p, theirs[p.load]) for p in sc.speed.points if p.load in theirs and not sc.headline.speed_note]
    return [r for p, q in pairs if (r := headline.speed_ratio(p, q)) is not None]


def _positions(cards: list[Scheme]) -> dict[float, float]:
    """Each load's x on a log2 axis; an unlimited rate one doubling past the largest finite load."""
    loads = sorted({p.load for sc in cards for p in sc.speed.points})
    finite = [v for v in loads if math.isfinite(v) and v > 0]
    beyond = 2.0 ** (math.floor(math.log2(max(finite) if finite else 1.0)) + 1)
    return {v: v if math.isfinite(v) and v > 0 else beyond for v in loads}


def _load_axis(ax: Any, pos: dict[float, float], cards: list[Scheme]) -> None:
    """The load axis: log2, one tick per measured load, named by the sweeps' mode."""
    mode = next((sc.speed.mode for sc in cards if sc.speed.points), "rate")
    ticks = list(pos.values())
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [f"{v:g}" if math.isfinite(v) else "unlimited" for v in pos])
    ax.minorticks_off()
    what = "concurrency (requests in flight" if mode == "concurrency" else "offered rate (req/s"
    ax.set_xlabel(f"{what}, log2 axis)")
    if len(ticks) == 1:  # one load: a little room either side
        ax.set_xlim(ticks[0] / 2, ticks[0] * 2)


def _finish(ax: Any, title: str, legend: dict[str, Any] | None = OUTSIDE, **grid: Any) -> None:
    """Title, grid and a legend (``legend``'s placement; None: no legend)."""
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, **grid)
    if legend is not None:
        ax.legend(**legend)


def speed_ratio_figure(review: Review) -> Any:
    """Per model, each scheme's speed ratio over its baseline against the load; None without ratios."""
    panels = []
    for model, cards in _by_model(review).items():
        base = next((c for c in cards if c.is_baseline), None)
        curves = [(sc, c) for sc in cards if base and not sc.is_baseline and (c := _ratio_curve(sc, base))]
        if base is not None and curves:
            panels.append((model, base, curves))
    if not panels:
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(8.5, 4.2 * len(panels)), squeeze=False)
    for ax, (model, base, curves) in zip(axes[:, 0], panels):
        pos = _positions([base] + [sc for sc, _ in curves])
        for i, (sc, curve) in enumerate(curves):
            lo = [r.value - r.low if r.low is not None else 0.0 for r in curve]
            hi = [r.high - r.value if r.high is not None else 0.0 for r in curve]
            xs, ys = [pos[r.load] for r in curve], [r.value for r in curve]
            ax.errorbar(xs, ys, yerr=[lo, hi], capsize=4, lw=1.6, label=sc.name, **_style(sc, i))
        ax.axhline(1.0, color="black", lw=1, ls="--", label=f"1x = {base.name}")
        _load_axis(ax, pos, [base] + [sc for sc, _ in curves])
        ax.set_ylabel(f"per-user output speed / {base.scheme}'s (x)")
        title = f"speed vs {base.name} (1000 / TPOT p50 ratio; bars: range over repeats)"
        _finish(ax, f"{model}: {title}" if len(panels) > 1 else title)
    return fig


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both coordinates (higher x and higher y), sorted by x."""
    front = [p for p in points if not any(q[0] >= p[0] and q[1] >= p[1] and q != p for q in points)]
    return sorted(set(front))


def _pareto_points(sc: Scheme) -> list[tuple[float, float, str]]:
    """``(per-user tok/s, total output tok/s, short load label)`` of each load level that has both."""
    xs = ((headline.per_user_tok_s(p), p) for p in sc.speed.points)
    short = ((x, p, p.label.replace("concurrency ", "c=").replace("unlimited rate", "unlimited")) for x, p in xs)
    return [(x, p.output_tok_s, label) for x, p, label in short if x and p.output_tok_s]


def pareto_figure(review: Review) -> Any:
    """Per model, total output tok/s against per-user tok/s and the frontier; None without TPOT data."""
    panels = [(m, cards) for m, scs in _by_model(review).items() if (cards := [sc for sc in scs if _pareto_points(sc)])]
    if not panels:
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(8.5, 4.6 * len(panels)), squeeze=False)
    for ax, (model, cards) in zip(axes[:, 0], panels):
        everything: list[tuple[float, float]] = []
        for i, sc in enumerate(cards):
            pts = _pareto_points(sc)
            xs, ys = [x for x, _, _ in pts], [y for _, y, _ in pts]
            everything += list(zip(xs, ys))
            ax.plot(xs, ys, lw=1.4, ms=6, label=sc.name, **_style(sc, i))
            for x, y, short in pts:
                ax.annotate(short, (x, y), xytext=(4, 3), textcoords="offset points", fontsize=7, color="#444")
        front = pareto_front(everything)
        if len(front) > 1:
            ax.plot(*zip(*front), color="grey", ls=":", lw=2, zorder=0, label="Pareto frontier (all schemes)")
        ys_all = [y for _, y in everything]
        if min(ys_all) > 0 and max(ys_all) / min(ys_all) > 20:
            ax.set_yscale("log")
        ax.set_xlabel("interactivity: output tok/s per user (1000 / TPOT p50)")
        ax.set_ylabel("total output throughput (tok/s)")
        title = "throughput vs interactivity, one point per load level (up and right is better)"
        _finish(ax, f"{model}: {title}" if len(panels) > 1 else title, which="both")
    return fig


def memory_figure(review: Review) -> Any:
    """Stacked bars per scheme (GiB): weights, KV cache, state, reserve, and the budget; None without weights."""
    cards = [sc for sc in review.scorecards if sc.memory.weights_gib is not None]
    if not cards:
        return None
    rc, label_of = review.constraints, _namer(cards)
    budget = rc.memory_budget_gib
    fig, ax = plt.subplots(figsize=(max(7.0, 1.1 * len(cards) + 4), 4.4))
    x = list(range(len(cards)))
    bottom = [0.0] * len(cards)
    parts: dict[str, tuple[list[float | None], str]] = {
        "weights": ([sc.memory.weights_gib for sc in cards], "#4c72b0"),
        f"KV cache for {headline.memory_load_text(rc)}": ([sc.memory.kv_needed_gib for sc in cards], "#dd8452"),
        "recurrent state": ([sc.memory.state_needed_gib for sc in cards], "#937860"),
        "reserve": ([rc.reserved_gib for _ in cards], "#8172b3"),
    }
    for label, (gib, color) in parts.items():
        if any(vals := [float(v or 0.0) for v in gib]):
            ax.bar(x, vals, bottom=bottom, color=color, label=label, width=0.6)
            bottom = [b + v for b, v in zip(bottom, vals)]
    for xi, u in zip(x, bottom):
        ax.annotate(
            f"{u:.3g}", (xi, u), xytext=(0, 2), textcoords="offset points", ha="center", va="bottom", fontsize=8
        )
    top = max(bottom)
    title = f"memory to serve {headline.memory_load_text(rc)} (GiB, need written on each bar)"
    if budget is not None and budget <= 3 * top:
        ax.axhline(budget, color="red", ls="--", lw=1.4, label=f"budget {budget:g} GiB")
        top = max(top, budget)
    elif budget is not None:
        ax.plot([], [], color="red", ls="--", lw=1.4, label=f"budget {budget:g} GiB (above the axis)")
        title += f"; budget {budget:g} GiB"
    ax.set_ylim(0, top * 1.15)
    ax.set_xticks(x, [label_of(sc) for sc in cards], rotation=20, ha="right")
    ax.set_ylabel("GiB (2^30 bytes)")
    _finish(ax, title, axis="y")
    return fig


def _delta_name(d: AccuracyDelta) -> str:
    return f"{d.name} {d.metric}" if d.kind == "score" else str(d.metric)


def accuracy_figure(review: Review) -> Any:
    """Score deltas (points) and perplexity changes (%) with intervals; None without deltas."""
    cards = [sc for sc in review.scorecards if sc.accuracy.deltas]
    if not cards:
        return None
    label_of, deltas = _namer(cards), [d for sc in cards for d in sc.accuracy.deltas]
    by_kind = {k: list(dict.fromkeys(_delta_name(d) for d in deltas if d.kind == k)) for k in ("score", "perplexity")}
    panels = [(k, names) for k, names in by_kind.items() if names]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.0 * len(panels) + 2.5, 4.4), squeeze=False)
    width = 0.8 / max(1, len(cards))
    hollow_seen = False
    for ax, (kind, names) in zip(axes[0], panels):
        for i, sc in enumerate(cards):
            ds = {_delta_name(d): d for d in sc.accuracy.deltas if d.kind == kind}
            k = 100.0 if kind == "score" else 1.0
            for j, name in enumerate(names):
                if (d := ds.get(name)) is None or (v := d.delta if kind == "score" else d.delta_pct) is None:
                    continue
                x, y = j - 0.4 + width * (i + 0.5), k * v
                style = _style(sc, i)
                if d.interval is None:
                    hollow_seen = True
                    ax.plot([x], [y], ls="none", mfc="white", mec=style["color"], marker=style["marker"], ms=7)
                else:
                    lo, hi = max(0.0, y - k * d.interval.low), max(0.0, k * d.interval.high - y)
                    ax.errorbar([x], [y], yerr=[[lo], [hi]], fmt=style["marker"], color=style["color"], capsize=3)
            ax.plot([], [], ls="none", label=label_of(sc), **_style(sc, i))  # one legend entry per scheme
        ax.axhline(0, color="black", lw=0.8)
        limit = review.constraints.max_perplexity_increase_pct
        if kind == "perplexity" and limit is not None:
            ax.axhline(limit, color="red", ls="--", lw=1, label=f"limit +{limit:g}%")
        if hollow_seen and ax is axes[0][-1]:
            ax.plot([], [], ls="none", marker="o", mfc="white", mec="grey", label="hollow: no interval")
        ax.set_xticks(range(len(names)), names, rotation=15, ha="right", fontsize=8)
        ax.set_ylabel("score delta (percentage points)" if kind == "score" else "perplexity change (%)")
        what = "task score vs baseline" if kind == "score" else "perplexity vs baseline"
        lower = "" if kind == "score" else " (lower is better)"
        title = f"{what}, {review.constraints.confidence:.0%} interval{lower}"
        _finish(ax, title, OUTSIDE if ax is axes[0][-1] else None, axis="y")
    return fig


def latency_figure(review: Review) -> Any:
    """TTFT p99 and per-request TPOT p99 (else ITL p99) against the load; None without speed points."""
    cards = [sc for sc in review.scorecards if sc.speed.points]
    if not cards:
        return None
    label_of, pos = _namer(cards), _positions(cards)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    rc = review.constraints
    has_tpot = [p.tpot_ms_p99 is not None for sc in cards for p in sc.speed.points if p.tpot_ms_p99 or p.itl_ms_p99]
    tpot = "TPOT p99 per request" if all(has_tpot) else "TPOT p99 per request, else ITL p99"
    right = f"{tpot if any(has_tpot) else 'ITL p99'} (ms)"
    ttfts = [[p.ttft_ms_p99 for p in sc.speed.points] for sc in cards]
    tpots = [[p.itl_ms_p99 if p.tpot_ms_p99 is None else p.tpot_ms_p99 for p in sc.speed.points] for sc in cards]
    for ax, values, title, slo, slo_name in (
        (axes[0], ttfts, "TTFT p99 (ms)", rc.ttft_ms_p99, "TTFT objective"),
        (axes[1], tpots, right, rc.itl_ms_p99, "TPOT objective (per request)"),
    ):
        for i, (sc, vs) in enumerate(zip(cards, values)):
            pts = [(pos[p.load], v) for p, v in zip(sc.speed.points, vs) if v]
            ax.plot([x for x, _ in pts], [v for _, v in pts], label=label_of(sc), **_style(sc, i))
        if slo is not None:
            ax.axhline(slo, ls="--", color="red", lw=1, label=f"{slo_name} {slo:g} ms")
            where = {"xycoords": ("axes fraction", "data"), "color": "red", "fontsize": 8, "va": "bottom"}
            ax.annotate(f"{slo_name} {slo:g} ms", (0.01, slo), **where)
        _load_axis(ax, pos, cards)
        ax.set_ylabel(title)
        ax.set_yscale("log")
        below = {"loc": "upper center", "bbox_to_anchor": (0.5, -0.2), "ncol": 3, "fontsize": 8}
        _finish(ax, f"{title} against the load", below, which="both")
    return fig


def attainment_figure(review: Review) -> Any:
    """SLO attainment (%) against the load searched, one line per scheme and server start, with the target; None
    without a capacity search."""
    found = [(sc, cap) for sc in review.scorecards if (cap := sc.speed.capacity) is not None and cap.levels]
    if not found:
        return None
    label_of = _namer([sc for sc, _ in found])
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, (sc, cap) in enumerate(found):
        for k, start in enumerate(sorted({lv.server_start for lv in cap.levels})):
            pts = sorted((lv.load, lv.attainment_pct) for lv in cap.levels if lv.server_start == start)
            ax.plot([x for x, _ in pts], [y for _, y in pts], label=label_of(sc) if k == 0 else None, **_style(sc, i))
    first = found[0][1]
    target = first.attainment_pct
    ax.axhline(target, ls="--", color="red", lw=1, label=f"target {target:g}% ({first.slo})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency (requests in flight)" if first.mode == "concurrency" else "offered rate (req/s)")
    ax.set_ylabel("SLO attainment (% of requests sent)")
    ax.set_ylim(-2, 102)
    _finish(ax, "SLO attainment against the load searched")
    return fig


# in reading order, each named by its function: ``speed_ratio_figure`` -> ``speed_ratio``
FIGURES = (speed_ratio_figure, pareto_figure, memory_figure, accuracy_figure, latency_figure, attainment_figure)


# each plot's alt text (review.json's ``plots``; the pages' captions)
ALT = {
    "speed_ratio": "per-user output speed of each scheme over the baseline's against the load (log2 axis), "
    "with the range over repeats",
    "pareto": "total output tok/s against per-user tok/s (1000 / TPOT p50), one curve per scheme, "
    "and the Pareto frontier",
    "memory": "weights + KV cache to serve the stated load, per scheme, against the memory budget",
    "accuracy": "accuracy deltas and perplexity changes with their intervals",
    "latency": "TTFT p99 and per-request TPOT p99 (else ITL p99) against the load (log2 axis), with the objectives",
    "attainment": "SLO attainment (% of requests meeting every objective) against the load each capacity search "
    "measured (log2 axis), one line per scheme and server start, with the target",
}


def make_plots(review: Review) -> dict[str, bytes]:
    """Every plot that has data, name -> PNG bytes, in reading order."""
    out = {}
    for fn in FIGURES:
        if (fig := fn(review)) is not None:
            fig.tight_layout()
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
            plt.close(fig)
            out[fn.__name__.removesuffix("_figure")] = buf.getvalue()
    return out
