"""Accuracy deltas against the baseline (:mod:`quantverdict.measure.stats`): paired on ``doc_id`` (refused when
lm-eval's ``doc_hash``/``prompt_hash`` differ), token perplexity over its windows, else unpaired from the stderrs."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, replace
from typing import Any

from quantverdict.config.schema import ReviewConfig
from quantverdict.measure import stats
from quantverdict.measure.stats import Interval
from quantverdict.results.baseline import eval_mismatch, headline_of, pct_change
from quantverdict.results.record import JobRecord
from quantverdict.review.document import AccuracyDelta, DeltaKind
from quantverdict.review.document import Interval as DocInterval
from quantverdict.review.kld import kld_deltas
from quantverdict.review.speed import beside

# lm-eval's per-sample hashes (lm_eval/evaluator.py: sha256 of the doc as JSON and of the first request's prompt)
HASH_KEYS = ("doc_hash", "prompt_hash")
NO_HASHES = "paired by doc_id only (the samples carry no doc_hash/prompt_hash to check the items)"

NO_WINDOWS = "no per-window data in this record: no interval"


def read_samples(rec: JobRecord, task: str) -> list[dict[str, Any]] | None:
    """lm-eval's per-item rows of ``task``, beside the record (:attr:`JobRecord.source_dir`) or where written."""
    samples = rec.accuracy.samples or {}
    if (path := beside(rec, samples[task] if task in samples else None, "eval")) is None:
        return None
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class Pairing:
    """Rows of both runs on the same doc ids, what the pairing rests on, or why it is refused (rows empty)."""

    a: list[dict[str, Any]]
    b: list[dict[str, Any]]
    note: str = ""
    refused: str | None = None


def pair_samples(task: str, a: list[dict[str, Any]], b: list[dict[str, Any]], keys: tuple[str, ...]) -> Pairing:
    """Pair scheme (``a``) and baseline (``b``) rows with every one of ``keys`` on ``doc_id``."""
    ia, ib = ({r["doc_id"]: r for r in rows if all(r.get(k) is not None for k in keys)} for rows in (a, b))
    common = sorted(set(ia) & set(ib), key=lambda d: (isinstance(d, str), d))
    notes = []
    if len(common) != len(ia) or len(common) != len(ib):
        notes.append(f"paired on the {len(common)} items both ran ({len(ia)} vs {len(ib)} rows)")
    unchecked = False
    for d, h in itertools.product(common, HASH_KEYS):
        x, y = ia[d].get(h), ib[d].get(h)
        unchecked = unchecked or (h == "doc_hash" and (x is None or y is None))
        if x is not None and y is not None and x != y:
            why = f"{task} doc_id {d}: {h} differs ({str(x)[:12]}... vs {str(y)[:12]}... in the baseline)"
            what = "document" if h == "doc_hash" else "prompt"
            return Pairing([], [], refused=f"{why}: the two runs did not score the same {what}; paired test refused")
    if unchecked:
        notes.append(NO_HASHES)
    return Pairing([ia[d] for d in common], [ib[d] for d in common], "; ".join(notes))


def _pairs(
    td: AccuracyDelta, task: str, sa: list[dict[str, Any]], sb: list[dict[str, Any]], keys: tuple[str, ...], unit: str
) -> Pairing | None:
    """The pairing when it has 2+ common items, else None; ``td`` marked when refused or on one item."""
    pairing = pair_samples(task, sa, sb, keys)
    if pairing.refused:
        td.note = td.refused = pairing.refused
    elif len(pairing.a) == 1:  # one item is no sample: no interval, never "significant"
        td.paired, td.n, td.note = True, 1, "; ".join(n for n in (pairing.note, stats.too_few(1, unit)) if n)
    elif pairing.a:
        td.paired, td.n, td.note = True, len(pairing.a), pairing.note
        return pairing
    return None


def _boot(rc: ReviewConfig) -> dict[str, Any]:
    return {"samples": rc.bootstrap_samples, "seed": rc.seed, "confidence": rc.confidence}


def diff_interval(x: list[float], y: list[float], rc: ReviewConfig) -> Interval:
    """The interval of ``mean(x) - mean(y)`` over paired items, by ``review.interval``."""
    if rc.interval == "bootstrap":
        return stats.bootstrap_mean_diff(x, y, **_boot(rc))
    return stats.paired_normal_interval(x, y, rc.confidence)


def _judged(td: AccuracyDelta, iv: Interval) -> None:
    td.interval, td.significant = DocInterval.of(iv), stats.significant(iv)


def _score_delta(
    task: str, metric: str, v: float, b: float, rec: JobRecord, base: JobRecord, rc: ReviewConfig
) -> AccuracyDelta:
    td = AccuracyDelta.new(task, metric, DeltaKind.SCORE, v, b, delta=v - b, recovery_pct=100.0 * v / b if b else None)
    sa, sb = read_samples(rec, task), read_samples(base, task)
    pairing = _pairs(td, task, sa, sb, (metric,), "item") if sa and sb else None
    if pairing:
        x = [float(r[metric]) for r in pairing.a]
        y = [float(r[metric]) for r in pairing.b]
        _judged(td, diff_interval(x, y, rc))
        if sum(y) and rc.interval == "bootstrap":
            td.recovery_interval = DocInterval.of(_pct(stats.bootstrap_ratio(x, y, **_boot(rc))))
        elif sum(y):
            td.recovery_interval = DocInterval.of(_pct(stats.ratio_normal_interval(x, y, rc.confidence)))
        if all(t in (0.0, 1.0) for t in x + y):
            td.mcnemar_b, td.mcnemar_c, td.mcnemar_p = stats.mcnemar_exact(x, y)
        return td
    if td.refused or td.paired:
        return td
    ma, mb = rec.accuracy.tasks[task], base.accuracy.tasks[task]
    sea, seb = ma.metric(f"{metric}_stderr"), mb.metric(f"{metric}_stderr")
    td.n = ma.n
    why = "no per-item samples" if not (sa and sb) else "no common items"
    if few := stats.too_few(td.n) if isinstance(td.n, int) else None:
        td.note = f"{why}; {few}"
    elif sea is not None and seb is not None:
        _judged(td, stats.unpaired_interval(v, sea, b, seb, rc.confidence, n=td.n))
        if v and b:
            ratio = stats.unpaired_ratio_interval(v, sea, b, seb, rc.confidence, n=td.n)
            td.recovery_interval = DocInterval.of(_pct(ratio))
        td.note = f"{why}: unpaired interval from the two stderrs (wider than a paired one)"
    else:
        td.note = f"{why} and no stderr: no interval"
    return td


def _pct(iv: Interval, log_ratio: bool = False) -> Interval:
    """A ratio's interval in % (``100·r``); a log(ppl ratio)'s as the % change ``100·(exp(L) - 1)``."""
    est, low, high = (100.0 * (math.expm1(v) if log_ratio else v) for v in (iv.estimate, iv.low, iv.high))
    return replace(iv, estimate=est, low=low, high=high)


def _ppl_delta(
    task: str, metric: str, v: float, b: float, rec: JobRecord, base: JobRecord, rc: ReviewConfig
) -> AccuracyDelta:
    td = AccuracyDelta.new(task, metric, DeltaKind.PERPLEXITY, v, b, delta_pct=pct_change(v, b))
    if task == "token_perplexity":
        return _token_ppl_delta(td, rec, base, rc)
    count = {"word_perplexity": "n_words", "byte_perplexity": "n_bytes"}.get(metric, "")
    sa, sb = (read_samples(rec, task), read_samples(base, task)) if count else (None, None)
    pairing = _pairs(td, task, sa, sb, ("loglikelihood", count), "document") if sa and sb else None
    if pairing:
        ra, rb = pairing.a, pairing.b
        # log(ppl_s / ppl_b) = sum(ll_b - ll_s) / sum(count): a ratio estimator over documents
        num = [float(q["loglikelihood"]) - float(p["loglikelihood"]) for p, q in zip(ra, rb)]
        den = [float(p[count]) for p in ra]
        if rc.interval == "bootstrap":
            iv = stats.bootstrap_ratio(num, den, **_boot(rc), unit="document")
        else:
            iv = stats.log_ratio_normal_interval(num, den, rc.confidence, unit="document")
        _judged(td, _pct(iv, log_ratio=True))
        return td
    if td.refused or td.paired:
        return td
    lower = "lower is better: % change, no paired interval for this metric"
    td.note = "no per-document samples: no interval" if count or "perplexity" in metric else lower
    return td


def _token_ppl_delta(td: AccuracyDelta, rec: JobRecord, base: JobRecord, rc: ReviewConfig) -> AccuracyDelta:
    """Token perplexity's delta, paired over windows (:func:`quantverdict.measure.stats.window_log_ratio_interval`)."""
    wa, wb = rec.accuracy.token_perplexity_section.windows(), base.accuracy.token_perplexity_section.windows()
    if wa is None or wb is None:
        td.note = NO_WINDOWS
        return td
    (nll_a, tok_a), (nll_b, tok_b) = wa, wb
    if tok_a != tok_b:
        first = next((i for i, (x, y) in enumerate(zip(tok_a, tok_b)) if x != y), min(len(tok_a), len(tok_b)))
        td.note = td.refused = (
            f"token_perplexity windows differ ({len(tok_a)} vs {len(tok_b)} windows; first difference at window "
            f"{first}): the two runs did not score the same tokens; paired test refused"
        )
        return td
    td.paired, td.n = True, len(tok_a)
    if few := stats.too_few(td.n, "window"):
        td.note = few
        return td
    iv = stats.window_log_ratio_interval(nll_a, nll_b, tok_a, method=str(rc.interval), **_boot(rc))
    _judged(td, _pct(iv, log_ratio=True))
    return td


def accuracy_section(
    rec: JobRecord, base: JobRecord | None, rc: ReviewConfig, no_base: str = ""
) -> tuple[list[AccuracyDelta], str | None, list[str]]:
    """``(deltas, refused_reason, missing)`` of ``rec`` against ``base`` (headline metric per task, perplexities); a
    reason when the eval settings differ (:func:`~quantverdict.results.baseline.eval_mismatch`)."""
    missing: list[str] = []
    if not rec.accuracy.tasks and not rec.accuracy.token_perplexity:
        return [], None, ["no accuracy results"]
    if base is None:
        why = f" ({no_base})" if no_base else ""
        return [], None, [f"no baseline record with accuracy for this model: no deltas{why}"]
    if reason := eval_mismatch(rec, base):
        return [], reason, []
    headline = rec.headline()
    out: list[AccuracyDelta] = []
    btasks = base.accuracy.tasks
    for task, res in rec.accuracy.tasks.items():
        metric, higher = headline_of(task, headline, res)
        v, b = res.metric(metric), (btasks[task].metric(metric) if task in btasks else None)
        if v is None or b is None:
            missing.append(f"{task}: no baseline value of the headline metric")
        elif higher:
            out.append(_score_delta(task, metric, v, b, rec, base, rc))
        else:  # perplexities, and any metric lm-eval says is better lower
            out.append(_ppl_delta(task, metric, v, b, rec, base, rc))
            for other in ("word_perplexity", "byte_perplexity"):
                vo, bo = res.metric(other), (btasks[task].metric(other) if task in btasks else None)
                if other != metric and vo is not None and bo is not None:
                    out.append(_ppl_delta(task, other, vo, bo, rec, base, rc))
    tp = rec.accuracy.token_perplexity_section.token_perplexity
    btp = base.accuracy.token_perplexity_section.token_perplexity
    if tp and btp:
        out.append(_ppl_delta("token_perplexity", "token_perplexity", tp, btp, rec, base, rc))
    out += kld_deltas(rec)  # mean KLD and top-1 agreement, beside the token perplexity delta
    return out, None, missing
