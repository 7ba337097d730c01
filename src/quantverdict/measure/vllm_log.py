"""Memory, KV cache and kernel facts from a ``vllm serve`` log (pure, standard library only).

The lines read here are vLLM's own INFO/WARNING lines; the format strings are in vLLM's source
(0.32.0 unless noted)::

    Model loading took %s GiB memory and %.6f seconds        v1/worker/gpu_model_runner.py (GPU only;
                                                             older releases: "took %.4f GiB and")
    Available KV cache memory: %s GiB                        v1/worker/gpu_worker.py (GPU)
    Explicitly set (%s/%s) GiB for KV cache on node %d.      v1/worker/cpu_worker.py (CPU, requested)
    Auto set (%s/%s) GiB for KV cache on node %d, ...        v1/worker/cpu_worker.py (CPU, automatic)
    %s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx
                                                             v1/core/kv_cache_utils.py ("GPU"/"CPU";
                                                             older releases: two separate lines)
    Checkpoint size: %.2f GiB.                               model_executor/model_loader/weight_utils.py
    Using %s for CompressedTensorsWNA16                      compressed_tensors/schemes/*.py
    Selected %s for CompressedTensorsW8A8Int8                model_executor/kernels/linear/__init__.py
    Your GPU does not have native support for FP8 computation ... Weight-only FP8 compression will be
    used leveraging the Marlin kernel.                       quantization/utils/marlin_utils_fp8.py
    Using %s for NVFP4 GEMM                                  model_executor/kernels/linear/__init__.py
    Your GPU does not have native support for FP4 computation but FP4 quantization is being used.
    Weight-only FP4 compression will be used leveraging the Marlin kernel. ...
                                                             kernels/linear/nvfp4/marlin.py (a GPU below
                                                             compute capability 10.0, e.g. Hopper)
    NVFP4 linear falling back to the slow and unoptimized emulation backend ...
                                                             model_executor/kernels/linear/__init__.py
    Failed to create oneDNN linear, fallback to torch linear. model_executor/layers/utils.py (CPU,
                                                             unquantized GEMM only)
    Graph capturing finished in %.0f secs, took %.2f GiB     v1/worker/gpu_model_runner.py (0.26.0)
    Kernel JIT monitor activated; ...                        utils/jit_monitor.py (0.26.0: the end of
                                                             the warm-up, gpu_worker.compile_or_warm_up_model)

On CPU vLLM logs no weights-memory line; ``weights_gib`` is then None and ``checkpoint_gib`` (the
size of the checkpoint files vLLM loads) is the nearest figure.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PREFIX = re.compile(r"^\((?P<proc>[^()]+?) pid=(?P<pid>\d+)\)\s+")

_VERSION_ENGINE = re.compile(r"Initializing a V1 LLM engine \(v(?P<v>[^)\s]+)\)")
_VERSION_BANNER = re.compile(r"\bversion (?P<v>\d+\.\d+[\w.+-]*)")
_DEVICE_CFG = re.compile(r"\bdevice_config=(?P<d>\w+)")
_QUANT_CFG = re.compile(r"\bquantization=(?P<q>[\w.-]+)")
_DTYPE_CFG = re.compile(r"\bdtype=torch\.(?P<d>\w+)")
_KV_DTYPE_CFG = re.compile(r"\bkv_cache_dtype=(?P<d>\w+)")
_WEIGHTS = re.compile(r"Model loading took (?P<gib>[\d.]+) GiB(?: memory)? and (?P<s>[\d.]+) seconds")
_LOAD_S_CPU = re.compile(r"Loading weights took (?P<s>[\d.]+) seconds")
_CHECKPOINT = re.compile(r"Checkpoint size: (?P<gib>[\d.]+) GiB")
_KV_GPU = re.compile(r"Available KV cache memory: (?P<gib>[\d.]+) GiB")
_KV_CPU = re.compile(r"(?P<how>Explicitly|Auto) set \((?P<gib>[\d.]+)/(?P<total>[\d.]+)\) GiB for KV cache")
_KV_TOKENS = re.compile(r"(?P<pool>\w+)(?: \+ host)? KV cache size: (?P<tokens>[\d,]+) tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<x>[\d.]+)x")
# torch.compile and CUDA-graph capture (vllm/compilation/monitor.py, v1/worker/gpu_model_runner.py); a graph
# loaded from the compile cache (VLLM_CACHE_ROOT/torch_compile_cache) says so (vllm/compilation/backends.py)
_COMPILE = re.compile(r"torch\.compile (?:took|takes) (?P<s>[\d.]+) s in total")
_GRAPH_CAPTURE = re.compile(r"Graph capturing finished in (?P<s>[\d.]+) secs")
_COMPILE_CACHE_HIT = re.compile(r"Directly load the compiled graph\(s\)")
# the warm-up vLLM runs after CUDA-graph capture (the sampler's dummy run, which JIT-compiles FlashInfer's sampling
# kernels and a few Triton kernels on a machine without their caches; vllm/v1/worker/gpu_worker.py
# compile_or_warm_up_model): from the capture line to the line that ends it, both with vLLM's "MM-DD HH:MM:SS" stamp
_STAMP = re.compile(r"\b(?P<mo>\d\d)-(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)\b")
_WARMUP_END = re.compile(r"Kernel JIT monitor activated|init engine \(profile, create kv cache, warmup model\) took")
_ENGINE_INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took (?P<s>[\d.]+) ")
_KERNEL = re.compile(r"\b(?:Using|Selected) (?P<kernel>[A-Za-z_]\w*) for (?P<method>[A-Za-z_][\w .()/-]*?)\.?\s*$")
# the GPU lacks the format's arithmetic: vLLM dequantizes the weights in a weight-only kernel (Marlin)
_NO_NATIVE = re.compile(r"does not have native support for (?P<fmt>FP\d) computation")
_ONEDNN_FALLBACK = re.compile(r"Failed to create oneDNN linear, fallback to torch linear")
_FALLBACK = re.compile(
    r"weight-only|emulation|emulated|falling back|fallback|does not have native support|not natively supported",
    re.IGNORECASE,
)
# W8A8, W4A8, W8A8Fp8, W4A4 ... : activation bits < 16 in the method name
# "falling back" lines that are not about how the weights are multiplied (seen on the H200 with
# vLLM 0.26: "No FlashInfer autotune cache entries found.Falling back to default tactics.")
_NOT_A_KERNEL_FALLBACK = re.compile(r"autotune|tactics|sampler|sampling|Auto-prefetch", re.IGNORECASE)
_ACT_QUANT_METHOD = re.compile(r"W\d+A(?:[1-9]|1[0-5])(?!\d)|ScaledMM|W8A8|Fp8|FP8|NVFP4|MXFP4", re.IGNORECASE)
_WEIGHT_ONLY_METHOD = re.compile(r"A16\b|WNA16|W\d+A16")


def _strip(line: str) -> str:
    line = _ANSI.sub("", line).rstrip()
    return _PREFIX.sub("", line)


def _stamp(line: str) -> datetime.datetime | None:
    """vLLM's ``MM-DD HH:MM:SS`` stamp in ``line`` as a datetime of the leap year 2000 (the log has no year;
    February 29 then exists), None without a stamp."""
    m = _STAMP.search(line)
    if m is None:
        return None
    try:
        return datetime.datetime(2000, int(m["mo"]), int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"]))
    except ValueError:  # not a date after all (e.g. 13-40 in another number format)
        return None


def _seconds_between(start: datetime.datetime, end: datetime.datetime) -> float:
    """``end - start`` in seconds, across a year's end (December 31 -> January 1: the end is in the next year)
    and across February 28 -> March 1 (the stamps' leap year 2000 puts a February 29 between them, which a
    log of another year does not have: a server's start spans seconds to minutes, never that day)."""
    delta = (end - start).total_seconds()
    if delta < 0 and start.month == 12 and end.month == 1:
        return delta + 366 * 86400
    if delta >= 86400 and (start.month, start.day) == (2, 28) and (end.month, end.day) == (3, 1):
        return delta - 86400
    return delta


def _kernel_ok(kernel: str, method: str) -> bool:
    """Keep linear/MoE kernel choices; drop e.g. "Using max model len" or attention backends."""
    if "Attention" in method or "attention" in method:
        return False
    return (
        kernel.endswith(("Kernel", "Experts", "LinearMethod", "MoEMethod"))
        or method.startswith(("CompressedTensors", "AutoAWQ", "GPTQ", "AWQ", "Fp8", "ModelOpt"))
        or "GEMM" in method
        or "linear" in method
    )


def _is_activation_quantized(kernels: list[dict[str, str]]) -> bool | None:
    if not kernels:
        return None
    for k in kernels:
        method = k["method"]
        if _WEIGHT_ONLY_METHOD.search(method):
            continue
        if _ACT_QUANT_METHOD.search(method) or "ScaledMM" in k["kernel"]:
            return True
    return False


def parse(text: str, activation_quantized: bool | None = None) -> dict[str, Any]:
    """Parse a ``vllm serve`` log.

    Args:
        text: the server log (stdout + stderr).
        activation_quantized: whether the served scheme quantizes activations (W8A8, FP8_DYNAMIC);
            None: inferred from the kernel lines (a ``W8A8``/``Fp8``/``ScaledMM`` method is activation-
            quantized, ``WNA16`` is weight-only).

    Returns:
        ``vllm_version``, ``device`` (``cuda``/``cpu``), ``quantization`` (vLLM's detected method, None
        for unquantized), ``dtype``, ``kv_cache_dtype``, ``weights_gib`` (GPU: memory taken by model
        loading; None on CPU), ``weights_load_s``, ``checkpoint_gib``, ``kv_cache_gib`` (memory given
        to the KV cache), ``kv_cache_source`` (``gpu_profiled``/``cpu_explicit``/``cpu_auto``),
        ``kv_cache_tokens``, ``max_concurrency`` (x requests of ``max_concurrency_request_tokens``
        tokens that fit in the KV cache), ``engine_init_s``, ``kernels`` (``[{"kernel", "method"}]``,
        first occurrence order, no duplicates), ``activation_quantized``, ``fallback`` (True when an
        activation-quantized scheme shows a weight-only/emulation/fallback path; False when
        it does not; None when the scheme is not activation-quantized), ``fallback_lines``,
        ``unquantized_gemm_fallback`` (CPU: oneDNN refused the unquantized GEMM, plain
        ``torch.nn.functional.linear`` used), ``compile_s`` (torch.compile, seconds; the sum over the log's
        "torch.compile took X s in total" lines), ``graph_capture_s`` (CUDA graphs), ``warmup_after_capture_s``
        (seconds from "Graph capturing finished" to "Kernel JIT monitor activated", else to "init engine ...
        took", by the lines' whole-second stamps, of the last server in the log: vLLM's sampler warm-up, which
        JIT-compiles FlashInfer's sampling kernels with nvcc when their cache is empty, 83 s on an H200),
        ``compile_cache_hit``
        (True when a compiled graph was loaded from vLLM's compile cache; None when nothing was compiled),
        ``compute`` (``emulated``: the GPU lacks the format's arithmetic and vLLM said so, e.g. "does not have
        native support for FP4 computation" with a Marlin weight-only kernel, or an emulation kernel ran;
        ``native``: the kernels named are the format's own; None: no kernel line) with ``compute_reason``,
        and ``evidence`` (the exact line behind each value).
        Values that the log does not contain are None.
    """
    out: dict[str, Any] = {
        "vllm_version": None,
        "device": None,
        "quantization": None,
        "dtype": None,
        "kv_cache_dtype": None,
        "weights_gib": None,
        "weights_load_s": None,
        "checkpoint_gib": None,
        "kv_cache_gib": None,
        "kv_cache_source": None,
        "kv_cache_tokens": None,
        "max_concurrency": None,
        "max_concurrency_request_tokens": None,
        "engine_init_s": None,
        "kernels": [],
        "activation_quantized": activation_quantized,
        "fallback": None,
        "fallback_lines": [],
        "unquantized_gemm_fallback": False,
        "compile_s": None,
        "graph_capture_s": None,
        "warmup_after_capture_s": None,
        "compile_cache_hit": None,
        "compute": None,
        "compute_reason": None,
    }
    captured_at: datetime.datetime | None = None
    evidence: dict[str, str] = {}

    def first(key: str, value: Any, line: str) -> None:
        if out[key] is None:
            out[key] = value
            evidence[key] = line

    for raw in text.splitlines():
        line = _strip(raw)
        if not line:
            continue
        if m := _VERSION_ENGINE.search(line):
            # a log holding several servers (appended to on a restart): the warm-up is the last one's
            captured_at, out["warmup_after_capture_s"] = None, None
            evidence.pop("warmup_after_capture_s", None)
            out["vllm_version"] = m["v"]  # the engine line wins over the banner
            evidence["vllm_version"] = line[:200]
            if m2 := _DEVICE_CFG.search(line):
                out["device"] = m2["d"]
                evidence["device"] = "device_config=" + m2["d"]
            if m2 := _QUANT_CFG.search(line):
                out["quantization"] = None if m2["q"] == "None" else m2["q"]
                evidence["quantization"] = "quantization=" + m2["q"]
            if m2 := _DTYPE_CFG.search(line):
                out["dtype"] = m2["d"]
            if m2 := _KV_DTYPE_CFG.search(line):
                out["kv_cache_dtype"] = m2["d"]
            continue
        if out["vllm_version"] is None and (m := _VERSION_BANNER.search(line)):
            first("vllm_version", m["v"], line)
        if m := _WEIGHTS.search(line):
            first("weights_gib", float(m["gib"]), line)
            first("weights_load_s", float(m["s"]), line)
        elif m := _LOAD_S_CPU.search(line):
            first("weights_load_s", float(m["s"]), line)
        if m := _CHECKPOINT.search(line):
            first("checkpoint_gib", float(m["gib"]), line)
        if m := _KV_GPU.search(line):
            first("kv_cache_gib", float(m["gib"]), line)
            first("kv_cache_source", "gpu_profiled", line)
        elif m := _KV_CPU.search(line):
            first("kv_cache_gib", float(m["gib"]), line)
            first("kv_cache_source", "cpu_explicit" if m["how"] == "Explicitly" else "cpu_auto", line)
        if m := _KV_TOKENS.search(line):
            first("kv_cache_tokens", int(m["tokens"].replace(",", "")), line)
            pool = m["pool"].lower()
            if out["device"] is None and pool in ("gpu", "cpu", "xpu", "tpu"):
                out["device"] = "cuda" if pool == "gpu" else pool
        if m := _CONCURRENCY.search(line):
            first("max_concurrency", float(m["x"]), line)
            first("max_concurrency_request_tokens", int(m["len"].replace(",", "")), line)
        if m := _ENGINE_INIT.search(line):
            first("engine_init_s", float(m["s"]), line)
        if m := _COMPILE.search(line):
            out["compile_s"] = (out["compile_s"] or 0.0) + float(m["s"])
            evidence.setdefault("compile_s", line[:200])
            if out["compile_cache_hit"] is None:
                out["compile_cache_hit"] = False
        if m := _GRAPH_CAPTURE.search(line):
            out["graph_capture_s"] = (out["graph_capture_s"] or 0.0) + float(m["s"])
            evidence.setdefault("graph_capture_s", line[:200])
            captured_at = _stamp(line)
        elif captured_at is not None and out["warmup_after_capture_s"] is None and _WARMUP_END.search(line):
            end = _stamp(line)
            gap = None if end is None else _seconds_between(captured_at, end)
            if gap is not None and gap >= 0:
                out["warmup_after_capture_s"] = gap
                evidence["warmup_after_capture_s"] = line[:200]
        if _COMPILE_CACHE_HIT.search(line):
            out["compile_cache_hit"] = True
            evidence.setdefault("compile_cache_hit", line[:200])
        if (m := _KERNEL.search(line)) and _kernel_ok(m["kernel"], m["method"]):
            entry = {"kernel": m["kernel"], "method": m["method"].strip()}
            if entry not in out["kernels"]:
                out["kernels"].append(entry)
                evidence.setdefault("kernels", line)
        if (m := _NO_NATIVE.search(line)) and out["compute"] is None:
            out["compute"] = "emulated"
            out["compute_reason"] = (
                f"weight-only fallback: {m['fmt']} weights dequantized to 16-bit by Marlin; the memory win, "
                f"no {m['fmt']} compute"
            )
            evidence["compute"] = line[:300]
        if _ONEDNN_FALLBACK.search(line):
            out["unquantized_gemm_fallback"] = True
            evidence.setdefault("unquantized_gemm_fallback", line[:200])
        elif (
            _FALLBACK.search(line)
            and not line.startswith(("Route:", "INFO:"))
            and not _NOT_A_KERNEL_FALLBACK.search(line)
        ):
            if "WARNING" in raw or "Emulation" in line or "weight-only" in line.lower():
                out["fallback_lines"].append(line[:300])

    if out["device"] is None and out["kv_cache_source"] is not None:
        out["device"] = "cuda" if out["kv_cache_source"] == "gpu_profiled" else "cpu"
    kernels_quantize_activations = _is_activation_quantized(out["kernels"])
    if out["activation_quantized"] is None:
        out["activation_quantized"] = kernels_quantize_activations
    emulated_kernel = any("Emulation" in k["kernel"] for k in out["kernels"])
    if out["compute"] is None and emulated_kernel:
        names = ", ".join(k["kernel"] for k in out["kernels"] if "Emulation" in k["kernel"])
        out["compute"], out["compute_reason"] = "emulated", f"emulation kernel ({names}): dequantized in PyTorch"
    elif out["compute"] is None and out["kernels"]:
        out["compute"] = "native"
        out["compute_reason"] = "the format's own kernel: " + ", ".join(k["kernel"] for k in out["kernels"])
    marlin_fp8 = any("Marlin" in k["kernel"] and "fp8" in k["method"].lower() for k in out["kernels"])
    # the caller says activations are quantized, but every kernel vLLM chose is weight-only
    weight_only_path = kernels_quantize_activations is False
    if out["activation_quantized"]:
        out["fallback"] = bool(out["fallback_lines"]) or emulated_kernel or marlin_fp8 or weight_only_path
    out["evidence"] = evidence
    return out
