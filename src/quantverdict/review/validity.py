"""The review's Validity lines and flags: what each scorecard's accuracy and speed numbers stand on, and the flags of
failed checks (words: ``templates/validity.j2``)."""

from __future__ import annotations

from typing import Any

from quantverdict.measure import bench_result, server_metrics, sweep
from quantverdict.measure import validity as point_checks
from quantverdict.results.record import AccuracyChecks, EvalSettings, JobRecord, KernelCheck
from quantverdict.review.document import Flag, Speed
from quantverdict.review.flags import FlagCode
from quantverdict.review.speed import level_label, point_label, raw_points
from quantverdict.review.words import say


def _say(macro: str, **values: Any) -> str:
    return say(macro, "validity.j2", **values)


def accuracy_validity(rec: JobRecord, sc_name: str) -> tuple[list[Flag], list[str]]:
    """``(flags, lines)``: flags for the evaluate stage's failed checks (``accuracy.checks``), Validity lines for the
    rest and for the settings every delta was computed under."""
    acc = rec.accuracy
    flags: list[Flag] = []
    lines: list[str] = []
    if acc.settings:
        lines.append(_say("eval_settings", name=sc_name, st=EvalSettings.of(acc.settings)))
    checks = AccuracyChecks.of(acc.checks)
    if bi := checks.batch_invariance:
        text = _say("batch_invariance", name=sc_name, bi=bi)
        if not bi.skipped and bi.ok is False:
            flags.append(Flag.new(FlagCode.BATCH_VARIANCE, text))
        else:
            lines.append(text)
    if fam := checks.perplexity_family:
        text = _say("perplexity_family", name=sc_name, ok=fam.ok, pct=100 * (fam.max_rel_diff or 0))
        if fam.ok is False:
            flags.append(Flag.new(FlagCode.PERPLEXITY_FAMILY, text))
        elif fam.ok:
            lines.append(text)
    if acc.token_perplexity:
        tp = acc.token_perplexity_section
        context = (tp.seq_len or 0) - (tp.stride or 0)
        lines.append(_say("token_perplexity", name=sc_name, tp=tp, context=context))
    return flags, lines


def speed_validity_lines(rec: JobRecord, sc_name: str, speed: Speed) -> list[str]:
    """Validity lines of what each speed number stands on: repeats, saturated, invalid and short-window points, the
    ceiling, prefix-cache hits, the kernel check."""
    mode, raw = raw_points(rec)
    if not raw:
        return []
    points = list(zip(rec.speed.points, raw))
    ok = [(p, q) for p, q in points if point_checks.point_valid(q)]
    top = speed.ceiling if speed.ceiling and speed.ceiling.kind not in (None, "", "none") else None
    levels = sweep.summarize(raw, mode)
    sat = [(p, point_checks.point_saturation(q)) for p, q in ok if point_checks.point_saturated(q)]
    words: dict[str, Any] = dict(name=sc_name, n_points=len(raw), n_levels=len(levels), mode=mode, top=top)
    words |= dict(reps=sorted({lv.repeats or 0 for lv in levels}), stopped=speed.stopped_before)
    reps = rec.cfg.bench.repeats
    words["invalid"] = [point_label(p, mode, reps) for p, q in points if not point_checks.point_valid(q)]
    # the sweep client runs a short window once more (children.sweep_client); one still short is kept, and named
    missed = [p for p, _ in points if p.window_met is False]
    words["missed"] = [
        (point_label(p, mode, reps), float(p.duration_s or 0), float(p.min_duration_s or 0)) for p in missed
    ]
    words["saturated"] = [f"{point_label(p, mode, reps)} ({point_checks.describe_saturation(why)})" for p, why in sat]
    lines = [_say("speed", **words)]
    if short := [q for _, q in ok if bench_result.recorded_window_too_short(q)]:
        labels = dict.fromkeys(level_label(q.load(mode), mode) for q in short)
        windows = sorted(q.steady_window_s or 0.0 for q in short)  # a short window is recorded, so is its E2E p50
        e2e = sorted((q.e2e_ms_p50 or 0.0) / 1000 for q in short)
        lifetimes = bench_result.STEADY_MIN_LIFETIMES
        words = dict(name=sc_name, levels=list(labels), n=len(short), windows=windows, lifetimes=lifetimes, e2e=e2e)
        lines.append(_say("steady_short", **words))
    if cache := server_metrics.cache_summary(raw):
        lines.append(f"{sc_name}: {cache}")
    if rec.speed.kernel_check:
        lines.append(_say("kernel", name=sc_name, kc=KernelCheck.of(rec.speed.kernel_check)))
    return lines
