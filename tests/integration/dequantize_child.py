"""Round trips through compressed-tensors' own quantizer; run in the quantize environment (torch +
compressed-tensors), started by ``tests/integration/test_dequantize.py``.

``python dequantize_child.py [CKPT SOURCE MODULE...]``:

* always: a random float32 matrix (64 x 256, groups of 64 columns, lognormal column magnitudes as
  in real layers) is quantized, packed as the checkpoint stores it, unpacked and dequantized with
  compressed-tensors' ``calculate_qparams``, ``quantize``, ``pack_to_int32`` /
  ``unpack_from_int32`` and ``dequantize``, for: int4 symmetric group 64 (GPTQ layout), int4
  asymmetric group 64 with packed zero points (AWQ layout), int8 per-channel (W8A16 / W8A8), and
  GPTQ activation ordering in its two forms: ``weight`` / ``static`` (llm-compressor 0.14: columns
  quantized in a permuted order, each with the scale of its original group via ``g_idx``; no
  ``g_idx`` stored) and ``group`` (groups formed in the permuted order; the stored ``g_idx`` maps
  each original column to its group). Each activation-order case is repeated with a deliberately
  wrong (identity) ``g_idx``.
* with arguments: the stored int8 per-channel weights of MODULEs in checkpoint folder CKPT against
  the source model folder SOURCE.

Prints one JSON line: ``{"random": {case: {"max_ratio": max |W - dequant| / own scale, ...}},
"checkpoint": {module: {...}} or null}``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32
from compressed_tensors.quantization import QuantizationArgs
from compressed_tensors.quantization.lifecycle.forward import dequantize, quantize
from compressed_tensors.quantization.utils import calculate_qparams

ROWS, COLS, GROUP = 64, 256, 64


def group_args(bits: int, symmetric: bool) -> QuantizationArgs:
    return QuantizationArgs(num_bits=bits, type="int", symmetric=symmetric, strategy="group", group_size=GROUP)


def channel_args(bits: int, symmetric: bool = True) -> QuantizationArgs:
    return QuantizationArgs(num_bits=bits, type="int", symmetric=symmetric, strategy="channel")


def qparams(w: torch.Tensor, args: QuantizationArgs) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point from each group's (or row's) min and max: [rows, groups] or [rows, 1]."""
    if args.strategy == "group":
        g = w.unflatten(-1, (w.shape[-1] // GROUP, GROUP))
        return calculate_qparams(g.amin(-1), g.amax(-1), args)
    return calculate_qparams(w.amin(-1, keepdim=True), w.amax(-1, keepdim=True), args)


def stored(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Through the checkpoint's int32 packing and back (pack-quantized format)."""
    return unpack_from_int32(pack_to_int32(q.to(torch.int8), bits), bits, q.shape)


def report(w: torch.Tensor, deq: torch.Tensor, scale_per_element: torch.Tensor, q: torch.Tensor) -> dict[str, Any]:
    ratio = (w - deq).abs() / scale_per_element
    return {
        "max_ratio": ratio.max().item(),
        "frac_over_half": (ratio > 0.5 + 1e-4).float().mean().item(),
        "q_min": int(q.min()),
        "q_max": int(q.max()),
    }


def per_group(t: torch.Tensor) -> torch.Tensor:
    """[rows, groups] -> [rows, cols]: each element gets its contiguous group's value."""
    return t.repeat_interleave(GROUP, dim=1)


def grouped(w: torch.Tensor, bits: int, symmetric: bool) -> dict[str, Any]:
    args = group_args(bits, symmetric)
    scale, zp = qparams(w, args)
    q = stored(quantize(w, scale, zp, args, dtype=torch.int8), bits)
    if not symmetric:  # zero points are packed along the output dimension (compressed-tensors PACK_ZP_STRATS)
        zp = unpack_from_int32(pack_to_int32(zp.to(torch.int8), bits, packed_dim=0), bits, zp.shape, packed_dim=0)
    deq = dequantize(q, scale, zp, args, dtype=torch.float32)
    return report(w, deq, per_group(scale), q)


def per_channel(w: torch.Tensor, bits: int) -> dict[str, Any]:
    args = channel_args(bits)
    scale, zp = qparams(w, args)
    q = stored(quantize(w, scale, zp, args, dtype=torch.int8), bits)
    deq = dequantize(q, scale, zp, args, dtype=torch.float32)
    return report(w, deq, scale.expand_as(w), q)


def actorder_weight(w: torch.Tensor, perm: torch.Tensor, g_idx: torch.Tensor) -> dict[str, Any]:
    """llm-compressor 0.14 ``actorder: weight`` (alias ``static``): scales of the original groups;
    columns visited in ``perm`` order, permuted column j quantized with the scale of group
    ``g_idx[j]`` (correct: ``(arange // GROUP)[perm]``), as GPTQ's per-column loop does with
    channel args; then unpermuted, stored without g_idx and dequantized group-wise."""
    gargs = group_args(4, True)
    scale, zp = qparams(w, gargs)
    wp = w[:, perm]
    qp = torch.empty_like(wp, dtype=torch.int8)
    for j in range(COLS):
        g = int(g_idx[j])
        qp[:, j : j + 1] = quantize(
            wp[:, j : j + 1], scale[:, g : g + 1], zp[:, g : g + 1], channel_args(4), dtype=torch.int8
        )
    q = stored(qp[:, torch.argsort(perm)], 4)
    deq = dequantize(q, scale, zp, gargs, dtype=torch.float32)
    return report(w, deq, per_group(scale), q)


def actorder_group(w: torch.Tensor, perm: torch.Tensor, g_idx: torch.Tensor) -> dict[str, Any]:
    """GPTQ ``actorder: group``: groups are runs of GROUP columns in the permuted order; the stored
    ``g_idx[c]`` names the group of original column c (correct: ``argsort(perm) // GROUP``).
    Dequantized with the scale of group ``g_idx[c]``; judged against the scale of the true group."""
    gargs = group_args(4, True)
    wp = w[:, perm]
    scale, zp = qparams(wp, gargs)
    q = stored(quantize(wp, scale, zp, gargs, dtype=torch.int8)[:, torch.argsort(perm)], 4)
    idx = g_idx.long()
    deq = dequantize(q, scale[:, idx], zp[:, idx], channel_args(4), dtype=torch.float32)
    true_idx = (torch.argsort(perm) // GROUP).long()
    return report(w, deq, scale[:, true_idx], q)


def random_cases() -> dict[str, Any]:
    torch.manual_seed(0)
    # lognormal column magnitudes: groups differ in scale, as input channels of real layers do
    w = torch.randn(ROWS, COLS) * torch.randn(COLS).exp()
    # activation order: columns by descending "activation" (here: the column's own magnitude)
    perm = torch.argsort(w.abs().mean(0), descending=True)
    identity = torch.arange(COLS) // GROUP
    return {
        "int4_symmetric_g64": grouped(w, 4, True),
        "int4_asymmetric_g64": grouped(w, 4, False),
        "int8_channel": per_channel(w, 8),
        "actorder_weight": actorder_weight(w, perm, identity[perm]),
        "actorder_weight_wrong_g_idx": actorder_weight(w, perm, identity),
        "actorder_group": actorder_group(w, perm, torch.argsort(perm) // GROUP),
        "actorder_group_wrong_g_idx": actorder_group(w, perm, identity),
    }


def checkpoint_case(ckpt: str, source: str, modules: list[str]) -> dict[str, Any]:
    """Stored int8 per-channel weights (pack-quantized) against the bf16 source weights.

    ``ulp_bound``: the largest ``|W - dequant| / scale - u * |W / scale|`` with u = 2**-8, the unit
    roundoff of bfloat16 (8 significant bits): a quantizer that divides ``W / scale`` in bfloat16
    before rounding may land up to ``u * |W / scale|`` further away than half a step.
    """
    from safetensors import safe_open

    out: dict[str, Any] = {}
    with safe_open(f"{source}/model.safetensors", "pt") as src, safe_open(f"{ckpt}/model.safetensors", "pt") as f:
        for mod in modules:
            w = src.get_tensor(f"{mod}.weight").float()
            shape = f.get_tensor(f"{mod}.weight_shape")
            q = unpack_from_int32(f.get_tensor(f"{mod}.weight_packed"), 8, shape)
            scale = f.get_tensor(f"{mod}.weight_scale").float()
            deq = dequantize(q, scale, None, channel_args(8), dtype=torch.float32)
            rep = report(w, deq, scale.expand_as(w), q)
            excess = (w - deq).abs() / scale - 2.0**-8 * (w / scale).abs()
            rep["ulp_bound"] = excess.max().item()
            out[mod] = rep
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    print(
        json.dumps(
            {"random": random_cases(), "checkpoint": checkpoint_case(args[0], args[1], args[2:]) if args else None}
        )
    )
