"""The accuracy number of a scorecard: each metric's delta against the baseline with its paired interval.

Pairs the per-item samples of scheme and baseline (``accuracy.samples``) on their doc ids and computes
intervals and tests with :mod:`quantverdict.review.stats`; without samples, an unpaired interval from the two
stderrs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from quantverdict.config.schema import ReviewConfig
from quantverdict.results.baseline import accuracy_deltas, eval_mismatch, pct_change
from quantverdict.results.record import JobRecord, TaskResult
from quantverdict.review import stats
from quantverdict.review.kld import kld_deltas
from quantverdict.review.scorecard import SOURCE_DIR_KEY, TaskDelta
from quantverdict.review.stats import Interval


def _read_samples(rec: JobRecord, task: str) -> list[dict[str, Any]] | None:
    """The per-item rows lm-eval wrote for ``task`` (``accuracy.samples``), found where the job wrote them or
    beside the record it was read from (:data:`SOURCE_DIR_KEY`); None when there are none."""
    path = (rec.accuracy.samples or {}).get(task)
    if not path:
        return None
    p = Path(path)
    candidates = [p]
    source_dir = rec.extra.get(SOURCE_DIR_KEY)
    if source_dir:
        candidates += [Path(source_dir) / "eval" / p.name, Path(source_dir) / p.name]
    for c in candidates:
        if c.is_file():
            return [json.loads(line) for line in c.read_text().splitlines() if line.strip()]
    return None


def _pairs(
    a: list[dict[str, Any]], b: list[dict[str, Any]], keys: tuple[str, ...]
) -> tuple[list[dict], list[dict], str]:
    """Rows of both runs on the same doc_ids (sorted), with a note when the sets differ."""
    ia = {r["doc_id"]: r for r in a if all(r.get(k) is not None for k in keys)}
    ib = {r["doc_id"]: r for r in b if all(r.get(k) is not None for k in keys)}
    common = sorted(set(ia) & set(ib), key=str)
    note = ""
    if len(common) != len(ia) or len(common) != len(ib):
        note = f"paired on the {len(common)} items both ran ({len(ia)} vs {len(ib)} rows)"
    return [ia[d] for d in common], [ib[d] for d in common], note


def _score_delta(
    task: str, metric: str, v: float, b: float, rec: JobRecord, base: JobRecord, rc: ReviewConfig
) -> TaskDelta:
    td = TaskDelta(task, metric, "score", v, b, delta=v - b, recovery_pct=100.0 * v / b if b else None)
    sa, sb = _read_samples(rec, task), _read_samples(base, task)
    if sa and sb:
        ra, rb, note = _pairs(sa, sb, (metric,))
        if len(ra) == 1:  # one item is no sample: no interval, never "significant"
            td.paired, td.n, td.note = True, 1, NO_INTERVAL_FROM_ONE
            return td
        if ra:
            x = [float(r[metric]) for r in ra]
            y = [float(r[metric]) for r in rb]
            td.paired, td.n, td.note = True, len(x), note
            if rc.interval == "bootstrap":
                td.interval = stats.bootstrap_mean_diff(
                    x, y, samples=rc.bootstrap_samples, seed=rc.seed, confidence=rc.confidence
                )
                if sum(y):
                    r = stats.bootstrap_ratio(
                        x, y, samples=rc.bootstrap_samples, seed=rc.seed, confidence=rc.confidence
                    )
                    td.recovery_interval = _scale(r, 100.0)
            else:
                td.interval = stats.paired_normal_interval(x, y, rc.confidence)
                if sum(y):
                    td.recovery_interval = _scale(stats.ratio_normal_interval(x, y, rc.confidence), 100.0)
            if all(t in (0.0, 1.0) for t in x + y):
                td.mcnemar_b, td.mcnemar_c, td.mcnemar_p = stats.mcnemar_exact(x, y)
            # point values from the pairs (equal to the record's when every item paired)
            td.significant = td.interval.excludes_zero()
            return td
    ma, mb = rec.accuracy.tasks.get(task) or TaskResult(), base.accuracy.tasks.get(task) or TaskResult()
    sea, seb = ma.metric(f"{metric}_stderr"), mb.metric(f"{metric}_stderr")
    td.n = ma.n
    why = "no per-item samples" if not (sa and sb) else "no common items"
    if sea is not None and seb is not None:
        td.interval = stats.unpaired_interval(v, sea, b, seb, rc.confidence)
        if v and b:
            td.recovery_interval = _scale(stats.unpaired_ratio_interval(v, sea, b, seb, rc.confidence), 100.0)
        td.significant = td.interval.excludes_zero()
        td.note = f"{why}: unpaired interval from the two stderrs (wider than a paired one)"
    else:
        td.note = f"{why} and no stderr: no interval"
    return td


NO_INTERVAL_FROM_ONE = "measured on 1 item: no interval and no significance test (they need at least 2 items)"


def _scale(iv: Interval, k: float) -> Interval:
    return Interval(iv.estimate * k, iv.low * k, iv.high * k, iv.method)


def _ppl_from_log_ratio(iv: Interval) -> Interval:
    """log(ppl ratio) interval -> % change interval: 100·(exp(L) - 1)."""

    def f(v: float) -> float:
        return 100.0 * math.expm1(v)

    return Interval(f(iv.estimate), f(iv.low), f(iv.high), iv.method)


def _ppl_delta(
    task: str, metric: str, v: float, b: float, rec: JobRecord, base: JobRecord, rc: ReviewConfig
) -> TaskDelta:
    td = TaskDelta(metric if task == metric else task, metric, "perplexity", v, b, delta_pct=pct_change(v, b))
    count = {"word_perplexity": "n_words", "byte_perplexity": "n_bytes"}.get(metric)
    sa, sb = (_read_samples(rec, task), _read_samples(base, task)) if count else (None, None)
    if sa and sb and count:
        ra, rb, note = _pairs(sa, sb, ("loglikelihood", count))
        if len(ra) == 1:  # one document is no sample: no interval, never "significant"
            td.paired, td.n, td.note = True, 1, NO_INTERVAL_FROM_ONE
            return td
        if ra:
            # log(ppl_s / ppl_b) = sum(ll_b - ll_s) / sum(count): a ratio estimator over documents
            num = [float(q["loglikelihood"]) - float(p["loglikelihood"]) for p, q in zip(ra, rb)]
            den = [float(p[count]) for p in ra]
            if rc.interval == "bootstrap":
                iv = stats.bootstrap_ratio(
                    num, den, samples=rc.bootstrap_samples, seed=rc.seed, confidence=rc.confidence
                )
            else:
                iv = stats.log_ratio_normal_interval(num, den, rc.confidence)
            td.interval, td.paired, td.n, td.note = _ppl_from_log_ratio(iv), True, len(num), note
            td.significant = td.interval.excludes_zero()
            return td
    td.note = "no per-window data: no interval" if task == metric else "no per-document samples: no interval"
    return td


def accuracy_section(
    rec: JobRecord, base: JobRecord | None, rc: ReviewConfig
) -> tuple[list[TaskDelta], str | None, list[str]]:
    """Deltas of ``rec`` against ``base`` (headline metric per task + every perplexity kind).

    Returns:
        ``(deltas, refused_reason, missing)``; ``refused_reason`` is set when the eval settings differ
        (no delta is reported then, see :func:`quantverdict.results.baseline.eval_mismatch`).
    """
    missing: list[str] = []
    if not rec.accuracy.tasks and not rec.accuracy.token_perplexity:
        return [], None, ["no accuracy results"]
    if base is None:
        return [], None, ["no baseline record with accuracy for this model: no deltas"]
    reason = eval_mismatch(rec, base)
    if reason:
        return [], reason, []
    headline = rec.cfg("eval").get("headline") or {}
    deltas = accuracy_deltas(rec, base, headline)
    out: list[TaskDelta] = []
    tasks, btasks = rec.accuracy.tasks, base.accuracy.tasks
    for task, d in deltas.items():
        if task == "token_perplexity":
            continue
        metric = d["metric"]
        if "perplexity" in metric:
            out.append(_ppl_delta(task, metric, d["value"], d["baseline"], rec, base, rc))
            for other in ("word_perplexity", "byte_perplexity"):
                v, b = tasks[task].metric(other), (btasks[task].metric(other) if task in btasks else None)
                if other != metric and v is not None and b is not None:
                    out.append(_ppl_delta(task, other, v, b, rec, base, rc))
        else:
            out.append(_score_delta(task, metric, d["value"], d["baseline"], rec, base, rc))
    for task in tasks:
        if task not in deltas:
            missing.append(f"{task}: no baseline value of the headline metric")
    if "token_perplexity" in deltas:
        d = deltas["token_perplexity"]
        out.append(_ppl_delta("token_perplexity", "token_perplexity", d["value"], d["baseline"], rec, base, rc))
    out += kld_deltas(rec)  # issue #17: mean KLD and top-1 agreement, beside the token perplexity delta
    return out, None, missing
