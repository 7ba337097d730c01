"""Joining a scheme's record with its model's baseline record: comparability and deltas."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from quantverdict.results.record import JobRecord, TaskResult

# eval settings that must be identical for an accuracy delta to mean anything
DELTA_SETTINGS = ("backend", "batch_size", "max_length", "num_fewshot", "limit", "task_limits", "dtype")
TOKEN_PPL_SETTINGS = ("seq_len", "stride", "max_tokens")
# eval.backend=server: lm-eval's effective length (settings.dtype already holds the served engine's dtype)
SERVER_SETTINGS = ("lm_eval_max_length",)


def eval_mismatch(rec: JobRecord, base: JobRecord) -> str | None:
    """None when ``rec`` and ``base`` ran the same eval settings, else the reason a delta is refused."""
    a, b = rec.accuracy.settings, base.accuracy.settings
    if not a or not b:
        return "accuracy missing in " + ("this job" if not a else "the baseline")
    diffs = [f"{k}: {a.get(k)!r} vs baseline {b.get(k)!r}" for k in DELTA_SETTINGS if a.get(k) != b.get(k)]
    if a.get("backend") == "server" and b.get("backend") == "server":  # what the served engine computed with
        sa, sb = a.get("server") or {}, b.get("server") or {}
        diffs += [
            f"server.{k}: {sa.get(k)!r} vs baseline {sb.get(k)!r}" for k in SERVER_SETTINGS if sa.get(k) != sb.get(k)
        ]
    ta = rec.accuracy.token_perplexity or {}
    tb = base.accuracy.token_perplexity or {}
    diffs += [
        f"token_perplexity.{k}: {ta.get(k)!r} vs {tb.get(k)!r}" for k in TOKEN_PPL_SETTINGS if ta.get(k) != tb.get(k)
    ]
    return "eval settings differ (" + "; ".join(diffs) + ")" if diffs else None


def has_accuracy(rec: JobRecord) -> bool:
    """Whether a record holds accuracy results to compare with: an lm-eval task's metrics or a token perplexity
    (not merely an ``accuracy`` section: settings alone, or why it was not applicable)."""
    return bool(rec.accuracy.tasks) or rec.accuracy.token_perplexity_section.token_perplexity is not None


def baseline_scheme(rec: JobRecord) -> Any:
    """The scheme ``rec``'s model is compared with: ``config.baseline_scheme``, default ``bf16``."""
    return rec.config.get("baseline_scheme", "bf16")


def _newest_finished(r: JobRecord) -> tuple[bool, str]:
    return r.status == "ok", r.job.finished_at or r.job.started_at or ""


def baseline_candidates(rec: JobRecord, records: Sequence[JobRecord]) -> list[JobRecord]:
    """The records of ``rec``'s model in its baseline scheme (:func:`baseline_scheme`), with or without results:
    finished (status ok) ones first, then the newest (``job.finished_at``, else ``started_at``)."""
    want = baseline_scheme(rec)
    cands = [r for r in records if r.job.model == rec.job.model and r.job.scheme == want]
    return sorted(cands, key=_newest_finished, reverse=True)


def find_baseline(rec: JobRecord, records: Sequence[JobRecord]) -> JobRecord | None:
    """The baseline an accuracy delta of ``rec`` is taken against: the first of :func:`baseline_candidates` that
    holds accuracy results (:func:`has_accuracy`); None when there is none (:func:`no_baseline_reason` says why)."""
    return next((r for r in baseline_candidates(rec, records) if has_accuracy(r)), None)


def no_baseline_reason(rec: JobRecord, records: Sequence[JobRecord]) -> str:
    """Why :func:`find_baseline` found no baseline for ``rec``: no record of the baseline scheme, or each
    candidate (job id, status, when it finished) and what it lacks."""
    want, model = baseline_scheme(rec), rec.job.model
    cands = baseline_candidates(rec, records)
    if not cands:
        return f"no {want} record of {model} among the records"
    parts = []
    for r in cands:
        ev = r.stages.get("evaluate")
        why = "" if ev is None else f", evaluate {ev.status}" + (f" ({ev.detail})" if ev.detail else "")
        parts.append(f"{r.job.id} ({r.status}, finished {r.job.finished_at}): no accuracy results{why}")
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
    tp, btp = rec.accuracy.token_perplexity or {}, base.accuracy.token_perplexity or {}
    if tp.get("token_perplexity") and btp.get("token_perplexity"):
        out["token_perplexity"] = {
            "metric": "token_perplexity",
            "value": tp["token_perplexity"],
            "baseline": btp["token_perplexity"],
            "delta_pct": pct_change(tp["token_perplexity"], btp["token_perplexity"]),
        }
    return out
