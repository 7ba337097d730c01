"""Joining a scheme's record with its model's baseline record: comparability and deltas."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from quantverdict.measure.aggregate import is_number
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


class MetricDelta(BaseModel):
    """One headline metric of a job against its baseline (:func:`accuracy_deltas`): ``value`` and ``baseline``;
    higher is better: ``delta = value - baseline`` and ``recovery_pct = 100 * value / baseline`` (None for a
    baseline of 0); lower is better (perplexities): ``delta_pct = 100 * (value - baseline) / baseline``
    (:func:`pct_change`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: str
    value: float
    baseline: float
    higher_is_better: bool
    delta: float | None = None
    delta_pct: float | None = None
    recovery_pct: float | None = None


class AccuracyDeltas(BaseModel):
    """A job's accuracy against its baseline: ``tasks`` (task -> :class:`MetricDelta`, where both hold the task's
    headline metric) and ``token_perplexity``; or ``refused``, why no delta is taken (:func:`eval_mismatch`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    refused: str | None = None
    tasks: dict[str, MetricDelta] = Field(default_factory=dict)
    token_perplexity: MetricDelta | None = None

    def of(self, task: str) -> MetricDelta | None:
        """``tasks.<task>``, None where the task has no delta."""
        return self.tasks.get(task)


def _delta(metric: str, value: float, base: float, higher: bool) -> MetricDelta:
    if higher:
        recovery = 100.0 * value / base if base else None
        return MetricDelta(
            metric=metric, value=value, baseline=base, higher_is_better=True, delta=value - base, recovery_pct=recovery
        )
    return MetricDelta(
        metric=metric, value=value, baseline=base, higher_is_better=False, delta_pct=pct_change(value, base)
    )


def accuracy_deltas(rec: JobRecord, base: JobRecord, headline: dict[str, str]) -> AccuracyDeltas:
    """Per task: headline metric (:func:`headline_of`), its absolute delta and recovery % when higher is better,
    % change when lower is better (perplexities); the token perplexity's % change. Refused (``refused`` set, no
    deltas) when the eval settings differ; a task whose headline value is not a number in both is left out."""
    reason = eval_mismatch(rec, base)
    if reason:
        return AccuracyDeltas(refused=reason)
    tasks: dict[str, MetricDelta] = {}
    btasks = base.accuracy.tasks
    for task, metrics in rec.accuracy.tasks.items():
        metric, higher = headline_of(task, headline, metrics)
        v, b = metrics.metric(metric), (btasks[task].metric(metric) if task in btasks else None)
        if is_number(v) and is_number(b):
            tasks[task] = _delta(metric, float(v), float(b), higher)
    tp = rec.accuracy.token_perplexity_section.token_perplexity
    btp = base.accuracy.token_perplexity_section.token_perplexity
    token = _delta("token_perplexity", tp, btp, higher=False) if tp and btp else None
    return AccuracyDeltas(tasks=tasks, token_perplexity=token)
