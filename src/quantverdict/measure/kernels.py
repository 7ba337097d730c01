"""Which kernel served a scheme: whether its measured speed is that of its own kernels or of a fallback.

Pure (standard library); reads the server-log parse of :mod:`quantverdict.measure.vllm_log`, typed by
:class:`quantverdict.measure.points.ServerMemory`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantverdict.measure.points import LinearKernel, ServerMemory, as_server


def _kernel(entry: Any) -> LinearKernel | None:
    """A ``kernels`` entry as a typed kernel (the parse writes ``{"kernel", "method"}``); None for another value."""
    return LinearKernel.model_validate(entry) if isinstance(entry, dict) else None


def kernel_check(
    label: str, server: ServerMemory | Mapping[str, Any] | None, activation_quantized: bool
) -> dict[str, Any]:
    """Whether a scheme's speed is that of its own kernels, from the vLLM server log parse.

    A scheme that quantizes activations (W8A8, FP8_DYNAMIC) but ran on a weight-only or emulated path
    (``server["fallback"]``, see :func:`quantverdict.measure.vllm_log.parse`; e.g. FP8 on a GPU without FP8
    tensor cores runs "Weight-only FP8 compression ... Marlin") is relabelled
    ``"<label> (weight-only fallback)"`` (``"(emulated)"`` for an emulation kernel) and is not
    comparable for speed with the scheme it is named after.

    Args:
        label: the scheme's label (``FP8_DYNAMIC``).
        server: ``vllm_log.parse`` of the server log (the record's ``memory.server``), typed or as its JSON holds
            it, or None (an empty parse reads as None).
        activation_quantized: whether the scheme quantizes activations.

    A weight-only scheme whose format the GPU cannot compute in (``server["compute"] == "emulated"``: NVFP4A16
    on Hopper, "Weight-only FP4 compression will be used leveraging the Marlin kernel") stays comparable, since a
    weight-only kernel is its design, but is relabelled ``"<label> (weight-only fallback)"``: its speed is that of
    smaller weights, not of FP4 arithmetic.

    Returns:
        ``{"scheme_label", "effective_label", "comparable_for_speed" (True/False, None when unknown),
        "kernels" (["Kernel (method)"]), "kernel" (the first kernel's name, None without one), "compute"
        (``native``/``emulated``/None, :func:`quantverdict.measure.vllm_log.parse`), "compute_reason", "reason"}``.
    """
    srv = as_server(server)
    entries = srv.kernels or []
    kernels = [f"{k.kernel} ({k.method})" if (k := _kernel(e)) else str(e) for e in entries]
    first = entries[0] if entries else None
    first_kernel = _kernel(first)
    out = {
        "scheme_label": label,
        "effective_label": label,
        "kernels": kernels,
        "kernel": first_kernel.kernel if first_kernel else first,
        "compute": srv.compute,
        "compute_reason": srv.compute_reason,
    }
    if srv.is_empty():
        return {**out, "comparable_for_speed": None, "reason": "no vLLM server log parsed: kernel unknown"}
    if srv.fallback:
        emulated = any("emulat" in k.lower() for k in kernels) or any(
            "emulat" in line.lower() for line in srv.fallback_lines or []
        )
        what = "emulated" if emulated else "weight-only fallback"
        why = "; ".join(srv.fallback_lines or []) or ", ".join(kernels) or "fallback reported"
        return {**out, "effective_label": f"{label} ({what})", "comparable_for_speed": False, "reason": why}
    if activation_quantized and not kernels:
        return {
            **out,
            "comparable_for_speed": None,
            "reason": "activation-quantized scheme, but the server log names no linear kernel: kernel unknown",
        }
    why = ", ".join(kernels) if kernels else "unquantized: vLLM's default GEMM"
    if out["compute"] == "emulated":
        out["effective_label"] = f"{label} (weight-only fallback)"
        why = f"{out['compute_reason']} ({why})"
    return {**out, "comparable_for_speed": True, "reason": why}
