"""Resume: a job whose identical work already finished is reused; an interrupted one is continued.

Two keys, both from content:

* the **config hash** (:func:`config_hash`, the job's id): the resolved config minus what does not change a
  result (output locations, ``resume``, the review's constraints, the server's port);
* the **resume key** (:func:`resume_key`): the config hash, every distribution installed in each stage
  environment (``name==version`` lines, :func:`installed`) and the sha256 of the calibration text's content
  (:func:`calibration_sha256`). A job is reused only under an equal resume key, so a stage environment with
  another llm-compressor (or any other package) reruns the job, and an edited calibration text does too.

The lookup happens before the job's stage environments are set up. Building one takes minutes, so it is not
built for the lookup: :func:`ready_pins` reads the installed distributions of environments that are already
complete (a venv with its ``.ready`` marker, or a ``kind: python`` interpreter) through each interpreter's
``importlib.metadata`` (one short process per environment, well under a second each; ``pip list`` lists the
same lines in several seconds). Where an environment is not built yet, nothing can have finished with it:
the job runs, and its setup stage records the key from the built environments.

:func:`find_completed` looks for a finished record with the resume key under ``paths.output_root`` and
:func:`reuse` copies it into the new job's folder, marked ``resumed_from``. :func:`find_interrupted` finds
the newest interrupted (or failed) attempt with the key; the job then reuses the stages that attempt finished
(:func:`reusable_evaluation`) and names it in ``job.resumed_attempt``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
from pathlib import Path
from typing import Any

from quantverdict.config import schemes
from quantverdict.config.compose import as_dict
from quantverdict.config.schema import Config, EnvConfig, StageEnvConfig
from quantverdict.processes import envs, venv_build
from quantverdict.processes.envs import StageEnv
from quantverdict.results.record import Checkpoint, JobRecord, ModelInfo, find_records, read

log = logging.getLogger(__name__)

STAGES = ("quantize", "serve")
# what an interrupted or failed attempt may hand on; a record still "running" may be a live job
UNFINISHED = ("interrupted", "failed")

# the distributions the interpreter sees, first on sys.path wins, as `pip list --format=freeze` lists them
_INSTALLED = """
import json, re
from importlib.metadata import distributions
seen = {}
for d in distributions():
    name = d.metadata["Name"]
    if name:
        seen.setdefault(re.sub(r"[-_.]+", "-", name).lower(), f"{name}=={d.version}")
print(json.dumps(sorted(seen.values(), key=str.lower)))
"""


# config groups that do not change a result: output locations (``tracking``'s store sits under the output root),
# ``resume``, the review's constraints and the checkpoint's sanity bounds (``quantize.sanity``: they decide whether
# a checkpoint is used, not what it measures)
UNHASHED = ("paths", "resume", "review", "tracking", "quantize")
# the server's port (``bench.server.port``, ``bench.server.strict_port``): jobs on one host serve on distinct ones
UNHASHED_SERVER = ("port", "strict_port")
# how the stage environments are installed (``env.installer``, ``env.extra_index_urls``): the same pins either way
UNHASHED_ENV = ("installer", "extra_index_urls")


def hashed_config(cfg: Config) -> dict[str, Any]:
    """The part of the resolved config that :func:`config_hash` hashes: every group but :data:`UNHASHED`, the
    server's settings without :data:`UNHASHED_SERVER`, the env without :data:`UNHASHED_ENV`, no ``kv`` group
    for the default KV cache (``kv.name == "auto"``, the served dtype), so that a config written before the ``kv``
    group existed hashes as the same config with ``kv=auto``, and no ``bench.dataset`` for vLLM's random prompts
    (``bench.dataset.kind == "random"``, whose other keys it does not read), so that a config written before the
    group existed hashes as the same config with the default traffic; likewise no ``bench.capacity`` while the
    capacity search is off (its other keys are then not read)."""
    kept = {k: v for k, v in as_dict(cfg).items() if k not in UNHASHED}
    if cfg.kv.name == "auto":
        del kept["kv"]
    server = {k: v for k, v in kept["bench"]["server"].items() if k not in UNHASHED_SERVER}
    bench = {**kept["bench"], "server": server}
    if cfg.bench.dataset.kind == "random":
        bench.pop("dataset", None)
    if not cfg.bench.capacity.enabled:
        bench.pop("capacity", None)
    kept["bench"] = bench
    kept["env"] = {k: v for k, v in kept["env"].items() if k not in UNHASHED_ENV}
    return kept


def config_hash(cfg: Config) -> str:
    """sha256 of the canonical JSON of :func:`hashed_config` (first 12 hex): the job's id, equal for two configs
    that measure the same."""
    return hashlib.sha256(json.dumps(hashed_config(cfg), sort_keys=True, default=str).encode()).hexdigest()[:12]


def installed(env: StageEnv) -> list[str]:
    """Every distribution ``env``'s interpreter sees, as sorted ``name==version`` lines.

    The same lines as :meth:`StageEnv.freeze` (``pip list --format=freeze``: the first distribution of a
    name on ``sys.path`` wins, system site packages included where the venv sees them), read with
    ``importlib.metadata`` in one short process instead of pip.

    Raises:
        subprocess.CalledProcessError: the interpreter failed.
    """
    out = subprocess.run(
        [env.python, "-c", _INSTALLED], capture_output=True, text=True, env={**os.environ, **env.env}, check=True
    )
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def ready_env(stage: str, cfg: StageEnvConfig, env_cfg: EnvConfig, project_root: Path) -> StageEnv | None:
    """The stage environment :func:`quantverdict.processes.envs.ensure` would return, if it is complete
    already (``kind: python``, or a venv with its ``.ready`` marker); None where it would have to be built."""
    extra = envs.stage_env_vars(cfg, env_cfg)
    if cfg.kind == "python":
        return StageEnv(stage, cfg.python, extra)
    if cfg.requirements is None:
        return None
    req = project_root / cfg.requirements
    if not req.is_file():
        return None
    wheelhouse = bool(env_cfg.wheelhouse)
    target = envs.venv_dir(
        Path(env_cfg.root).expanduser(), stage, req, env_cfg.base_python, wheelhouse, env_cfg.system_site_packages
    )
    if not (target / venv_build.READY).exists():
        return None
    return StageEnv(stage, str(target / "bin" / "python"), extra)


def ready_pins(cfg: Config) -> dict[str, list[str]] | None:
    """``{stage: installed(env)}`` for the quantize and serve environments, or None when one is not built yet
    (or its interpreter fails): see the module docstring."""
    root = Path(cfg.paths.project_root)
    pins = {}
    for stage in STAGES:
        try:
            env = ready_env(stage, getattr(cfg.env, stage), cfg.env, root)
            if env is None:
                return None
            pins[stage] = installed(env)
        except (OSError, subprocess.CalledProcessError, ValueError) as exc:
            log.info("the %s environment's packages could not be read (%s); no resume lookup", stage, exc)
            return None
    return pins


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def calibration_text(cfg: Config) -> Path | None:
    """The calibration text file a job reads (``scheme.calibration.text_file`` under ``data.offline_root``), or
    None when it reads a hub dataset (then ``hf_dataset``/``hf_subset``/``hf_split`` in the config name it)."""
    text_file = cfg.scheme.calibration.text_file
    if not (cfg.data.offline_root and text_file):
        return None
    return Path(cfg.data.offline_root) / text_file


def calibration_sha256(cfg: Config) -> str | None:
    """sha256 of the calibration text's content, for a method that calibrates and a text file that exists;
    None otherwise (no calibration, a hub dataset, or a missing file, which the quantize stage reports)."""
    path = calibration_text(cfg)
    if not schemes.calibrates(cfg) or path is None or not path.is_file():
        return None
    return sha256_file(path)


def pins_digest(lines: list[str]) -> str:
    """sha256 (first 16 hex) of an environment's ``name==version`` lines, in the order given (sorted)."""
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def resume_inputs(cfg: Config, pins: dict[str, list[str]]) -> dict[str, Any]:
    """What the resume key is made of: ``{"config_hash", "pins_sha256": {stage: digest}, "calibration_sha256"}``."""
    return {
        "config_hash": config_hash(cfg),
        "pins_sha256": {stage: pins_digest(pins[stage]) for stage in sorted(pins)},
        "calibration_sha256": calibration_sha256(cfg),
    }


def resume_key(inputs: dict[str, Any]) -> str:
    """sha256 (first 16 hex) of the canonical JSON of :func:`resume_inputs`."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def _newest(output_root: Path, key: str, exclude: Path, statuses: tuple[str, ...]) -> Path | None:
    best: tuple[str, Path] | None = None
    for path in find_records(output_root):
        if path.parent == exclude:
            continue
        try:
            rec = read(path)
        except (ValueError, OSError, json.JSONDecodeError) as exc:
            log.warning("not reused: %s (%s)", path, exc)  # a truncated, foreign or invalid record: not a finished job
            continue
        job = rec.job
        if rec.status in statuses and job.resume_key == key and not job.resumed_from:
            stamp = job.finished_at or job.started_at or ""
            if best is None or stamp > best[0]:
                best = (stamp, path)
    return best[1] if best else None


def find_completed(output_root: Path, key: str, exclude: Path) -> Path | None:
    """The newest finished (status ok) record under ``output_root`` with this resume key, if any (records made
    without a resume key never match: what they ran with is not known)."""
    return _newest(output_root, key, exclude, ("ok",))


def find_interrupted(output_root: Path, key: str, exclude: Path) -> Path | None:
    """The newest interrupted or failed record under ``output_root`` with this resume key, if any."""
    return _newest(output_root, key, exclude, UNFINISHED)


def reuse(previous: Path, out_dir: Path) -> dict[str, Any]:
    """Copy a finished job's record into ``out_dir`` (marked ``resumed_from``) instead of rerunning it."""
    rec = read(previous)
    rec.job.resumed_from = str(previous.parent)
    rec.job.output_dir = str(out_dir)
    rec.notes = [
        *(rec.notes or []),
        f"reused the finished job in {previous.parent} (same resume key: config, stage environments, calibration)",
    ]
    data = rec.to_dict()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "record.json").write_text(json.dumps(data, indent=2, default=str))
    log.info("skipping %s: identical job finished in %s (resume=false reruns it)", rec.job.id, previous.parent)
    return data


def reusable_evaluation(previous: JobRecord, checkpoint: Checkpoint, model: ModelInfo) -> bool:
    """Whether an earlier attempt's evaluate result holds for this job: that stage finished (``ok`` or reused),
    its accuracy is there, and it evaluated the same checkpoint content (``checkpoint.sha256``, the checksum
    manifest's digest of :func:`quantverdict.orchestrate.caches.write_checksums`; for the unquantized baseline
    the same materialized model and hub commit)."""
    if previous.stage("evaluate").status not in ("ok", "cached") or previous.accuracy.is_empty():
        return False
    was = previous.checkpoint
    if checkpoint.quantized or was.quantized or checkpoint.key:
        return bool(checkpoint.sha256) and was.sha256 == checkpoint.sha256
    before = previous.model
    return before.path == model.path and before.commit == model.commit
