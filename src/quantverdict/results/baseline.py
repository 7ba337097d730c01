"""Joining a scheme's record with its model's baseline record: comparability and deltas."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypeVar

from quantverdict.results.record import HEAD_SECTIONS, EvalSettings, JobRecord, TaskResult

# eval settings that must be identical for an accuracy delta to mean anything
DELTA_SETTINGS = ("backend", "batch_size", "max_length", "num_fewshot", "limit", "task_limits", "dtype")
TOKEN_PPL_SETTINGS = ("seq_len", "stride", "max_tokens")
# eval.backend=server: lm-eval's effective length (settings.dtype already holds the served engine's dtype)
SERVER_SETTINGS = ("lm_eval_max_length",)


def eval_mismatch(rec: JobRecord, base: JobRecord) -> str | None:
    """None when ``rec`` and ``base`` ran the same eval settings, else the reason a delta is refused."""
    if not rec.accuracy.settings or not base.accuracy.settings:
        return "accuracy missing in " + ("this job" if not rec.accuracy.settings else "the baseline")
    a, b = EvalSettings.of(rec.accuracy.settings), EvalSettings.of(base.accuracy.settings)
    diffs = [
        f"{k}: {getattr(a, k)!r} vs baseline {getattr(b, k)!r}"
        for k in DELTA_SETTINGS
        if getattr(a, k) != getattr(b, k)
    ]
    if a.backend == "server" and b.backend == "server":  # what the served engine computed with
        sa, sb = a.served, b.served
        diffs += [
            f"server.{k}: {getattr(sa, k)!r} vs baseline {getattr(sb, k)!r}"
            for k in SERVER_SETTINGS
            if getattr(sa, k) != getattr(sb, k)
        ]
    ta, tb = rec.accuracy.token_perplexity_section, base.accuracy.token_perplexity_section
    diffs += [
        f"token_perplexity.{k}: {getattr(ta, k)!r} vs {getattr(tb, k)!r}"
        for k in TOKEN_PPL_SETTINGS
        if getattr(ta, k) != getattr(tb, k)
    ]
    return "eval settings differ (" + "; ".join(diffs) + ")" if diffs else None


# a record as a caller holds it: typed, or the dict :func:`quantverdict.results.record.load` gives
AnyRecord = TypeVar("AnyRecord", JobRecord, dict[str, Any])


def typed(rec: JobRecord | dict[str, Any]) -> JobRecord:
    """``rec`` typed: a record dict read through :class:`JobRecord` (its job, status, stages and accuracy:
    :data:`quantverdict.results.record.HEAD_SECTIONS`), a typed record as it is."""
    return rec if isinstance(rec, JobRecord) else JobRecord.view(rec, only=HEAD_SECTIONS)


def has_accuracy(rec: JobRecord) -> bool:
    """Whether a record holds accuracy results to compare with: an lm-eval task's metrics or a token perplexity
    (not merely an ``accuracy`` section: settings alone, or why it was not applicable)."""
    return bool(rec.accuracy.tasks) or rec.accuracy.token_perplexity_section.token_perplexity is not None


def baseline_scheme(rec: JobRecord) -> str:
    """The scheme ``rec``'s accuracy and speed are compared with: ``config.baseline_scheme``, default bf16."""
    return rec.cfg.baseline_scheme or "bf16"


def baseline_candidates(rec: AnyRecord, records: Sequence[AnyRecord]) -> list[AnyRecord]:
    """The records of ``rec``'s model in its baseline scheme (:func:`baseline_scheme`), with or without results:
    finished (status ok) ones first, then the newest (``job.finished_at``, else ``started_at``). Records are given
    and returned typed or as dicts, alike."""
    this = typed(rec)
    want = baseline_scheme(this)
    cands = [(r, t) for r in records for t in [typed(r)] if t.job.model == this.job.model and t.job.scheme == want]
    cands.sort(key=lambda rt: (rt[1].status == "ok", rt[1].job.finished_at or rt[1].job.started_at or ""), reverse=True)
    return [r for r, _ in cands]


def find_baseline(rec: AnyRecord, records: Sequence[AnyRecord]) -> AnyRecord | None:
    """The baseline an accuracy delta of ``rec`` is taken against: of the records of the same model in the
    baseline scheme that hold accuracy results (:func:`has_accuracy`), a finished one before an unfinished one,
    then the newest; one without them (evaluation disabled, failed before it) is passed over however new. None
    when there is none (:func:`no_baseline_reason` says why)."""
    return next((r for r in baseline_candidates(rec, records) if has_accuracy(typed(r))), None)


def no_baseline_reason(rec: AnyRecord, records: Sequence[AnyRecord]) -> str:
    """Why :func:`find_baseline` found no baseline for ``rec``: no record of the baseline scheme, or each
    candidate (job id, status, when it finished) and what it lacks."""
    this = typed(rec)
    want, model = baseline_scheme(this), this.job.model
    cands = [typed(r) for r in baseline_candidates(rec, records)]
    if not cands:
        return f"no {want} record of {model} among the records"
    parts = []
    for r in cands:
        evaluate = r.stage("evaluate")
        why = f"evaluate {evaluate.status}" + (f" ({evaluate.detail})" if evaluate.detail else "")
        parts.append(
            f"{r.job.id} ({r.status}, finished {r.job.finished_at}): no accuracy results"
            + (f", {why}" if "evaluate" in r.stages else "")
        )
    return f"no {want} record of {model} holds accuracy results; candidates: " + "; ".join(parts)


def pct_change(value: float | None, base: float | None) -> float | None:
    """100 * (value - base) / base, or None if either is missing or base is 0."""
    if value is None or base is None or base == 0 or not math.isfinite(value) or not math.isfinite(base):
        return None
    return 100.0 * (value - base) / base


def headline_of(task: str, headline: dict[str, str], result: TaskResult | None) -> tuple[str, bool]:
    """A task's headline metric and whether a higher value is better.

    The metric: ``eval.headline``'s for the task, else the one the record names (``headline_metric``: the first of
    the lm-eval config's ``metric_list``), else ``acc``. The direction: the record's ``higher_is_better`` (lm-eval's)
    when it is for that metric, else lower is better for a perplexity and higher for anything else.
    """
    recorded = result.metric("headline_metric") if result is not None else None
    metric = str(headline.get(task) or recorded or "acc")
    hib = result.metric("higher_is_better") if result is not None and metric == recorded else None
    return metric, hib if isinstance(hib, bool) else "perplexity" not in metric


def accuracy_deltas(rec: JobRecord, base: JobRecord, headline: dict[str, str]) -> dict[str, Any]:
    """Per task: headline metric (:func:`headline_of`), its absolute delta and recovery % (100 * value / baseline)
    when higher is better; % change when lower is better (perplexities); ``higher_is_better`` says which.
    Refused (``{"refused": reason}``) when the eval settings differ."""
    reason = eval_mismatch(rec, base)
    if reason:
        return {"refused": reason}
    out: dict[str, Any] = {}
    tasks, btasks = rec.accuracy.tasks, base.accuracy.tasks
    for task, metrics in tasks.items():
        metric, higher = headline_of(task, headline, metrics)
        v, b = metrics.metric(metric), (btasks[task].metric(metric) if task in btasks else None)
        if v is None or b is None:
            continue
        if not higher:
            out[task] = {
                "metric": metric,
                "value": v,
                "baseline": b,
                "delta_pct": pct_change(v, b),
                "higher_is_better": False,
            }
        else:
            out[task] = {
                "metric": metric,
                "value": v,
                "baseline": b,
                "delta": v - b,
                "recovery_pct": 100.0 * v / b if b else None,
                "higher_is_better": True,
            }
    tp = rec.accuracy.token_perplexity_section.token_perplexity
    btp = base.accuracy.token_perplexity_section.token_perplexity
    if tp and btp:
        out["token_perplexity"] = {
            "metric": "token_perplexity",
            "value": tp,
            "baseline": btp,
            "delta_pct": pct_change(tp, btp),
        }
    return out
