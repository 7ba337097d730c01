"""The review's Validity prose: what each scorecard's accuracy and speed numbers stand on, and the flags of
failed checks."""

from __future__ import annotations

from collections.abc import Iterable

from quantverdict.measure import bench_result, server_metrics, sweep, sweep_plan
from quantverdict.measure import validity as point_checks
from quantverdict.results.record import JobRecord
from quantverdict.review.document import Speed
from quantverdict.review.flags import Flag, FlagCode
from quantverdict.review.speed import load_label, point_label, raw_points


def accuracy_validity(rec: JobRecord, sc_name: str) -> tuple[list[Flag], list[str]]:
    """Flags and Validity lines from the evaluate stage's own checks (``accuracy.checks``): batch
    invariance of the log-likelihoods, and word/byte perplexity recomputed from the summed
    log-likelihood; plus the settings every delta was computed under.

    Returns:
        ``(flags, lines)``: flags for failed checks, lines for the Validity section.
    """
    acc = rec.accuracy
    if acc.is_empty():
        return [], []
    out: list[Flag] = []
    lines: list[str] = []
    st = acc.settings or {}
    if st:
        lines.append(
            f"{sc_name}: eval batch_size {st.get('batch_size')}, dtype {st.get('dtype')}, max_length "
            f"{st.get('max_length')}, backend {st.get('backend')} (deltas refused unless the baseline's match); "
            f"{st.get('normalization') or 'acc_norm normalisation not stated'}"
        )
    checks = acc.checks or {}
    bi = checks.get("batch_invariance")
    if bi:
        if bi.get("skipped"):
            lines.append(f"{sc_name}: batch-invariance check skipped: {bi['skipped']}")
        elif bi.get("ok") is False:
            out.append(
                Flag(
                    FlagCode.BATCH_VARIANCE,
                    sc_name,
                    f"{sc_name}: batching changed a request's log-likelihood by up to "
                    f"{bi.get('max_abs_diff'):.3g} (batch size {bi.get('batch_sizes')}, > {bi.get('tolerance'):g}): "
                    "lm-eval scores depend on the batch",
                )
            )
        else:
            state = "ok" if bi.get("ok") else f"not judged ({bi.get('note') or 'no tolerance'})"
            lines.append(
                f"{sc_name}: batch invariance {state}: max |delta log-likelihood| {bi.get('max_abs_diff'):.3g} "
                f"between batch sizes {bi.get('batch_sizes')} ({bi.get('dtype')}, {bi.get('n_requests')} requests)"
            )
    fam = checks.get("perplexity_family")
    if fam:
        if fam.get("ok") is False:
            out.append(
                Flag(
                    FlagCode.PERPLEXITY_FAMILY,
                    sc_name,
                    f"{sc_name}: lm-eval's word/byte perplexity differ from exp(-loglikelihood_sum / count) by up to "
                    f"{100 * (fam.get('max_rel_diff') or 0):.2g}%",
                )
            )
        elif fam.get("ok"):
            lines.append(
                f"{sc_name}: word_perplexity and byte_perplexity recomputed from one summed log-likelihood "
                "(divided by words, by UTF-8 bytes) agree with lm-eval's"
            )
    tp = acc.token_perplexity or {}
    if tp:
        how = (
            "non-overlapping: the first token of each window is context only"
            if tp.get("stride") == tp.get("seq_len")
            else f"every token after the first scored once, with >= {tp.get('seq_len', 0) - tp.get('stride', 0)} "
            "tokens of context"
        )
        lines.append(
            f"{sc_name}: token_perplexity over {tp.get('n_tokens')} scored tokens in windows of "
            f"{tp.get('seq_len')} with stride {tp.get('stride')} ({how}); not comparable with word_perplexity"
        )
    return out, lines


def _range_s(values: Iterable[float]) -> str:
    v = sorted(values)
    return f"{v[0]:.3g} s" if f"{v[0]:.3g}" == f"{v[-1]:.3g}" else f"{v[0]:.3g}-{v[-1]:.3g} s"


def speed_validity_lines(rec: JobRecord, sc_name: str, speed: Speed) -> list[str]:
    """Lines for the review's Validity section: what each speed number stands on (repeats, spread,
    saturated and invalid points, points whose measured window stayed under ``bench.min_duration_s``
    (``window_met`` false), the ceiling's definition, the kernel check). Not to be confused with
    :func:`quantverdict.serving.speed.speed_validity`, which writes the record's speed summaries."""
    mode, raw = raw_points(rec)
    if not raw:
        return []
    lines = []
    levels = sweep.summarize(raw, mode)
    invalid = [point_label(q, mode) for q in raw if not point_checks.point_valid(q)]
    sat_raw = [q for q in raw if point_checks.point_valid(q) and point_checks.point_saturated(q)]
    saturated = [
        f"{point_label(q, mode)} ({point_checks.describe_saturation(point_checks.point_saturation(q))})"
        for q in sat_raw
    ]
    reps = sorted({lv["repeats"] for lv in levels})
    text = (
        f"{sc_name}: {len(raw)} speed points over {len(levels)} load levels, "
        f"{'/'.join(str(r) for r in reps)} repeat(s) each; every number is a median over valid repeats"
    )
    text += f"; invalid (left out): {', '.join(invalid)}" if invalid else "; no invalid point"
    # the sweep client runs a short window once more (children.sweep_client); one still short is kept, and named
    missed = [q for q in raw if q.get("window_met") is False]
    if missed:
        text += "; measured window still under bench.min_duration_s after its second attempt (kept): " + ", ".join(
            f"{point_label(q, mode)} {float(q['duration_s']):.2f} s of {float(q['min_duration_s']):g} s" for q in missed
        )
    text += (
        f"; saturated: {', '.join(saturated)}"
        if saturated
        else ("; no point saturated" if mode == "rate" else "; closed loop: saturation not defined")
    )
    ceiling = speed.ceiling
    kind = ceiling.kind if ceiling else None
    if ceiling and kind and kind != "none":
        rng = ceiling.output_tok_s_range
        spread_txt = (
            f" [{rng.min:.1f}-{rng.max:.1f}] over {ceiling.repeats} repeats"
            if rng and (ceiling.repeats or 1) > 1
            else " (one run: no spread)"
        )
        stopped = speed.stopped_before
        what = {
            "saturated": "the highest achieved rate over the valid loads, which reach a saturated rate or the burst",
            "lower_bound": (
                f"a lower bound: the sweep has no valid point at {', '.join(stopped)}, so the server's ceiling may "
                "lie above it"
                if stopped
                else "a lower bound: no point saturated, the server's ceiling lies above the sweep"
            ),
            "closed_loop_max": "the best concurrency",
        }[kind]
        text += f"; ceiling {ceiling.output_tok_s:.1f} out tok/s{spread_txt} at {ceiling.label} ({what})"
    lines.append(text)
    short = [q for q in raw if point_checks.point_valid(q) and bench_result.recorded_window_too_short(q)]
    if short:
        levels_short = dict.fromkeys(load_label({**q, "load": sweep_plan.load_of(q, mode)}, mode) for q in short)
        lines.append(
            f"{sc_name}: throughput at {', '.join(levels_short)} ({len(short)} of its points) is the whole run's: "
            f"the steady window ({_range_s(q['steady_window_s'] for q in short)}) was shorter than "
            f"{bench_result.STEADY_MIN_LIFETIMES:g} request lifetimes (E2E p50 "
            f"{_range_s(q['e2e_ms_p50'] / 1000 for q in short)}), where completions come in waves"
        )
    cache = server_metrics.cache_summary(raw)
    if cache:
        lines.append(f"{sc_name}: {cache}")
    kc = rec.speed.kernel_check
    if kc:
        comp = {True: "comparable for speed", False: "NOT comparable for speed", None: "comparability unknown"}
        lines.append(
            f"{sc_name}: kernel {', '.join(kc.get('kernels') or []) or '(none named in the log)'}; "
            f"{comp[kc.get('comparable_for_speed')]} ({kc.get('reason')})"
        )
    return lines
