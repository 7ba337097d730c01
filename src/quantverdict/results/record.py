"""The versioned per-job record: config, environment, the three numbers with units, status, error.

One JSON file per job (``<job output dir>/record.json``), rewritten atomically after every stage so
a crash loses no finished result. The review and the grid table read records, never MLflow internals.
Keys carry their units (``_bytes``, ``_gib``, ``_ms``, ``_s``, ``_rps``, ``_tok_s``).

Two views of one layout: :class:`Record` is what a running job writes (sections are plain dicts that the
stages fill in); :class:`JobRecord` is the typed model a reader gets from :func:`read` / :meth:`JobRecord.from_dict`
(section dataclasses: :class:`JobInfo`, :class:`Environment`, :class:`StageInfo`, :class:`CheckpointMemory`,
:class:`ServerMemory`, :class:`Accuracy` with :class:`TaskResult`, :class:`Speed` with :class:`SweepPoint` and
:class:`LoadLevel`). Schema versions: 1 and 2 have the same layout (2 marks records written by the typed
code); :meth:`JobRecord.to_dict` gives back the dict it was read from, key for key, keys the model does not
name included (each section keeps them in ``extra``).
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
from typing import Any, ClassVar, TypeVar

from quantverdict import RECORD_SCHEMA_VERSION, __version__

RECORD_FILE = "record.json"
READABLE_VERSIONS = (1, 2)  # the same layout; 2 is written since the typed record (JobRecord)


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


@dataclass
class StageInfo:
    status: str = "pending"  # pending | running | ok | failed | interrupted | skipped | cached
    wall_s: float | None = None
    detail: str = ""


@dataclass
class Record:
    job: dict[str, Any]
    config: dict[str, Any]
    schema_version: int = RECORD_SCHEMA_VERSION
    # name, version, and the checkout's git commit and whether its tracked files differed from it (git_state)
    tool: dict[str, Any] = field(default_factory=lambda: {"name": "quantverdict", "version": __version__})
    environment: dict[str, Any] = field(default_factory=dict)
    status: str = "running"  # running | ok | failed | interrupted (stopped from outside: Ctrl-C, SIGTERM)
    failed_stage: str | None = None
    error: str | None = None
    traceback: str | None = None
    stages: dict[str, StageInfo] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    checkpoint: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    accuracy: dict[str, Any] = field(default_factory=dict)
    speed: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, out_dir: Path) -> Path:
        """Write ``out_dir/record.json`` atomically (temp file + rename)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / RECORD_FILE
        tmp = path.with_name(f".{RECORD_FILE}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, default=str, allow_nan=True))
        tmp.replace(path)
        return path


def load(path: Path) -> dict[str, Any]:
    """Read a record (a ``record.json`` path or the job folder holding it) as a dict.

    Raises:
        ValueError: the file is not a quantverdict record of a schema version this code reads.
    """
    if path.is_dir():
        path = path / RECORD_FILE
    data: dict[str, Any] = json.loads(path.read_text())
    if data.get("tool", {}).get("name") != "quantverdict" or "schema_version" not in data:
        raise ValueError(f"{path} is not a quantverdict record")
    if data["schema_version"] > RECORD_SCHEMA_VERSION:
        raise ValueError(
            f"{path} has schema_version {data['schema_version']}; this code reads <= {RECORD_SCHEMA_VERSION}"
        )
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
    (since 2026-12-03), ``cpu_model``, the CPU's model name from ``/proc/cpuinfo``: a GPU server of a small model
    may be bound by its host, so two runs on one kind of GPU need their hosts named to be told apart."""
    host: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
    if cpu_model:
        host["cpu_model"] = cpu_model
    return host


def stopped_stage(rec: dict[str, Any]) -> str | None:
    """Where an unfinished record stopped: its ``failed_stage``, else the stage still marked running, else
    ``"after <last stage>"`` (cut between two stages); None for a record with no stages."""
    if rec.get("failed_stage"):
        return str(rec["failed_stage"])
    stages = rec.get("stages") or {}
    running = [k for k, v in stages.items() if isinstance(v, dict) and v.get("status") == "running"]
    if running:
        return running[0]
    return f"after {list(stages)[-1]}" if stages else None


def mark_interrupted(rec: dict[str, Any]) -> dict[str, Any]:
    """A record left ``running`` by a process stopped from outside (a GPU machine given back, a kill):
    status ``interrupted``, ``failed_stage`` where it stopped (:func:`stopped_stage`). Use only on
    records whose job is known to be over (a finished grid, copied results)."""
    if rec.get("status") == "running":
        rec["status"] = "interrupted"
        rec["failed_stage"] = stopped_stage(rec)
    return rec


# ---------------------------------------------------------------------------------------------------------
# The typed model a reader gets (JobRecord): one dataclass per section, read from a version 1 or 2 dict.

_S = TypeVar("_S", bound="Section")


@dataclass
class Section:
    """A record section: the keys a reader names as typed fields, every other key in ``extra``.

    :meth:`from_dict` keeps the section's key order and which named keys were absent, so :meth:`to_dict`
    gives back a dict equal to (and ordered like) the one read. Subclasses name nested sections in
    ``NESTED`` (field -> section class) and lists of sections in ``NESTED_LISTS``.
    """

    extra: dict[str, Any] = field(default_factory=dict, repr=False)
    _keys: list[str] | None = field(default=None, repr=False, compare=False)  # None: not read from a dict

    NESTED: ClassVar[dict[str, type[Section]]] = {}
    NESTED_LISTS: ClassVar[dict[str, type[Section]]] = {}

    @classmethod
    def _named(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name not in ("extra", "_keys")]

    @classmethod
    def from_dict(cls: type[_S], data: dict[str, Any] | None) -> _S:
        """The section read from its dict (None or a missing section: every field at its default)."""
        data = data if isinstance(data, dict) else {}
        named = set(cls._named())
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in named:
                continue
            if key in cls.NESTED:
                if not isinstance(value, dict):  # null or malformed: kept as read, the field stays empty
                    continue
                value = cls.NESTED[key].from_dict(value)
            elif key in cls.NESTED_LISTS:
                if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
                    continue
                value = [cls.NESTED_LISTS[key].from_dict(v) for v in value]
            kwargs[key] = value
        section = cls(**kwargs)
        section.extra = {k: v for k, v in data.items() if k not in named or k not in kwargs}
        section._keys = list(data)
        return section

    def to_dict(self) -> dict[str, Any]:
        """The section as the record's JSON holds it: the keys read, in their order (every field for a section
        built, not read)."""
        named = self._named()
        keys = named if self._keys is None else self._keys
        out: dict[str, Any] = {}
        for key in keys:
            if key in self.extra:
                out[key] = self.extra[key]
            elif key in named:
                out[key] = _plain(getattr(self, key))
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out

    def is_empty(self) -> bool:
        """True for a section the record lacked, held as null, or held as ``{}``."""
        return not self._keys

    def has(self, key: str) -> bool:
        """Whether the record held ``key`` in this section (a field at its default was absent)."""
        return self._keys is not None and key in self._keys


def _plain(value: Any) -> Any:
    if isinstance(value, Section):
        return value.to_dict()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _section_map(section: Section, name: str, kind: type[_S]) -> dict[str, _S]:
    """``section.<name>``, a dict of dicts, as a dict of ``kind`` sections; anything else is kept as read (in
    ``extra``) and the field is an empty dict."""
    value = getattr(section, name)
    if isinstance(value, dict) and all(isinstance(v, dict) for v in value.values()):
        return {k: kind.from_dict(v) for k, v in value.items()}
    if section.has(name):
        section.extra[name] = value
    return {}


@dataclass
class JobInfo(Section):
    """``job``: which job this is and where it ran."""

    id: str | None = None
    model: str | None = None
    scheme: str | None = None
    scheme_label: str | None = None
    config_hash: str | None = None
    output_dir: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    resumed_from: str | None = None


@dataclass
class Environment(Section):
    """``environment``: host, device (``cpu``/``cuda``), GPUs and each stage environment's package versions."""

    host: dict[str, Any] | None = None
    device: str | None = None
    gpu: list[dict[str, Any]] | None = None
    cpu: dict[str, Any] | None = None  # the probed CPU (quantverdict.config.cpu_caps)
    quantize: dict[str, Any] | None = None
    serve: dict[str, Any] | None = None
    gpus_used: int | None = None  # cuda: GPUs the job's server shards over (bench.server.tensor_parallel_size)


@dataclass
class Stage(Section):
    """``stages.<name>``: a stage's status, wall time (s) and detail (the reader's view of :class:`StageInfo`)."""

    status: str | None = None
    wall_s: float | None = None
    detail: str | None = None


@dataclass
class CheckpointMemory(Section):
    """``memory.checkpoint``: the checkpoint's bytes on disk (safetensors headers), by dtype and role."""

    total_weight_bytes: int | None = None
    weights_gib: float | None = None
    bytes_by_dtype: dict[str, int] | None = None
    bytes_by_role: dict[str, int] | None = None
    num_tensors: int | None = None
    quantized_modules: int | None = None
    effective_bits_per_weight: float | None = None


@dataclass
class ServerMemory(Section):
    """``memory.server``: what vLLM's server log said (GiB, tokens, kernels; :mod:`quantverdict.measure.vllm_log`)."""

    vllm_version: str | None = None
    device: str | None = None
    quantization: str | None = None
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    weights_gib: float | None = None
    checkpoint_gib: float | None = None
    kv_cache_gib: float | None = None
    kv_cache_source: str | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_request_tokens: int | None = None
    kernels: list[Any] | None = None
    activation_quantized: bool | None = None
    fallback: str | bool | None = None
    fallback_lines: list[str] | None = None
    unquantized_gemm_fallback: bool | None = None


@dataclass
class Memory(Section):
    """``memory``: the checkpoint's and the server's."""

    checkpoint: CheckpointMemory = field(default_factory=CheckpointMemory)
    server: ServerMemory = field(default_factory=ServerMemory)

    NESTED: ClassVar[dict[str, type[Section]]] = {"checkpoint": CheckpointMemory, "server": ServerMemory}


@dataclass
class TaskResult(Section):
    """``accuracy.tasks.<task>``: one lm-eval task's metrics (``acc``, ``acc_norm``, ``word_perplexity``,
    ``exact_match`` ..., with ``<metric>_stderr``), ``n`` items; every metric lives in ``extra`` under its lm-eval
    name, beside ``headline_metric``, ``higher_is_better``, ``output_type`` and ``data_source`` (where the task's
    documents came from: offline files with their sha256, or the lm-eval task's dataset id and revision)."""

    n: int | None = None
    limit: int | None = None

    def metric(self, name: str) -> Any:
        """The value lm-eval reported as ``name`` (None when absent)."""
        return getattr(self, name) if name in ("n", "limit") else self.extra.get(name)


@dataclass
class TokenPerplexity(Section):
    """``accuracy.token_perplexity``: perplexity over fixed token windows of the WikiText-2 test text
    (:mod:`quantverdict.children.token_perplexity`). ``nll_sum`` in nats over ``n_tokens`` scored tokens in
    ``n_windows`` windows; ``window_nll`` (summed NLL in nats per window, window order) and ``window_n_tokens``
    (scored tokens per window) when the job recorded them (issue #17), else None (older records)."""

    token_perplexity: float | None = None
    nll_sum: float | None = None
    n_tokens: int | None = None
    n_windows: int | None = None
    seq_len: int | None = None
    stride: int | None = None
    max_tokens: int | None = None
    window_nll: list[float] | None = None
    window_n_tokens: list[int] | None = None

    def windows(self) -> tuple[list[float], list[int]] | None:
        """``(window_nll, window_n_tokens)`` when both are lists of one length, else None (no per-window data)."""
        nll, tok = self.window_nll, self.window_n_tokens
        if not isinstance(nll, list) or not isinstance(tok, list) or len(nll) != len(tok) or not nll:
            return None
        return [float(x) for x in nll], [int(t) for t in tok]


@dataclass
class Accuracy(Section):
    """``accuracy``: task results, token perplexity, settings and checks, or why it was not applicable."""

    tasks: dict[str, TaskResult] = field(default_factory=dict)
    token_perplexity: dict[str, Any] | None = None
    settings: dict[str, Any] | None = None
    checks: dict[str, Any] | None = None
    samples: dict[str, str] | None = None
    not_applicable: str | None = None
    # KL divergence to the baseline (children/kld_baseline.py): a scheme's summary, the baseline's stored entry,
    # or {"refused": reason}
    kld: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Accuracy:
        acc = super().from_dict(data)
        acc.tasks = _section_map(acc, "tasks", TaskResult)
        return acc

    @property
    def token_perplexity_section(self) -> TokenPerplexity:
        """``token_perplexity`` typed (every field None when the record has none); the dict field stays as read."""
        tp = self.token_perplexity
        return TokenPerplexity.from_dict(tp if isinstance(tp, dict) else None)


@dataclass
class SweepPoint(Section):
    """``speed.points[i]``: one benchmark run at one load (times in ms, rates in req/s and tok/s)."""

    point: str | None = None
    offered_rate_rps: float | str | None = None  # "inf" for a closed-loop (concurrency) run
    concurrency: int | None = None
    repeat: int | None = None
    completed: int | None = None
    failed: int | None = None
    achieved_rps: float | None = None
    output_tok_s: float | None = None
    output_tokens_total: int | None = None
    output_tokens_requested: int | None = None
    ttft_ms_p50: float | None = None
    ttft_ms_p99: float | None = None
    itl_ms_p50: float | None = None
    itl_ms_p99: float | None = None
    tpot_ms_p50: float | None = None
    e2e_ms_p99: float | None = None
    # decided once when the point was read (quantverdict.measure.validity.saturation): completion pace over arrival
    # pace < 0.9; basis "arrival_pace", "estimated_pace", "too_few_requests", "burst" or "closed_loop". A point
    # with another basis was recorded before that rule: read it through validity.point_saturation
    saturated: bool | None = None
    saturation_ratio: float | None = None
    saturation_basis: str | None = None
    valid: bool | None = None
    invalid_reasons: list[str] | None = None
    # issue 16 (absent in older records): the point's seed, the server's /metrics counters around it, the
    # client's overhead (wall - measured window)
    seed: int | None = None
    prefix_cache_hit_rate: float | None = None
    # hits beyond the point's own repeated prompts / tokens looked up (the judged rate; measure/prompt_repeats.py)
    prefix_cache_excess_hit_rate: float | None = None
    prompt_repeat_rate: float | None = None
    server_prompt_tokens: int | None = None
    server_generation_tokens: int | None = None
    client_overhead_s: float | None = None


@dataclass
class LoadLevel(Section):
    """``speed.summary[i]``: the repeats of one load aggregated (``metrics``: key -> {median, min, max})."""

    offered_rate_rps: float | str | None = None
    concurrency: int | None = None
    repeats: int | None = None
    valid_repeats: int | None = None
    invalid_points: list[str] | None = None
    saturated_repeats: int | None = None
    saturated: bool | None = None
    metrics: dict[str, dict[str, float] | None] | None = None


@dataclass
class Speed(Section):
    """``speed``: the serving sweep's points, their per-load summary, the kernel check and the roofline."""

    mode: str | None = None
    served_model: str | None = None
    # the server's address: host, port (the one it listened on), requested_port, strict_port, start_attempts
    # (absent in older records; quantverdict.serving.server.VLLMServer.endpoint)
    server: dict[str, Any] | None = None
    points: list[SweepPoint] = field(default_factory=list)
    summary: list[LoadLevel] = field(default_factory=list)
    kernel_check: dict[str, Any] | None = None
    roofline: dict[str, Any] | None = None
    sustained_ceiling: dict[str, Any] | None = None
    hbm_copy: dict[str, Any] | None = None
    server_start_s: float | None = None
    dtype: dict[str, Any] | None = None  # {"value", "chosen_by", "why"}: the compute dtype the pipeline chose
    # issue 16 (absent in older records): start, compile, graph capture, windows, client overhead (seconds)
    time_split: dict[str, Any] | None = None

    NESTED_LISTS: ClassVar[dict[str, type[Section]]] = {"points": SweepPoint, "summary": LoadLevel}


@dataclass
class ModelInfo(Section):
    """``model``: the model's path, architecture, dimensions (``dims``) and source."""

    path: str | None = None
    architecture: str | None = None
    model_type: str | None = None
    dims: dict[str, Any] | None = None
    num_parameters: int | None = None
    dtype: str | None = None
    source: str | None = None
    baseline_note: str | None = None


@dataclass
class Checkpoint(Section):
    """``checkpoint``: the checkpoint a job served (path, cache key, whether cached and quantized)."""

    path: str | None = None
    key: str | None = None
    cached: bool | None = None
    quantized: bool | None = None


@dataclass
class JobRecord(Section):
    """One job's record, typed (schema versions 1 and 2). ``config`` is the job's config snapshot (a dict);
    ``status`` is ``running`` | ``ok`` | ``failed`` | ``interrupted`` with ``failed_stage``, ``error``,
    ``traceback``."""

    schema_version: int | None = None
    tool: dict[str, str] | None = None
    job: JobInfo = field(default_factory=JobInfo)
    config: dict[str, Any] = field(default_factory=dict)
    environment: Environment = field(default_factory=Environment)
    status: str | None = None
    failed_stage: str | None = None
    error: str | None = None
    traceback: str | None = None
    stages: dict[str, Stage] = field(default_factory=dict)
    model: ModelInfo = field(default_factory=ModelInfo)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    memory: Memory = field(default_factory=Memory)
    accuracy: Accuracy = field(default_factory=Accuracy)
    speed: Speed = field(default_factory=Speed)
    notes: list[str] | None = None

    NESTED: ClassVar[dict[str, type[Section]]] = {
        "job": JobInfo,
        "environment": Environment,
        "model": ModelInfo,
        "checkpoint": Checkpoint,
        "memory": Memory,
        "accuracy": Accuracy,
        "speed": Speed,
    }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> JobRecord:
        """The typed record of a version 1 or 2 record dict (the layout is the same).

        Raises:
            ValueError: ``data`` is not a quantverdict record of a version this code reads.
        """
        data = data if isinstance(data, dict) else {}
        if (data.get("tool") or {}).get("name") != "quantverdict" or data.get(
            "schema_version"
        ) not in READABLE_VERSIONS:
            raise ValueError(f"not a quantverdict record of schema version {' or '.join(map(str, READABLE_VERSIONS))}")
        return cls.view(data)

    @classmethod
    def view(cls, data: dict[str, Any]) -> JobRecord:
        """The typed view of a record dict, version and tool unchecked (a partial or hand-built record:
        every section it lacks is empty)."""
        rec = super().from_dict(data)
        rec.stages = _section_map(rec, "stages", Stage)
        if not isinstance(rec.config, dict):
            rec.extra["config"], rec.config = rec.config, {}
        return rec

    def cfg(self, section: str) -> dict[str, Any]:
        """``config.<section>`` of the config snapshot (``{}`` when absent or null)."""
        value = self.config.get(section)
        return value if isinstance(value, dict) else {}

    @property
    def server(self) -> ServerMemory:
        """``memory.server`` (empty when the job never started a server)."""
        return self.memory.server

    @property
    def checkpoint_memory(self) -> CheckpointMemory:
        """``memory.checkpoint`` (empty when not measured)."""
        return self.memory.checkpoint


def read(path: Path) -> JobRecord:
    """The typed record of ``path`` (a ``record.json`` or the job folder holding it), version 1 or 2.

    Raises:
        ValueError: the file is not a quantverdict record of a version this code reads.
    """
    return JobRecord.from_dict(load(path))
