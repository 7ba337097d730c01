"""The job's GPU: what ``nvidia-smi`` says, and whether it can run the scheme and hold its weights.

Runs in the orchestrator (no torch): :func:`gpu_info` asks ``nvidia-smi``; the checks are pure
functions of that list, so tests pass hand-built lists. A job runs on its first visible GPU (``cuda:0``), or on
the first ``bench.server.tensor_parallel_size`` of them when the server shards the model: the scheme check
judges ``gpus[0]``, the fit check every GPU the server uses, with the need per GPU (:func:`per_gpu_need_bytes`).

Minimum compute capabilities, from vLLM's compressed-tensors schemes (``get_min_capability`` in
``vllm/model_executor/layers/quantization/compressed_tensors/schemes/``, read in the vllm 0.32.0 source
of the serve environment; the GPU machine's vLLM 0.26.0 is newer than the Turing change below):

====================  ====  ==========================================================================
scheme                min   source
====================  ====  ==========================================================================
FP8 W8A8              8.9   ``CompressedTensorsW8A8Fp8`` (Ada/Hopper FP8 tensor cores). Below 8.9 vLLM
                            does not fail: it silently serves the checkpoint with the weight-only
                            ``CompressedTensorsW8A16Fp8`` (FP8 Marlin), i.e. another scheme's speed.
int8 W8A8             7.5   ``CompressedTensorsW8A8Int8`` (Turing int8 tensor cores).
W4A16 / W8A16         7.5   ``CompressedTensorsWNA16`` (Marlin; Turing since vLLM PR #31000;
                            8.0 before).
====================  ====  ==========================================================================
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from collections.abc import Sequence
from typing import Any

from quantverdict.config.schema import DEVICES, ConfigError, SchemeConfig
from quantverdict.config.schemes import weight_layout
from quantverdict.measure import kv_cache, memory, tensor_parallel
from quantverdict.results.record import ModelInfo

log = logging.getLogger(__name__)

QUERY = "index,name,driver_version,memory.total,compute_cap,uuid,pci.bus_id"
# asked apart from QUERY, so that a driver that does not know a field costs these numbers only, never the GPU list
LIMITS_QUERY = "index,power.limit,enforced.power.limit,clocks.max.sm,clocks.max.memory"
LIMIT_KEYS = ("power_limit_w", "enforced_power_limit_w", "clocks_max_sm_mhz", "clocks_max_memory_mhz")
FP8_W8A8_MIN_CC = (8, 9)
INT8_W8A8_MIN_CC = (7, 5)
WEIGHT_ONLY_MIN_CC = (7, 5)


def parse_nvidia_smi(text: str) -> list[dict[str, Any]]:
    """Rows of ``nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap,uuid,pci.bus_id
    --format=csv,noheader,nounits``.

    Returns:
        ``[{"index": int, "name": str, "driver_version": str, "memory_total_mib": float | None,
        "compute_cap": str, "uuid": str, "pci_bus_id": str}]`` in nvidia-smi's order;
        ``memory_total_mib`` is None where nvidia-smi prints no number (``[N/A]``). ``uuid``
        (``GPU-<uuid>``, fixed for the physical GPU) says whether two records ran on the same
        GPU: the review compares schemes measured on one GPU apart from those that were not.
    """
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        index, rest = line.split(",", 1)
        name, driver, mem, cap, uuid, bus = (p.strip() for p in rest.rsplit(",", 5))  # a name may hold a comma
        try:
            mem_mib: float | None = float(mem)
        except ValueError:
            mem_mib = None
        gpus.append(
            {
                "index": int(index),
                "name": name,
                "driver_version": driver,
                "memory_total_mib": mem_mib,
                "compute_cap": cap,
                "uuid": uuid,
                "pci_bus_id": bus,
            }
        )
    return gpus


def parse_limits(text: str) -> dict[int, dict[str, float | None]]:
    """Rows of ``nvidia-smi --query-gpu=index,power.limit,enforced.power.limit,clocks.max.sm,clocks.max.memory
    --format=csv,noheader,nounits``, by GPU index.

    Returns:
        ``{index: {"power_limit_w": W, "enforced_power_limit_w": W, "clocks_max_sm_mhz": MHz,
        "clocks_max_memory_mhz": MHz}}``; a value nvidia-smi prints as ``[N/A]`` (or anything not a number) is
        None. The enforced power cap is what two GPUs of one name can be configured apart in: the same bf16
        job, run on four H200s one at a time, saturated 9.8% lower (median of three) on one of them than
        on the other three, and a record that keeps the cap says whether a lower one explains such
        a gap. The top clocks are the hardware's (alike on every GPU of a model); a clock locked lower or
        throttled under load is not seen here (that needs sampling during the sweep). E.g. an H200:
        ``0, 700.00, 700.00, 1980, 3201``.
    """
    out: dict[int, dict[str, float | None]] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 1 + len(LIMIT_KEYS) or not parts[0].isdigit():
            continue
        values: dict[str, float | None] = {}
        for key, raw in zip(LIMIT_KEYS, parts[1:], strict=True):
            try:
                values[key] = float(raw)
            except ValueError:
                values[key] = None
        out[int(parts[0])] = values
    return out


def visible(gpus: list[dict[str, Any]], cuda_visible_devices: str | None) -> list[dict[str, Any]]:
    """The GPUs a CUDA program sees under ``CUDA_VISIBLE_DEVICES``, in CUDA's order.

    ``None`` (unset): all. A comma-separated list of integer indices or ``GPU-<uuid>`` names (a unique
    prefix is enough, as in CUDA): those GPUs in that order; as in CUDA, enumeration stops at the first
    token that names no GPU (CUDA C Programming Guide, "CUDA Environment Variables"), and a repeated GPU
    hides every GPU. Measured with torch on a one-GPU H200 host (``torch.cuda.device_count()``): unset 1,
    ``""`` 0, ``"0"`` 1, ``"-1"`` 0, ``"0,7"`` 1, ``"7,0"`` 0, ``"0,0"`` 0; ``nvidia-smi`` itself lists the GPU
    under every value. Any other form (``MIG-...``) is not mapped here: all GPUs are returned, their ``uuid``
    set to None (which one the job used is not known, so no review calls two jobs "same GPU").
    """
    if cuda_visible_devices is None:
        return list(gpus)
    tokens = [t.strip() for t in cuda_visible_devices.split(",")]
    if tokens == [""]:
        return []
    if not all(re.fullmatch(r"-?\d+", t) or t.startswith("GPU-") for t in tokens):
        return [dict(g, uuid=None) for g in gpus]
    by_index = {g["index"]: g for g in gpus}
    out: list[dict[str, Any]] = []
    for t in tokens:
        if t.startswith("GPU-"):
            named = [g for g in gpus if str(g.get("uuid") or "").startswith(t)]
            g = named[0] if len(named) == 1 else None
        else:
            g = by_index.get(int(t))
        if g is None:
            break
        if g in out:
            return []
        out.append(g)
    return out


def gpu_info(cuda_visible_devices: str | None = None, nvidia_smi: str = "nvidia-smi") -> list[dict[str, Any]]:
    """The GPUs this job can see (see :func:`parse_nvidia_smi` for the fields, :func:`parse_limits` for the
    power cap and top clocks added to each: None where not known); [] without any.

    Args:
        cuda_visible_devices: the ``CUDA_VISIBLE_DEVICES`` the stages run with; None: this
            process's environment variable.
        nvidia_smi: the program to ask.

    Returns:
        [] when ``nvidia-smi`` is not installed, fails (no driver) or lists no GPU, or when
        ``CUDA_VISIBLE_DEVICES`` hides them all (:func:`visible`). A failure of the second query
        (:data:`LIMITS_QUERY`) leaves the limits None and the list as it is.
    """
    res = _query(nvidia_smi, QUERY)
    if res is None:
        return []
    gpus = parse_nvidia_smi(res)
    limits_text = _query(nvidia_smi, LIMITS_QUERY)
    limits = parse_limits(limits_text) if limits_text is not None else {}
    for g in gpus:
        g.update(limits.get(g["index"]) or dict.fromkeys(LIMIT_KEYS))
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES") if cuda_visible_devices is None else cuda_visible_devices
    return visible(gpus, cvd)


def _query(nvidia_smi: str, fields: str) -> str | None:
    """``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits``'s output; None (and a log line) when the
    program is missing, times out or fails."""
    try:
        res = subprocess.run(
            [nvidia_smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (FileNotFoundError, PermissionError, subprocess.TimeoutExpired) as exc:
        log.info("no GPU information: %s", exc)
        return None
    if res.returncode != 0:
        log.warning(
            "nvidia-smi --query-gpu=%s failed (exit %d): %s",
            fields,
            res.returncode,
            (res.stdout + res.stderr).strip()[-500:],
        )
        return None
    return res.stdout


def compute_capability(gpu: dict[str, Any]) -> tuple[int, int]:
    """``compute_cap`` ("8.9", 8.9 or "9.0") as (major, minor)."""
    major, _, minor = str(gpu["compute_cap"]).strip().partition(".")
    return int(major), int(minor or 0)


def _no_gpu() -> ConfigError:
    return ConfigError(
        "env.device='cuda' but no GPU is visible (nvidia-smi is missing, lists no GPU, or CUDA_VISIBLE_DEVICES "
        f"hides them); allowed: {', '.join(DEVICES)}: run on a machine with an NVIDIA GPU, or set env.device=cpu "
        "(env=cpu)"
    )


def _is_fp8(scheme: SchemeConfig) -> bool:
    return "FP8" in f"{scheme.label} {scheme.name}".upper()


def min_compute_capability(scheme: SchemeConfig) -> tuple[tuple[int, int], str] | None:
    """(minimum compute capability, what needs it) for vLLM to run ``scheme`` natively; None: any GPU.

    See the table in the module docstring for the source of each number.
    """
    if scheme.method == "none" or scheme.weight_bits >= 16:
        return None
    if scheme.activation_bits == 8 and _is_fp8(scheme):
        return FP8_W8A8_MIN_CC, "FP8 W8A8 needs compute capability >= 8.9 (Ada/Hopper)"
    if scheme.activation_bits == 8:
        return INT8_W8A8_MIN_CC, "int8 W8A8 needs compute capability >= 7.5 (Turing) for vLLM's int8 kernels"
    return WEIGHT_ONLY_MIN_CC, (
        f"W{scheme.weight_bits}A16 weight-only needs compute capability >= 7.5 (Turing) for vLLM's Marlin kernel"
    )


def check_scheme_on_gpu(scheme: SchemeConfig, gpus: Sequence[dict[str, Any]]) -> None:
    """Refuse a scheme the job's GPU (``gpus[0]``) cannot run natively, before any work.

    Raises:
        ConfigError: no GPU visible (naming ``env.device`` and its allowed values), or the GPU's
            compute capability is below :func:`min_compute_capability` (naming ``scheme=<name>``,
            the GPU, its capability, the requirement and the schemes that would run).
    """
    if not gpus:
        raise _no_gpu()
    need = min_compute_capability(scheme)
    gpu = gpus[0]
    cc = compute_capability(gpu)
    if need is None or cc >= need[0]:
        return
    if need[0] == FP8_W8A8_MIN_CC:
        instead = (
            "vLLM would silently fall back to weight-only FP8 (Marlin) and measure another scheme. "
            "Use scheme=w8a8 (int8 W8A8) or a weight-only scheme: scheme=int8 (W8A16), awq or gptq (W4A16)"
        )
    else:
        instead = "no quantized scheme runs natively there: use scheme=bf16 or a GPU of compute capability >= 7.5"
    raise ConfigError(
        f"scheme={scheme.name} ({scheme.label}) cannot run natively on GPU {gpu.get('index', 0)} {gpu['name']} "
        f"(compute capability {cc[0]}.{cc[1]}): {need[1]}. {instead}."
    )


def predict_weight_bytes(scheme: SchemeConfig, model: ModelInfo | dict[str, Any]) -> float:
    """Bytes of the served model's weights, predicted from the 16-bit source before quantizing.

    Formula (compressed-tensors layout, lm_head and embeddings kept 16-bit)::

        P = number of parameters (model["num_parameters"], else counted from the safetensors headers)
        L = Linear weight elements a scheme quantizes (linear_weight_elements(dims); P if unknown)
        bf16:       2 * P
        quantized:  expected_quantized_bytes(L, weight_bits, g, 2-byte scales, zero points if asymmetric)
                    + 2 * (P - L)

    (:func:`quantverdict.measure.memory.predicted_weight_bytes`; ``count_parameters`` and
    ``linear_weight_elements`` are in :mod:`quantverdict.measure.memory` too.)

    ``g`` is the scheme's weights per scale (``group_size: auto`` -> derive_group_size over the model's
    in_features; a format's fixed group or block, :func:`quantverdict.config.schemes.weight_layout`, with its
    scale bytes: NVFP4 1; per-channel: ``hidden_size``, one scale per row of hidden_size inputs, so the
    scales are a rounding error). Checked against vLLM's "model weights" log line for a Llama-3-8B-
    shaped model on the H200 (../shared/gpu/README.md): bf16 13.49 GiB (predicted 13.49), W4A16
    g128 3.85 GiB (3.84), FP8_DYNAMIC 7.03 GiB (6.99). For the Qwen3.5-9B-shaped hybrid it gives the
    W4A16 checkpoint's bytes to 2 KiB (10.198 GiB); vLLM served 9.41 GiB, because with
    ``--language-model-only`` it does not load the vision tower that ``P`` counts: the prediction errs
    high, which is the safe side for a fit check.

    Args:
        scheme: the composed scheme.
        model: the record's ``model`` section (``path``, ``dims``, ``num_parameters``, ``model_type``), or the
            materialize result as its dict.

    Returns:
        Predicted bytes (float).
    """
    info = model if isinstance(model, ModelInfo) else ModelInfo.model_validate(model)
    dims = info.dims or {}
    n_params = int(info.num_parameters or memory.count_parameters(str(info.path)))
    if scheme.method == "none" or scheme.weight_bits >= 16:
        return memory.predicted_weight_bytes(n_params)
    linear = memory.linear_weight_elements(dims, info.model_type)
    group: int | None = None
    scale_bytes = memory.DTYPE_BYTES["bfloat16"]
    if scheme.group_size != "channel" and dims.get("hidden_size"):
        try:
            layout = weight_layout(scheme, dims)
        except ConfigError:
            layout = {}  # refused with its own message by schemes.resolve_recipe
        group = layout.get("group_size")
        scale_bytes = layout.get("scale_bytes") or scale_bytes
    group = group or int(dims.get("hidden_size") or 4096)
    return memory.predicted_weight_bytes(n_params, linear, scheme.weight_bits, group, scheme.symmetric, scale_bytes)


def per_gpu_need_bytes(
    weight_bytes: float, dims: dict[str, Any], tokens: int, kv_dtype_bytes: float, tensor_parallel_size: int
) -> dict[str, float]:
    """Bytes one GPU of a tensor-parallel server holds: its weight shard and the KV cache of ``tokens``.

    Formulas (vLLM's tensor parallelism: Megatron-style column/row splits of every Linear layer and a
    vocab-parallel embedding and ``lm_head``, so the weights divide by TP; norms, replicated, are
    a rounding error)::

        weights per GPU = weight_bytes / TP
        KV per GPU      = tokens x 2 (K, V) x kv_layers x kv_heads_per_gpu x head_dim x kv_dtype_bytes

    with ``kv_heads_per_gpu`` from :func:`quantverdict.measure.tensor_parallel.kv_heads_per_gpu` and the
    per-token bytes of :func:`quantverdict.measure.kv_cache.kv_bytes_per_token`. Llama-3.1-70B in bf16 (141.1e9 bytes of
    weights, 80 layers, 8 KV heads of 128) at TP=2 and 4,096 tokens: 65.7 GiB + 0.625 GiB per GPU.

    Args:
        weight_bytes: the whole model's predicted weight bytes (:func:`predict_weight_bytes`).
        dims: ``model.dims`` (``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``,
            ``head_dim``/``hidden_size``; ``num_kv_layers`` for hybrids).
        tokens: KV-cache tokens one GPU must hold (one sequence of ``max_model_len`` is vLLM's minimum).
        kv_dtype_bytes: bytes per KV element (2 for bf16, 1 for an fp8 KV cache).
        tensor_parallel_size: GPUs the server shards over.

    Returns:
        ``{"weights_bytes", "kv_bytes", "total_bytes"}`` per GPU; ``kv_bytes`` is 0 when a dimension is
        missing.
    """
    tp = max(1, int(tensor_parallel_size))
    heads = int(dims.get("num_key_value_heads") or dims.get("num_attention_heads") or 0)
    per_gpu_dims = {**dims, "num_key_value_heads": tensor_parallel.kv_heads_per_gpu(heads, tp)} if heads else dims
    per_token = kv_cache.kv_bytes_per_token(per_gpu_dims, kv_dtype_bytes) or 0.0
    weights, kv = weight_bytes / tp, per_token * tokens
    return {"weights_bytes": weights, "kv_bytes": kv, "total_bytes": weights + kv}


def check_gpu_count(gpus: Sequence[dict[str, Any]], tensor_parallel_size: int) -> None:
    """Refuse a job that sees fewer GPUs than its server shards over (``bench.server.tensor_parallel_size``).

    The GPUs a job sees are the ones its launcher gave it (Ray and Slurm set ``CUDA_VISIBLE_DEVICES``).

    Raises:
        ConfigError: no GPU, or fewer than ``tensor_parallel_size``; the message names the launcher keys.
    """
    tp = max(1, int(tensor_parallel_size))
    if not gpus:
        raise _no_gpu()
    if len(gpus) < tp:
        raise ConfigError(
            f"bench.server.tensor_parallel_size={tp} needs {tp} GPUs; this job sees {len(gpus)} "
            f"(index {', '.join(str(g.get('index')) for g in gpus)}). Ask the launcher for {tp} GPUs per job "
            f"(hydra/launcher=ray: hydra.launcher.ray.remote.num_gpus={tp}; hydra/launcher=submitit_slurm: "
            f"hydra.launcher.gpus_per_task={tp}) or lower bench.server.tensor_parallel_size"
        )


def check_weights_fit(
    weight_bytes: float,
    gpus: Sequence[dict[str, Any]],
    gpu_memory_utilization: float,
    scheme_name: str,
    model_name: str,
    tensor_parallel_size: int = 1,
    kv_bytes_per_gpu: float = 0.0,
) -> None:
    """Refuse a job whose weight shard (plus the KV cache vLLM must hold at least) exceeds one GPU's budget.

    Per GPU of the ``tensor_parallel_size`` the server shards over (the first TP visible GPUs): budget =
    that GPU's ``memory.total`` x ``bench.server.gpu_memory_utilization`` (vLLM's share of the GPU for
    weights, activations and KV cache together); need = ``weight_bytes / TP + kv_bytes_per_gpu``
    (:func:`per_gpu_need_bytes`), so a need above the budget can never start. A GPU whose total memory
    nvidia-smi does not report is not judged.

    Raises:
        ConfigError: fewer visible GPUs than ``tensor_parallel_size`` (none at all included), or a GPU's
            need > its budget; the message names the model, the scheme, the GiB per GPU and what to change.
    """
    tp = max(1, int(tensor_parallel_size))
    check_gpu_count(gpus, tp)
    need = weight_bytes / tp + kv_bytes_per_gpu
    for gpu in gpus[:tp]:
        total_mib = gpu.get("memory_total_mib")
        if not total_mib:
            log.warning("GPU %s reports no total memory; the weights-fit check is skipped", gpu.get("name"))
            continue
        total = float(total_mib) * memory.MIB
        budget = total * gpu_memory_utilization
        if need > budget:
            what = "the weights alone are" if not kv_bytes_per_gpu else "weights + the KV cache of one sequence are"
            shard = f" ({weight_bytes / memory.GIB:.2f} GiB / tensor_parallel_size={tp})" if tp > 1 else ""
            kv = f" + {kv_bytes_per_gpu / memory.GIB:.2f} GiB KV cache" if kv_bytes_per_gpu else ""
            raise ConfigError(
                f"model {model_name} with scheme={scheme_name}: {what} predicted at "
                f"{weight_bytes / tp / memory.GIB:.2f} GiB{shard}{kv} per GPU, over the budget of GPU "
                f"{gpu.get('index', 0)} {gpu['name']}: "
                f"{total / memory.GIB:.2f} GiB x bench.server.gpu_memory_utilization={gpu_memory_utilization} = "
                f"{budget / memory.GIB:.2f} GiB. Use a lower-bit scheme (e.g. awq or gptq, W4A16), more GPUs "
                f"(bench.server.tensor_parallel_size={tp * 2}), raise bench.server.gpu_memory_utilization, or "
                "a GPU with more memory."
            )


_CUDA_BANNER = re.compile(r"CUDA Version:\s*(\d+)\.(\d+)")


def driver_cuda_version(nvidia_smi: str = "nvidia-smi") -> tuple[int, int] | None:
    """The newest CUDA version this host's NVIDIA driver supports, from ``nvidia-smi``'s banner
    (``| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0 |``); None when unknown."""
    try:
        res = subprocess.run([nvidia_smi], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = _CUDA_BANNER.search(res.stdout) if res.returncode == 0 else None
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_torch_cuda(
    stage: str,
    build: dict[str, str | None],
    driver_cuda: tuple[int, int] | None,
    python: str = "",
    env_name: str = "gpu",
) -> None:
    """Refuse a stage environment whose torch cannot use this host's GPU, before any work.

    A CUDA runtime runs on a driver of the same major version or newer (NVIDIA's "CUDA Compatibility" guide:
    minor version compatibility within a major release), so the check compares major versions.

    Args:
        stage: ``quantize`` or ``serve``.
        build: :meth:`quantverdict.processes.envs.StageEnv.torch_build` (``torch`` version, ``cuda`` or None).
        driver_cuda: :func:`driver_cuda_version`; None skips the driver comparison.
        python: the environment's interpreter, named in the message.
        env_name: the ``env`` config, named in the message.

    Raises:
        ConfigError: torch does not import, no torch, a CPU-only torch, or a torch built for a newer CUDA major
            than the driver runs.
    """
    where = f"the {stage} environment ({python})" if python else f"the {stage} environment"
    if build.get("error"):
        raise ConfigError(f"env={env_name}: importing torch in {where} failed:\n{build['error']}")
    if build.get("torch") is None:
        raise ConfigError(f"env={env_name}: {where} has no torch; a GPU environment needs a CUDA build of torch")
    cuda = build.get("cuda")
    if cuda is None:
        raise ConfigError(
            f"env={env_name}: {where} has torch {build['torch']}, a CPU-only build; a GPU environment needs a CUDA "
            f"build (requirements/gpu-{stage}.txt installs one from PyPI; with env.system_site_packages=true the "
            "interpreter's own torch must be a CUDA build), or run on the CPU with env=cpu"
        )
    major = int(str(cuda).split(".")[0])
    if driver_cuda is not None and major > driver_cuda[0]:
        raise ConfigError(
            f"env={env_name}: {where} has torch {build['torch']}, built for CUDA {cuda}, and this host's NVIDIA "
            f"driver supports CUDA up to {driver_cuda[0]}.{driver_cuda[1]}: install a driver for CUDA {major} "
            f"(nvidia-smi's banner shows the CUDA version a driver supports), or a torch built for CUDA "
            f"{driver_cuda[0]} in that environment"
        )
