"""The versioned per-job record: config, environment, the three numbers with units, status, error.

One JSON file per job (``<job output dir>/record.json``), rewritten atomically after every stage so
a crash loses no finished result. The review and the grid table read records, never MLflow internals.
Keys carry their units (``_bytes``, ``_gib``, ``_ms``, ``_s``, ``_rps``, ``_tok_s``).

One model of one layout: :class:`JobRecord`, one pydantic model per section. A running job fills in
:class:`Record`, whose sections are those models; every write (:meth:`Record.save`) and every read (:func:`load`,
:func:`read`) validates the whole record: a key a section does not name, or a value of the wrong type, is refused,
naming it. Records of older schema versions are read as the current one
(:mod:`quantverdict.results.migrate`). The layout's JSON schema: ``docs/schema/record.schema.json``
(``make schema``).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ConfigDict, Field, ValidationError, model_validator

from quantverdict import RECORD_SCHEMA_VERSION, __version__
from quantverdict.measure.points import Block as Block
from quantverdict.measure.points import CheckpointMemory as CheckpointMemory
from quantverdict.measure.points import GpuWindow as GpuWindow
from quantverdict.measure.points import HostLoad as HostLoad
from quantverdict.measure.points import HostWindow as HostWindow
from quantverdict.measure.points import JsonObject as JsonObject
from quantverdict.measure.points import LengthDist as LengthDist
from quantverdict.measure.points import LoadLevel as LoadLevel
from quantverdict.measure.points import ModelDims as ModelDims
from quantverdict.measure.points import SamplingParams as SamplingParams
from quantverdict.measure.points import Section as Section
from quantverdict.measure.points import ServerMemory as ServerMemory
from quantverdict.measure.points import Spread as Spread
from quantverdict.measure.points import SweepPoint as SweepPoint
from quantverdict.results import migrate

RECORD_FILE = "record.json"
# the key a reader adds to a record dict it loaded: the folder the record.json was read from (a review finds the
# job's eval/ samples and benchmark result files there)
SOURCE_DIR_KEY = "_review_dir"


class RecordInvalid(ValueError):
    """A record does not match its model (:class:`JobRecord`); the message names each key and what is wrong."""

    def __init__(self, exc: ValidationError):
        wrong = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
        more = f" (and {exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
        super().__init__(f"the record does not match its model: {wrong}{more}")


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


@dataclass
class StageInfo:
    status: str = "pending"  # pending | running | ok | failed | interrupted | skipped | cached
    wall_s: float | None = None
    detail: str = ""


def load(path: Path) -> dict[str, Any]:
    """Read a record (a ``record.json`` path or the job folder holding it) as a dict.

    Raises:
        ValueError: the file is not a quantverdict record of a schema version this code reads, or does not match
            the record's model (:class:`JobRecord`: a key its section does not name, a value of the wrong type).
    """
    if path.is_dir():
        path = path / RECORD_FILE
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a quantverdict record")
    data = migrate.upgrade(data, str(path))
    try:
        JobRecord.view(data)
    except ValidationError as exc:
        raise ValueError(f"{path}: {RecordInvalid(exc)}") from exc
    return data


# MLflow's artifact store (conf/tracking: <output_root>/mlartifacts) holds copies of logged records
_NOT_JOB_DIRS = {"mlartifacts", "mlruns"}


def find_records(root: Path) -> list[Path]:
    """All job ``record.json`` files under ``root`` (a run dir, a multirun dir or the output root),
    sorted; copies inside an MLflow artifact store are left out."""
    return sorted(p for p in root.rglob(RECORD_FILE) if not _NOT_JOB_DIRS & set(p.relative_to(root).parts))


def git_state(root: Path) -> dict[str, Any]:
    """``{"git_commit": sha or None, "git_dirty": bool or None}`` of the checkout at ``root``.

    ``git_dirty`` is true when tracked files differ from the commit (untracked files do not count). A tree that is
    not a git checkout (a copied release) reads ``QV_GIT_COMMIT`` for the commit it was copied from, dirty unknown.
    """
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
        if head.returncode == 0:
            status = subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
            return {"git_commit": head.stdout.strip(), "git_dirty": dirty}
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {"git_commit": os.environ.get("QV_GIT_COMMIT") or None, "git_dirty": None}


def host_environment(cpu_model: str = "") -> dict[str, Any]:
    """This machine for ``environment.host``: hostname, platform, Python version, logical CPUs and, when given
    (older records lack it), ``cpu_model``, the CPU's model name from ``/proc/cpuinfo``: a GPU server of a small
    model may be bound by its host, so two runs on one kind of GPU need their hosts named to be told apart."""
    host: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
    if cpu_model:
        host["cpu_model"] = cpu_model
    return host


def stopped_stage(rec: JobRecord | dict[str, Any]) -> str | None:
    """Where an unfinished record (typed, or as its dict) stopped: its ``failed_stage``, else the stage still marked
    running, else ``"after <last stage>"`` (cut between two stages); None for a record with no stages."""
    typed = rec if isinstance(rec, JobRecord) else JobRecord.view(rec)
    if typed.failed_stage:
        return typed.failed_stage
    running = [name for name, st in typed.stages.items() if st.status == "running"]
    if running:
        return running[0]
    return f"after {list(typed.stages)[-1]}" if typed.stages else None


def mark_interrupted(rec: dict[str, Any]) -> dict[str, Any]:
    """A record dict left ``running`` by a process stopped from outside (a GPU machine given back, a kill):
    status ``interrupted``, ``failed_stage`` where it stopped (:func:`stopped_stage`). Use only on
    records whose job is known to be over (a finished grid, copied results)."""
    if JobRecord.view(rec).status == "running":
        rec["status"] = "interrupted"
        rec["failed_stage"] = stopped_stage(JobRecord.view(rec))
    return rec


# ---------------------------------------------------------------------------------------------------------
# The typed model (JobRecord): one pydantic model per section. A key a section does not name is refused when a
# record is written (Record.save) and when one is read (load, after migrate.upgrade); blocks a section keeps as
# written (lm-eval's settings, a GPU's nvidia-smi fields, the resolved config) are typed as JSON objects. The base
# Section and the sweep's shapes (points, their GPU window, the per-load summary) are quantverdict.measure.points'.

_S = TypeVar("_S", bound=Section)


class KernelCheck(Block):
    """``speed.kernel_check`` (:func:`quantverdict.measure.kernels.kernel_check`): the kernel vLLM ran and whether
    the scheme's speed can be compared (False: it ran as ``effective_label``)."""

    kernel: str | None = None
    kernels: list[str] | None = None  # "Kernel (method)" of each kernel the log names
    comparable_for_speed: bool | None = None
    effective_label: str | None = None
    compute: str | None = None  # native | emulated (the server log's parse), None when it does not say
    compute_reason: str | None = None
    reason: str | None = None


class Kernel(Block):
    """``memory.server.kernels[i]`` (:func:`quantverdict.measure.vllm_log.parse`): a linear kernel vLLM picked and
    the quantization method it serves."""

    kernel: str | None = None
    method: str | None = None


class Roofline(Block):
    """``speed.roofline`` (:func:`quantverdict.serving.speed.add_roofline`): bytes read per decode step, the
    measured copy bandwidth (bytes/s), the ideal and measured time per token (ms), the bandwidth achieved
    (bytes/s) and the efficiency (ideal / measured)."""

    decode_bytes: float | None = None
    copy_bytes_per_s: float | None = None
    ideal_ms_per_token: float | None = None
    tpot_ms: float | None = None
    achieved_bytes_per_s: float | None = None
    efficiency: float | None = None


class TimeSplit(Block):
    """``speed.time_split`` (:func:`quantverdict.measure.sweep.time_split`): the benchmark stage's parts in s, and
    the client's overhead as a fraction of start + windows."""

    server_start_s: float | None = None
    compile_s: float | None = None
    graph_capture_s: float | None = None
    warmup_after_capture_s: float | None = None
    compile_cache_hit: bool | None = None
    windows_s: float | None = None
    overhead_s: float | None = None
    sweep_wall_s: float | None = None
    overhead_fraction: float | None = None


class SweepClient(Block):
    """``speed.sweep_client``: the sweep client's import, gate-wait and warm-up-wave times (s)."""

    started_with_server: bool | None = None
    import_s: float | None = None
    gate_wait_s: float | None = None
    calibration_s: float | None = None


class EvalServer(Block):
    """``accuracy.settings.server`` (``eval.backend=server``): the served model and the length lm-eval used."""

    served_model: str | None = None
    max_model_len: int | None = None
    lm_eval_max_length: Any = None


class EvalSettings(Block):
    """``accuracy.settings`` (``children/evaluate.py``): what the scores were computed with; the keys an accuracy
    delta needs equal (:data:`quantverdict.results.baseline.DELTA_SETTINGS`) are typed loosely (lm-eval takes
    ``batch_size`` as a number or ``auto``, ``limit`` as a count or a fraction)."""

    backend: str | None = None
    device: str | None = None
    batch_size: Any = None
    max_length: Any = None
    num_fewshot: Any = None
    limit: Any = None
    task_limits: Any = None
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    normalization: str | None = None  # how acc_norm was normalised, as the evaluate stage states it
    server: JsonObject | None = None

    @property
    def served(self) -> EvalServer:
        """``server`` read as :class:`EvalServer` (every key None without it)."""
        return EvalServer.of(self.server)


class BatchInvariance(Block):
    """``accuracy.checks.batch_invariance``: the largest change of a request's log-likelihood between batch sizes."""

    skipped: str | None = None
    ok: bool | None = None
    max_abs_diff: float | None = None
    batch_sizes: Any = None
    tolerance: float | None = None
    note: str | None = None
    dtype: str | None = None
    n_requests: int | None = None


class PerplexityFamily(Block):
    """``accuracy.checks.perplexity_family``: lm-eval's word/byte perplexity against the summed log-likelihood's."""

    ok: bool | None = None
    max_rel_diff: float | None = None


class AccuracyChecks(Block):
    """``accuracy.checks``: the evaluate stage's own checks (absent: not made)."""

    batch_invariance: BatchInvariance | None = None
    perplexity_family: PerplexityFamily | None = None


class ChosenDtype(Block):
    """``environment.dtypes.<stage>`` and ``speed.dtype``: the compute dtype a stage used (``dtype``; ``value`` in
    ``speed.dtype``), what chose it and why."""

    dtype: str | None = None
    value: str | None = None
    chosen_by: str | None = None
    why: str | None = None


class GpuInfo(Block):
    """``environment.gpu[i]``: one GPU's nvidia-smi fields (:func:`quantverdict.orchestrate.hardware.gpu_info`)."""

    index: int | None = None
    name: str | None = None
    driver_version: str | None = None
    compute_cap: str | None = None
    memory_total_mib: float | None = None
    uuid: str | None = None  # nvidia-smi's GPU-<uuid>: which physical GPU
    enforced_power_limit_w: float | None = None  # the power cap in force (W); older records lack it
    clocks_max_sm_mhz: float | None = None  # the top SM clock (MHz); older records lack it


class CpuInfo(Block):
    """``environment.cpu``: the probed CPU (:mod:`quantverdict.config.cpu_caps`): model name, ISA, and the vLLM
    CPU library it can load."""

    model_name: str | None = None
    isa: str | None = None
    vllm_extension: str | None = None
    wna16_dtypes: list[str] | None = None


class HostInfo(Block):
    """``environment.host`` (:func:`host_environment`): the host's CPU model name among its other facts."""

    cpu_model: str | None = None


class Tool(Section):
    """``tool``: the writer: ``name`` (always ``quantverdict``), its ``version``, the checkout's ``git_commit``
    and whether tracked files differed from it (``git_dirty``; None when unknown)."""

    name: str | None = None
    version: str | None = None
    git_commit: str | None = None
    git_dirty: bool | None = None


class JobInfo(Section):
    """``job``: which job this is, where it ran, and what it resumed from."""

    id: str | None = None
    model: str | None = None
    scheme: str | None = None  # the weight scheme, with "+kv-<kv>" when the KV cache is quantized
    scheme_label: str | None = None
    weight_scheme: str | None = None
    kv: str | None = None
    kv_cache_dtype: str | None = None
    config_hash: str | None = None
    output_dir: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    resumed_from: str | None = None
    resumed_attempt: JsonObject | None = None  # {"from", "status", "stages_reused"}
    resume_key: str | None = None
    resume_inputs: JsonObject | None = None  # {"config_hash", "pins_sha256", "calibration_sha256"}


class Environment(Section):
    """``environment``: host, device (``cpu``/``cuda``), GPUs and each stage environment's package versions."""

    host: JsonObject | None = None  # hostname, platform, python, cpu_count, cpu_model
    device: str | None = None
    env: JsonObject | None = None  # the env config chosen: name, picked_by, wheelhouse, system_site_packages
    gpu: list[JsonObject] | None = None  # nvidia-smi fields per GPU (orchestrate/hardware.py)
    cpu: JsonObject | None = None  # the probed CPU (quantverdict.config.cpu_caps)
    dtypes: JsonObject | None = None  # {"serve"|"evaluate": {"dtype", "chosen_by", "why"}}
    pins: JsonObject | None = None  # the stage environments' requirement pins
    quantize: dict[str, str | None] | None = None
    serve: dict[str, str | None] | None = None
    gpus_used: int | None = None  # cuda: GPUs the job's server shards over (bench.server.tensor_parallel_size)

    def dtype_of(self, stage: str) -> JsonObject | None:
        """``dtypes.<stage>`` (``{"dtype", "chosen_by", "why"}``), or None when the record names none."""
        value = self.dtypes[stage] if self.dtypes and stage in self.dtypes else None
        return value if isinstance(value, dict) else None


class Stage(Section):
    """``stages.<name>``: a stage's status, wall time (s) and detail (the reader's view of :class:`StageInfo`)."""

    status: str | None = None
    wall_s: float | None = None
    detail: str | None = None


class Memory(Section):
    """``memory``: the checkpoint's, the server's, and the predicted weight bytes checked against the measured."""

    checkpoint: CheckpointMemory = Field(default_factory=CheckpointMemory)
    server: ServerMemory = Field(default_factory=ServerMemory)
    prediction: JsonObject | None = None


class TaskResult(Section):
    """``accuracy.tasks.<task>``: one lm-eval task's metrics (``acc``, ``acc_norm``, ``word_perplexity``,
    ``exact_match`` ..., with ``<metric>_stderr``; any name a task reports, so this section takes keys it does not
    name), ``n`` items, beside ``headline_metric``, ``higher_is_better``, ``output_type`` and ``data_source`` (where
    the task's documents came from: offline files with their sha256, or the lm-eval task's dataset id and
    revision)."""

    model_config = ConfigDict(extra="allow")

    n: int | None = None
    limit: int | None = None

    def metric(self, name: str) -> Any:
        """The value lm-eval reported as ``name`` (None when absent)."""
        if name in ("n", "limit"):
            return getattr(self, name)
        return (self.model_extra or {}).get(name)


class TokenPerplexity(Section):
    """``accuracy.token_perplexity``: perplexity over fixed token windows of the WikiText-2 test text
    (:mod:`quantverdict.children.token_perplexity`). ``nll_sum`` in nats over ``n_tokens`` scored tokens in
    ``n_windows`` windows; ``window_nll`` (summed NLL in nats per window, window order) and ``window_n_tokens``
    (scored tokens per window) where the job recorded them."""

    token_perplexity: float | None = None
    nll_sum: float | None = None
    n_tokens: int | None = None
    n_text_tokens: int | None = None
    n_windows: int | None = None
    seq_len: int | None = None
    stride: int | None = None
    max_tokens: int | None = None
    text: str | None = None
    window_nll: list[float] | None = None
    window_n_tokens: list[int] | None = None
    eval_s: float | None = None
    cpu_s: float | None = None

    def windows(self) -> tuple[list[float], list[int]] | None:
        """``(window_nll, window_n_tokens)`` when both are lists of one length, else None (no per-window data)."""
        nll, tok = self.window_nll, self.window_n_tokens
        if nll is None or tok is None or len(nll) != len(tok) or not nll:
            return None
        return [float(x) for x in nll], [int(t) for t in tok]


class Accuracy(Section):
    """``accuracy``: task results, token perplexity, settings and checks, or why it was not applicable."""

    tasks: dict[str, TaskResult] = Field(default_factory=dict)
    token_perplexity: JsonObject | None = None
    settings: JsonObject | None = None
    checks: JsonObject | None = None
    data: JsonObject | None = None  # where each task's documents came from
    samples: dict[str, str] | None = None
    versions: dict[str, str | None] | None = None
    not_applicable: str | None = None
    # KL divergence to the baseline (children/kld_baseline.py): a scheme's summary, the baseline's stored entry,
    # or {"refused": reason}
    kld: JsonObject | None = None
    backend: str | None = None
    served_model: str | None = None
    load_s: float | None = None
    eval_s: float | None = None
    wall_s: float | None = None

    @property
    def token_perplexity_section(self) -> TokenPerplexity:
        """``token_perplexity`` typed (every field None when the record has none); the dict field stays as read."""
        return TokenPerplexity.model_validate(self.token_perplexity)


class GpuSampling(Section):
    """``speed.gpu_sampling``: how the GPU was sampled during the sweep (``source`` ``nvml`` or ``nvidia-smi``,
    ``interval_ms``, ``devices``, ``samples``, the samples' ``file``), or why it was not (``not_measured``)."""

    source: str | None = None
    interval_ms: int | None = None
    devices: list[str] | None = None
    samples: int | None = None
    file: str | None = None
    not_measured: str | None = None


class HostSampling(Section):
    """``speed.host_sampling``: how the host was sampled during the sweep (``source`` ``psutil``, ``interval_ms``,
    the host's logical ``cores``, ``samples``, the samples' ``file``, the ``metrics_path`` the scheduler's gauges
    were read from and the scrapes of it that failed), the sampler's own CPU time (``sampler_cpu_s``;
    ``sampler_cpu_pct``: percent of one core over the ``sampler_wall_s`` it ran), or why it was not sampled
    (``not_measured``)."""

    source: str | None = None
    interval_ms: int | None = None
    cores: int | None = None
    samples: int | None = None
    file: str | None = None
    metrics_path: str | None = None
    metrics_errors: int | None = None
    sampler_cpu_s: float | None = None
    sampler_wall_s: float | None = None
    sampler_cpu_pct: float | None = None
    not_measured: str | None = None


class ServerStartInfo(Section):
    """``speed.starts[i]``: one server start of the job and its whole sweep: ``index`` (1: the job's own),
    ``order`` (its place in ``speed.start_plan.sequence``), ``status`` (``ok`` | ``failed``), ``error``, wall times
    (s), the server's address, the points it added, where its files are and how its GPU was sampled."""

    index: int | None = None
    order: int | None = None
    status: str | None = None
    error: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    wall_s: float | None = None
    server_start_s: float | None = None
    sweep_wall_s: float | None = None
    points: int | None = None
    server: JsonObject | None = None
    output_dir: str | None = None
    gpu_sampling: GpuSampling | None = None  # this start's sampler: source, interval, file, or why not measured
    host_sampling: HostSampling | None = None  # this start's host sampler: interval, file, its own cost, or why not


class SearchStep(Section):
    """``speed.searches[i].steps[j]``: one load the capacity search measured: ``step`` (1, 2, ...), ``load``
    (concurrency or req/s), its ``points`` (names, one per repeat), the requests that met the SLO (``good``) of
    those ``sent``, pooled over the repeats, their ``attainment_pct`` (100 good / sent) and whether it ``passed``."""

    step: int | None = None
    load: float | None = None
    points: list[str] | None = None
    good: int | None = None
    sent: int | None = None
    attainment_pct: float | None = None
    passed: bool | None = None


class SearchSlo(Section):
    """``speed.searches[i].slo``: the per-request objectives a capacity search judged by (ms; null: not an
    objective)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None


class CapacitySearch(Section):
    """``speed.searches[i]``: one server start's capacity search (``bench.capacity``,
    :mod:`quantverdict.measure.slo_capacity`): the ``slo`` (``ttft_ms``, ``tpot_ms``, ``e2e_ms``; null: not an
    objective), ``attainment_pct``, the settings, its ``steps`` in run order, the ``capacity`` (null: the lowest
    load failed), the ``bracket`` ``[capacity, lowest failing load above it]`` (null ends: none) and why it
    stopped (``stop_reason``: ``tolerance`` | ``max_load_passed`` | ``start_failed``; null: cut short)."""

    server_start: int | None = None
    mode: str | None = None
    slo: SearchSlo | None = None
    attainment_pct: float | None = None
    start: float | None = None
    max_load: float | None = None
    tolerance_pct: float | None = None
    repeats: int | None = None
    steps: list[SearchStep] | None = None
    capacity: float | None = None
    bracket: list[float | None] | None = None
    stop_reason: str | None = None
    stop_words: str | None = None


class LevelEnding(Section):
    """``speed.start_plan.levels[i]``: what ended the starts of this scheme against the baseline at one load level
    (:func:`quantverdict.measure.starts.settle`): ``ended_by`` ``settled_above`` | ``settled_below`` |
    ``settled_inside`` | ``max_reached``, after ``starts`` starts, on the interval ``[low, high]`` of ``ratio`` at
    ``confidence``."""

    load: float | None = None
    ended_by: str | None = None
    starts: int | None = None
    ratio: float | None = None
    low: float | None = None
    high: float | None = None
    confidence: float | None = None


class StartPlan(Section):
    """``speed.start_plan``: the server starts that ran and in what order. ``how``: ``grid`` (the schemes' starts
    interleaved round by round), ``single_job`` (back to back), or ``one_start`` (a record written before
    ``bench.server_starts`` existed, read as one start); ``order`` ``interleaved`` | ``random`` (``seed``);
    ``sequence``: every start of the grid in time order as ``<job id>#<start>``; the stopping rule's ``metric``,
    ``confidence``, ``look_confidence``, baseline job and per-level endings; ``gpu_time_saved_s`` against
    ``max_server_starts`` starts."""

    how: str | None = None
    server_starts: int | None = None
    max_server_starts: int | None = None
    order: str | None = None
    seed: int | None = None
    sequence: list[str] | None = None
    metric: str | None = None
    confidence: float | None = None
    look_confidence: float | None = None
    baseline_job: str | None = None
    levels: list[LevelEnding] | None = None
    gpu_time_saved_s: float | None = None
    note: str | None = None


class Workload(Section):
    """``speed.workload``: the traffic sent (``bench.dataset``; :func:`quantverdict.serving.workload.prepare`).

    ``kind`` (random, jsonl, text, shared_prefix); ``source`` (the user's file, the offline WikiText file or the
    hub dataset), ``file`` (the prompts file the client read), its ``sha256`` and ``prompts`` (lines);
    ``output_tokens_from_file`` (each line's ``output_tokens``, else ``output_len``); ``input_len`` (random,
    shared_prefix: tokens per prompt); text: ``min_words``/``max_words``; shared_prefix: ``prefix_len``,
    ``num_prefixes``. A record without it sent vLLM's random prompts (``bench.input_len``/``output_len``).
    """

    kind: str | None = None
    source: str | None = None
    file: str | None = None
    sha256: str | None = None
    prompts: int | None = None
    output_tokens_from_file: bool | None = None
    input_len: int | None = None
    output_len: int | None = None
    min_words: int | None = None
    max_words: int | None = None
    prefix_len: int | None = None
    num_prefixes: int | None = None


class Speed(Section):
    """``speed``: the serving sweep's points, their per-load summary, the kernel check and the roofline."""

    mode: str | None = None
    served_model: str | None = None
    unsupported: str | None = None  # why this scheme was not served here
    # the server's address: host, port (the one it listened on), requested_port, strict_port, start_attempts
    # (quantverdict.serving.server.VLLMServer.endpoint)
    server: JsonObject | None = None
    workload: Workload | None = None  # the traffic sent (absent: vLLM's random prompts)
    points: list[SweepPoint] = Field(default_factory=list)
    summary: list[LoadLevel] = Field(default_factory=list)
    kernel_check: JsonObject | None = None
    roofline: JsonObject | None = None
    sustained_ceiling: JsonObject | None = None
    hbm_copy: JsonObject | None = None
    server_start_s: float | None = None
    sweep_wall_s: float | None = None
    sweep_client: JsonObject | None = None  # the client process's import, calibration and gate times (s)
    dtype: JsonObject | None = None  # {"value", "chosen_by", "why"}: the compute dtype the pipeline chose
    time_split: JsonObject | None = None  # start, compile, graph capture, windows, client overhead (s)
    gpu_sampling: GpuSampling | None = None
    host_sampling: HostSampling | None = None
    starts: list[ServerStartInfo] | None = None  # absent: one start (records written before starts were counted)
    start_plan: StartPlan | None = None
    searches: list[CapacitySearch] | None = None  # bench.capacity: each server start's search; absent: none ran


class ModelInfo(Section):
    """``model``: the model's path, architecture, dimensions (``dims``), source and, for a hub model, the
    commit its revision resolved to."""

    path: str | None = None
    architecture: str | None = None
    model_type: str | None = None
    dims: JsonObject | None = None
    num_parameters: int | None = None
    dtype: str | None = None
    source: str | None = None
    load_format: str | None = None
    hf_id: str | None = None
    revision: str | None = None
    commit: str | None = None
    baseline_note: str | None = None
    model: JsonObject | None = None  # the model config the job materialized (config.model)


class Checkpoint(Section):
    """``checkpoint``: the checkpoint a job served (path, cache key, whether cached and quantized) and what the
    quantize stage reported of it (:class:`quantverdict.results.stage_results.QuantizeResult`)."""

    path: str | None = None
    proxy_path: str | None = None
    key: str | None = None
    cached: bool | None = None
    quantized: bool | None = None
    sha256: str | None = None
    load_format: str | None = None
    quantization_config: JsonObject | None = None
    versions: dict[str, str | None] | None = None
    quantized_modules: int | None = None
    scheme_modules_in_memory: int | None = None
    calibration: JsonObject | None = None
    logits_finite: bool | None = None
    prompt_nll: dict[str, float] | None = None
    sanity: JsonObject | None = None
    set_aside: list[JsonObject] | None = None
    compute_dtype: str | None = None
    smoothing: JsonObject | None = None
    saved_dtype: str | None = None
    kept_16bit: JsonObject | None = None
    memory: JsonObject | None = None
    quantize_s: float | None = None
    save_s: float | None = None
    verify_s: float | None = None
    wall_s: float | None = None


class SnapshotBlock(Block):
    """A section of ``config``, the job's resolved config as the record keeps it (a snapshot of
    :class:`quantverdict.config.schema.Config`), read-only, through the keys the readers use; a key an older
    config lacks reads None, a key it holds that this view does not name passes unread. Null reads as empty."""

    model_config = ConfigDict(extra="allow", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_empty(cls, data: Any) -> Any:
        return {} if data is None else data


class ServerSnapshot(SnapshotBlock):
    """``config.bench.server``: the vLLM server's settings (:class:`quantverdict.config.schema.ServerConfig`)."""

    dtype: str | None = None  # --dtype: auto | bfloat16 | float16 | float32
    kv_cache_dtype: str | None = None  # auto | fp8 ...
    tensor_parallel_size: int | None = None
    gpu_memory_utilization: float | None = None  # share of GPU memory vLLM may use, 0..1
    max_model_len: int | None = None  # tokens; None: config.model.max_model_len
    max_num_seqs: int | None = None
    extra_args: list[str | int | float] | None = None  # more `vllm serve` arguments, as written


class BenchSnapshot(SnapshotBlock):
    """``config.bench``: the speed sweep's settings (:class:`quantverdict.config.schema.BenchConfig`)."""

    name: str | None = None
    enabled: bool | None = None
    mode: str | None = None  # rate | concurrency
    rates: list[int | float] | None = None  # offered req/s as written (inf: unlimited)
    concurrencies: list[int] | None = None  # requests in flight
    repeats: int | None = None
    input_len: int | None = None  # prompt tokens per request
    output_len: int | None = None  # generated tokens per request
    server: ServerSnapshot = Field(default_factory=ServerSnapshot)


class ModelSnapshot(SnapshotBlock):
    """``config.model`` (:class:`quantverdict.config.schema.ModelConfig`)."""

    name: str | None = None
    source: str | None = None  # hf | local | gguf | pypi_gguf | synthetic
    dtype: str | None = None
    max_model_len: int | None = None  # tokens
    baseline_note: str | None = None
    serve_args: list[str | int | float] | None = None  # `vllm serve` arguments the model needs, as written


class SchemeSnapshot(SnapshotBlock):
    """``config.scheme`` (:class:`quantverdict.config.schema.SchemeConfig`)."""

    name: str | None = None
    weight_bits: int | None = None
    activation_bits: int | None = None


class EvalSnapshot(SnapshotBlock):
    """``config.eval`` (:class:`quantverdict.config.schema.EvalConfig`); ``headline``: task -> metric."""

    name: str | None = None
    enabled: bool | None = None
    backend: str | None = None  # hf | vllm
    headline: dict[str, str] | None = None


class KvSnapshot(SnapshotBlock):
    """``config.kv`` (:class:`quantverdict.config.schema.KvConfig`)."""

    name: str | None = None  # auto | fp8 | fp8-calibrated ...


class EnvSnapshot(SnapshotBlock):
    """``config.env`` (:class:`quantverdict.config.schema.EnvConfig`)."""

    device: str | None = None  # cpu | cuda


class ConfigSnapshot(SnapshotBlock):
    """``config``: the job's resolved config, typed where the readers read it (:attr:`JobRecord.cfg`)."""

    baseline_scheme: str | None = None
    model: ModelSnapshot = Field(default_factory=ModelSnapshot)
    scheme: SchemeSnapshot = Field(default_factory=SchemeSnapshot)
    eval: EvalSnapshot = Field(default_factory=EvalSnapshot)
    bench: BenchSnapshot = Field(default_factory=BenchSnapshot)
    kv: KvSnapshot = Field(default_factory=KvSnapshot)
    env: EnvSnapshot = Field(default_factory=EnvSnapshot)


class JobRecord(Section):
    """One job's record, typed (the current schema version; older ones migrated on read). ``config`` is the job's
    resolved config (a JSON object; :func:`quantverdict.config.compose.job_config` types it); ``status`` is
    ``running`` | ``ok`` | ``failed`` | ``interrupted`` with ``failed_stage``, ``error``, ``traceback``."""

    schema_version: int | None = None
    migrated_from: int | None = None  # the version an older record was written in (results/migrate.py)
    tool: Tool = Field(default_factory=Tool)
    job: JobInfo = Field(default_factory=JobInfo)
    config: JsonObject = Field(default_factory=dict)
    environment: Environment = Field(default_factory=Environment)
    status: str | None = None
    failed_stage: str | None = None
    error: str | None = None
    traceback: str | None = None
    stages: dict[str, Stage] = Field(default_factory=dict)
    model: ModelInfo = Field(default_factory=ModelInfo)
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    memory: Memory = Field(default_factory=Memory)
    accuracy: Accuracy = Field(default_factory=Accuracy)
    speed: Speed = Field(default_factory=Speed)
    notes: list[str] | None = None
    # where a review read the record from (quantverdict.review.sources; not part of the written record)
    source_dir: str | None = Field(default=None, alias="_review_dir")  # SOURCE_DIR_KEY

    @classmethod
    def from_dict(cls, data: JsonObject | None) -> JobRecord:
        """The typed record of a record dict of any readable version (:func:`quantverdict.results.migrate.upgrade`).

        Raises:
            ValueError: ``data`` is not a quantverdict record of a version this code reads, or holds a key its
                section does not name (:class:`pydantic.ValidationError`, a ValueError).
        """
        return cls.view(migrate.upgrade(data if isinstance(data, dict) else {}))

    @classmethod
    def view(cls, data: JsonObject, only: tuple[str, ...] | None = None) -> JobRecord:
        """The typed view of a record dict, version and tool unchecked (a partial or hand-built record: every
        section it lacks is empty).

        Args:
            data: the record as its JSON holds it.
            only: the top-level keys to read (the others read as empty), e.g. :data:`HEAD_SECTIONS` where the
                sweep's points are not needed; None reads all.

        Raises:
            pydantic.ValidationError: a key a section does not name, or a value of the wrong type.
        """
        if only is not None:
            data = {k: v for k, v in data.items() if k in only}
        return cls.model_validate(data)

    def stage(self, name: str) -> Stage:
        """``stages.<name>`` (an empty :class:`Stage`, status None, when the record has no such stage)."""
        return self.stages[name] if name in self.stages else Stage()

    @property
    def cfg(self) -> ConfigSnapshot:
        """``config`` typed, read-only (:class:`ConfigSnapshot`; the record keeps the JSON object as written).

        Raises:
            pydantic.ValidationError: a key the view names holds a value of the wrong type.
        """
        return ConfigSnapshot.model_validate(self.config)

    def headline(self) -> dict[str, str]:
        """``config.eval.headline``: the metric the config picked per task (``{}`` where it picks none)."""
        return dict(self.cfg.eval.headline or {})

    @property
    def server(self) -> ServerMemory:
        """``memory.server`` (empty when the job never started a server)."""
        return self.memory.server

    @property
    def checkpoint_memory(self) -> CheckpointMemory:
        """``memory.checkpoint`` (empty when not measured)."""
        return self.memory.checkpoint


def _plain(value: Any) -> Any:
    """A record value as its JSON holds it: a section model dumped (:meth:`Section.to_dict`), a stage's
    :class:`StageInfo` as its fields, containers walked; a plain value as it is (a dict set in place of a section is
    kept, for :meth:`Record.save` to refuse by name)."""
    if isinstance(value, Section):
        return value.to_dict()
    if isinstance(value, StageInfo):
        return asdict(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _section(kind: type[_S], value: Any) -> Any:
    """``value`` as a ``kind`` section: a dict given to :class:`Record` is validated into one."""
    return kind.model_validate(value) if isinstance(value, dict) else value


@dataclass
class Record:
    """The record a running job writes: its sections are the typed models of :class:`JobRecord`, filled in by the
    stages (a dict given for a section when the record is made is validated into its model), saved after every
    stage. The JSON keys are in the order the first layout had them."""

    job: JobInfo
    config: dict[str, Any]
    schema_version: int = RECORD_SCHEMA_VERSION
    # name, version, and the checkout's git commit and whether its tracked files differed from it (git_state)
    tool: Tool = field(default_factory=lambda: Tool(name="quantverdict", version=__version__))
    environment: Environment = field(default_factory=Environment)
    status: str = "running"  # running | ok | failed | interrupted (stopped from outside: Ctrl-C, SIGTERM)
    failed_stage: str | None = None
    error: str | None = None
    traceback: str | None = None
    stages: dict[str, StageInfo] = field(default_factory=dict)
    model: ModelInfo = field(default_factory=ModelInfo)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    memory: Memory = field(default_factory=Memory)
    accuracy: Accuracy = field(default_factory=Accuracy)
    speed: Speed = field(default_factory=Speed)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.job = _section(JobInfo, self.job)
        self.tool = _section(Tool, self.tool)
        self.environment = _section(Environment, self.environment)
        self.model = _section(ModelInfo, self.model)
        self.checkpoint = _section(Checkpoint, self.checkpoint)
        self.memory = _section(Memory, self.memory)
        self.accuracy = _section(Accuracy, self.accuracy)
        self.speed = _section(Speed, self.speed)
        self.stages = {k: StageInfo(**v) if isinstance(v, dict) else v for k, v in self.stages.items()}

    def to_dict(self) -> dict[str, Any]:
        """The record as its JSON holds it (each section with the keys it was given)."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}

    def typed(self) -> JobRecord:
        """The record as its reader sees it (:class:`JobRecord`, validated).

        Raises:
            RecordInvalid: a key a section does not name or a value of the wrong type.
        """
        try:
            return JobRecord.view(json.loads(json.dumps(self.to_dict(), default=str, allow_nan=True)))
        except ValidationError as exc:
            raise RecordInvalid(exc) from exc

    def save(self, out_dir: Path, validate: bool = True) -> Path:
        """Write ``out_dir/record.json`` atomically (temp file + rename), validated against :class:`JobRecord`.

        Args:
            out_dir: the job's folder.
            validate: False only where a failure is being recorded: the record is written as it is, so that the
                failure is on disk even when the record's data is what failed.

        Raises:
            RecordInvalid: a key a section does not name or a value of the wrong type (nothing is written; the
                record saved before stays).
        """
        data = json.loads(json.dumps(self.to_dict(), default=str, allow_nan=True))  # as a reader will see it
        if validate:
            try:
                JobRecord.view(data)
            except ValidationError as exc:
                raise RecordInvalid(exc) from exc
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / RECORD_FILE
        tmp = path.with_name(f".{RECORD_FILE}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=2, allow_nan=True))
        tmp.replace(path)
        return path


# what a job is, how it ended and its accuracy: the sections a reader that needs no sweep points types
HEAD_SECTIONS = ("schema_version", "tool", "job", "config", "status", "failed_stage", "error", "stages", "accuracy")


def read(path: Path) -> JobRecord:
    """The typed record of ``path`` (a ``record.json`` or the job folder holding it), any readable version.

    Raises:
        ValueError: the file is not a quantverdict record of a version this code reads, or does not match the
            record's model.
    """
    return JobRecord.from_dict(load(path))


RECORD_SCHEMA_PATH = Path(__file__).resolve().parents[3] / "docs" / "schema" / "record.schema.json"


def record_schema_text() -> str:
    """The JSON schema (draft 2020-12) of ``record.json`` as :class:`JobRecord` validates it, as the committed
    ``docs/schema/record.schema.json`` holds it (2-space indent, trailing newline)."""
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **JobRecord.model_json_schema()}
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def write_record_schema(path: Path = RECORD_SCHEMA_PATH) -> Path:
    """Write :func:`record_schema_text` to ``path`` (default: ``docs/schema/record.schema.json`` of this checkout)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(record_schema_text())
    return path
