"""The review's plots (matplotlib, Agg backend), returned as PNG bytes.

* ``throughput``: achieved req/s and output tok/s against the offered load, one curve per scheme;
* ``latency``: TTFT p99 and ITL p99 against the offered load, with the SLO;
* ``memory``: stacked bars (weights, KV cache needed, free) against the memory budget;
* ``accuracy``: each task's delta and each perplexity kind's change with their intervals.
"""

from __future__ import annotations

import io
import math
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from quantverdict.review.model import Review
from quantverdict.review.scorecard import Scorecard

DPI = 110
COLORS = {
    "bf16": "#222222",
    "int8": "#1f77b4",
    "fp8": "#2ca02c",
    "w8a8": "#17becf",
    "gptq": "#d62728",
    "awq": "#ff7f0e",
}


def _color(sc: Scorecard, i: int) -> str:
    return COLORS.get(sc.scheme, f"C{i % 10}")


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _name(sc: Scorecard, many_models: bool) -> str:
    return f"{sc.model}/{sc.name}" if many_models else sc.name


def _x_positions(cards: list[Scorecard]) -> tuple[dict[float, float], list[float], list[str], str]:
    """Map each measured load to an x position: finite loads as they are, an unlimited rate at
    1.6 x the largest finite one (tick label 'inf')."""
    loads = sorted({p["load"] for sc in cards for p in sc.speed.get("points", [])})
    mode = next((sc.speed.get("mode") for sc in cards if sc.speed.get("points")), "rate")
    finite = [v for v in loads if math.isfinite(v)]
    top = max(finite) if finite else 1.0
    pos = {v: (v if math.isfinite(v) else top * 1.6 if finite else 1.0) for v in loads}
    labels = [f"{v:g}" if math.isfinite(v) else "unlimited" for v in loads]
    xlabel = "concurrency" if mode == "concurrency" else "offered rate (req/s)"
    return pos, [pos[v] for v in loads], labels, xlabel


def throughput_plot(review: Review) -> bytes | None:
    cards = [sc for sc in review.cards if sc.speed.get("points")]
    if not cards:
        return None
    many = len({sc.model for sc in cards}) > 1
    pos, ticks, labels, xlabel = _x_positions(cards)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for i, sc in enumerate(cards):
        pts = sc.speed["points"]
        xs = [pos[p["load"]] for p in pts]
        kw = {"marker": "o", "color": _color(sc, i), "label": _name(sc, many)}
        a1.plot(xs, [p.get("achieved_rps") for p in pts], **kw)
        a2.plot(xs, [p.get("output_tok_s") for p in pts], **kw)
    for ax, title in ((a1, "achieved throughput (req/s)"), (a2, "output tokens/s")):
        ax.set_xticks(ticks, labels)
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    if review.config.load_rps is not None and xlabel.startswith("offered"):
        a1.axhline(review.config.load_rps, ls=":", color="grey", label=f"load {review.config.load_rps:g} req/s")
    a1.legend(fontsize=8)
    return _png(fig)


def latency_plot(review: Review) -> bytes | None:
    fig = latency_figure(review)
    return _png(fig) if fig is not None else None


def latency_figure(review: Review) -> Any:
    """TTFT p99 and ITL p99 against the load, one curve per scheme; each panel's SLO as a dashed line,
    named in that panel's legend and written on the line. None without speed points."""
    cards = [sc for sc in review.cards if sc.speed.get("points")]
    if not cards:
        return None
    many = len({sc.model for sc in cards}) > 1
    pos, ticks, labels, xlabel = _x_positions(cards)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    rc = review.config
    for ax, key, title, slo in (
        (axes[0], "ttft_ms_p99", "TTFT p99 (ms)", rc.ttft_ms_p99),
        (axes[1], "itl_ms_p99", "ITL p99 (ms)", rc.itl_ms_p99),
    ):
        for i, sc in enumerate(cards):
            pts = [p for p in sc.speed["points"] if p.get(key) is not None]
            ax.plot(
                [pos[p["load"]] for p in pts],
                [p[key] for p in pts],
                marker="o",
                color=_color(sc, i),
                label=_name(sc, many),
            )
        if slo is not None:
            ax.axhline(slo, ls="--", color="red", lw=1, label=f"SLO {slo:g} ms")
            ax.annotate(
                f"SLO {slo:g} ms", (0.01, slo), xycoords=("axes fraction", "data"), color="red", fontsize=8, va="bottom"
            )
        ax.set_xticks(ticks, labels)
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    return fig


def memory_plot(review: Review) -> bytes | None:
    cards = [sc for sc in review.cards if sc.memory.get("weights_gib") is not None]
    if not cards:
        return None
    many = len({sc.model for sc in cards}) > 1
    budget = review.config.memory_budget_gib
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(cards) + 2), 4.2))
    names = [_name(sc, many) for sc in cards]
    w = [sc.memory["weights_gib"] for sc in cards]
    kv = [sc.memory.get("kv_needed_gib") or 0.0 for sc in cards]
    res = [sc.memory.get("reserved_gib") or 0.0 for sc in cards]
    x = list(range(len(cards)))
    ax.bar(x, w, color="#4c72b0", label="weights")
    ax.bar(x, kv, bottom=w, color="#dd8452", label="KV cache needed")
    used = [a + b for a, b in zip(w, kv)]
    if any(res):
        ax.bar(x, res, bottom=used, color="#8172b3", label="reserve")
        used = [a + b for a, b in zip(used, res)]
    if budget is not None:
        free = [max(0.0, budget - u) for u in used]
        over = [max(0.0, u - budget) for u in used]
        ax.bar(x, free, bottom=used, color="#55a868", alpha=0.35, label="free")
        if any(over):
            ax.bar(
                x, [-o for o in over], bottom=used, fill=False, hatch="//", edgecolor="red", lw=0, label="over budget"
            )
        ax.axhline(budget, color="red", ls="--", lw=1.2, label=f"budget {budget:g} GiB")
    for xi, u in zip(x, used):
        ax.annotate(
            f"{u:.3g} GiB", (xi, u), ha="center", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points"
        )
    top = max(used + ([budget] if budget is not None else []))
    ax.set_ylim(0, top * 1.15)
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set_ylabel("GiB")
    ax.set_title("memory: weights + KV cache for the needed capacity, against the budget")
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


def accuracy_plot(review: Review) -> bytes | None:
    cards = [sc for sc in review.cards if sc.accuracy]
    if not cards:
        return None
    many = len({sc.model for sc in cards}) > 1
    score_names = list(dict.fromkeys(f"{d.name} {d.metric}" for sc in cards for d in sc.accuracy if d.kind == "score"))
    ppl_names = list(dict.fromkeys(d.metric for sc in cards for d in sc.accuracy if d.kind == "perplexity"))
    panels = [p for p in (("score", score_names), ("perplexity", ppl_names)) if p[1]]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels) + 1, 4.2), squeeze=False)
    width = 0.8 / max(1, len(cards))
    for ax, (kind, names) in zip(axes[0], panels):
        for i, sc in enumerate(cards):
            ds = {(f"{d.name} {d.metric}" if kind == "score" else d.metric): d for d in sc.accuracy if d.kind == kind}
            xs, ys, lo, hi = [], [], [], []
            for k, name in enumerate(names):
                d = ds.get(name)
                if d is None:
                    continue
                v = (100 * d.delta if d.delta is not None else None) if kind == "score" else d.delta_pct
                if v is None:
                    continue
                iv = d.interval
                low = (100 * iv.low if kind == "score" else iv.low) if iv else v
                high = (100 * iv.high if kind == "score" else iv.high) if iv else v
                xs.append(k - 0.4 + width * (i + 0.5))
                ys.append(v)
                lo.append(max(0.0, v - low))
                hi.append(max(0.0, high - v))
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=3, color=_color(sc, i), label=_name(sc, many))
        ax.axhline(0, color="black", lw=0.8)
        if kind == "perplexity" and review.config.max_perplexity_increase_pct is not None:
            ax.axhline(
                review.config.max_perplexity_increase_pct,
                color="red",
                ls="--",
                lw=1,
                label=f"limit +{review.config.max_perplexity_increase_pct:g}%",
            )
        ax.set_xticks(range(len(names)), names, rotation=15, ha="right", fontsize=8)
        ax.set_ylabel("delta (percentage points)" if kind == "score" else "change (%)")
        ax.set_title(
            "task score delta vs baseline, 95% interval"
            if kind == "score"
            else "perplexity change vs baseline, 95% interval"
        )
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    return _png(fig)


def make_plots(review: Review) -> dict[str, bytes]:
    """All plots that have data, name -> PNG bytes."""
    out = {}
    for name, fn in (
        ("throughput", throughput_plot),
        ("latency", latency_plot),
        ("memory", memory_plot),
        ("accuracy", accuracy_plot),
    ):
        png = fn(review)
        if png:
            out[name] = png
    return out
