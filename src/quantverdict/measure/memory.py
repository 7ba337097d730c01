"""The memory model: bytes of a checkpoint's tensors from its safetensors headers, and the bytes a scheme
predicts before quantizing (standard library only).

A safetensors file starts with an 8-byte little-endian unsigned header length ``N``, then ``N``
bytes of JSON: ``{tensor_name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
{...}}`` with offsets in bytes relative to the end of the header
(https://github.com/huggingface/safetensors#format). Only the header is read, plus the few bytes of
each ``*.weight_shape`` tensor.

Tensor roles follow the compressed-tensors checkpoint layout that llm-compressor writes:

* ``quantized_weights``: ``<module>.weight_packed`` (int4 packed eight to an int32,
  ``pack-quantized``; FP4 packed two to a uint8, ``nvfp4-pack-quantized``) and ``<module>.weight``
  stored as int8 / uint8 / fp8 (``int-quantized``, ``float-quantized``, ``naive-quantized``).
* ``quant_params``: every other ``<module>.weight_*`` next to a quantized weight (``weight_scale``,
  ``weight_zero_point``, ``weight_g_idx``, ``weight_global_scale``, ``weight_shape``) and
  activation parameters (``input_scale``, ``input_zero_point``, ...).
* ``kept_16bit``: floating-point tensors left unquantized (embeddings, norms, ``lm_head``).
* ``other``: anything else (e.g. integer buffers).

One table of bytes per element (:data:`DTYPE_BYTES`) and one GiB (:data:`GIB`) for every module that
turns dtypes and bytes into memory. Runs in the orchestrator and the review; no torch.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quantverdict.measure.points import CheckpointMemory, ModelDims

GIB = 2**30  # bytes in a GiB (binary, as vLLM logs it)
MIB = 2**20  # bytes in a MiB (nvidia-smi's memory.total unit)
# bytes per element of a model, scale or KV-cache dtype, by its torch / vLLM name (``--dtype``,
# ``--kv-cache-dtype``; fp8_inc: Intel Gaudi's FP8)
DTYPE_BYTES = {
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float32": 4,
    "float": 4,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
}
# the dtypes compressed-tensors stores weight scales in
SCALE_DTYPE_BYTES = {dtype: DTYPE_BYTES[dtype] for dtype in ("bfloat16", "float16", "float32")}
G_IDX_BYTES = 4  # weight_g_idx is int32, one entry per input column
# compressed-tensors' NVFP4PackedCompressor stores two FP4 (E2M1) values per uint8 and no weight_shape
FP4_PER_BYTE = 2
QUANT_STORAGE_DTYPES = {"I8", "U8", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "I4", "U4"}
FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}
ACTIVATION_PARAM_SUFFIXES = (
    ".input_scale",
    ".input_zero_point",
    ".input_global_scale",
    ".output_scale",
    ".output_zero_point",
    ".k_scale",
    ".v_scale",
)
_INT_FORMATS = {"I64": "<q", "I32": "<i", "U64": "<Q", "U32": "<I", "I16": "<h", "I8": "<b", "U8": "<B"}


def read_header(path: str | Path) -> dict[str, dict[str, Any]]:
    """The tensor entries of one safetensors file's header (``__metadata__`` left out).

    Returns:
        ``{name: {"dtype": str, "shape": list[int], "data_offsets": [begin, end]}}``; offsets in
        bytes from the end of the header.

    Raises:
        ValueError: the file is shorter than its declared header or the header is not JSON.
    """
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", raw)
        text = fh.read(n)
    if len(text) != n:
        raise ValueError(f"{path}: header declares {n} bytes but the file is shorter")
    header = json.loads(text)
    header.pop("__metadata__", None)
    return header


def tensor_bytes(entry: dict[str, Any]) -> int:
    """Data bytes of one tensor of a safetensors header (:func:`read_header`): ``end - begin`` of its
    ``data_offsets``."""
    begin, end = entry["data_offsets"]
    return int(end) - int(begin)


def _read_ints(path: Path, entry: dict[str, Any]) -> list[int]:
    """The values of a small integer tensor (e.g. ``weight_shape``), read from the file body."""
    fmt = _INT_FORMATS[entry["dtype"]]
    begin, end = entry["data_offsets"]
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        fh.seek(8 + n + begin)
        data = fh.read(end - begin)
    size = struct.calcsize(fmt)
    return [struct.unpack(fmt, data[i : i + size])[0] for i in range(0, len(data), size)]


def _module_of(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else ""


def checkpoint_memory(path: str | Path) -> dict[str, Any]:
    """Bytes of a checkpoint's tensors by storage dtype and role, and effective bits per weight.

    Args:
        path: a checkpoint folder (every ``*.safetensors`` in it is read, shards included) or a
            single ``.safetensors`` file.

    Returns:
        ``total_weight_bytes`` (int, sum of all tensors' data bytes; tied ``lm_head`` is not
        stored and not counted), ``weights_gib`` (float, the same in GiB), ``bytes_by_dtype``
        ({safetensors dtype: bytes}), ``bytes_by_role`` ({``quantized_weights``, ``quant_params``,
        ``kept_16bit``, ``other``: bytes}), ``num_tensors``, ``quantized_modules`` (modules with
        a quantized weight), ``quantized_weight_elements`` (original weight elements: product of
        ``weight_shape`` for packed weights, else the stored shape), ``quantized_weight_rows``
        (their output rows: the original shape without its last, ``in_features``, axis; one
        per-channel scale each), ``g_idx_elements`` (elements of the ``weight_g_idx`` tensors of
        activation-ordered GPTQ weights, one per input column), ``quantized_weight_bytes``,
        ``quantized_metadata_bytes`` (``weight_scale`` / ``weight_zero_point`` / ``weight_g_idx``
        / ``weight_global_scale`` of quantized modules; not ``weight_shape``),
        ``effective_bits_per_weight`` = 8 * (quantized_weight_bytes + quantized_metadata_bytes) /
        quantized_weight_elements (None without quantized weights), and ``files``.

    Raises:
        FileNotFoundError: no safetensors file at ``path``.
    """
    p = Path(path)
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
    if not files or not all(f.is_file() for f in files):
        raise FileNotFoundError(f"no .safetensors file at {p}")
    entries: dict[str, tuple[Path, dict[str, Any]]] = {}
    for f in files:
        for name, entry in read_header(f).items():
            entries[name] = (f, entry)

    quantized: dict[str, str] = {}  # module -> name of its quantized weight tensor
    for name, (_, entry) in entries.items():
        if name.endswith(".weight_packed") or (name.endswith(".weight") and entry["dtype"] in QUANT_STORAGE_DTYPES):
            quantized[_module_of(name)] = name

    by_dtype: dict[str, int] = {}
    by_role = {"quantized_weights": 0, "quant_params": 0, "kept_16bit": 0, "other": 0}
    q_elements = q_rows = q_bytes = q_meta = g_idx_elements = 0
    for name, (f, entry) in entries.items():
        size = tensor_bytes(entry)
        by_dtype[entry["dtype"]] = by_dtype.get(entry["dtype"], 0) + size
        module = _module_of(name)
        leaf = name[len(module) + 1 :] if module else name
        if module in quantized and quantized[module] == name:
            by_role["quantized_weights"] += size
            q_bytes += size
            if name.endswith(".weight_packed"):
                shape_name = f"{module}.weight_shape"
                if shape_name in entries:
                    sf, sentry = entries[shape_name]
                    shape = _read_ints(sf, sentry)
                elif entry["dtype"] == "U8":  # FP4 E2M1 two to a byte (nvfp4-pack-quantized): [out, in / 2]
                    shape = [*entry["shape"][:-1], entry["shape"][-1] * FP4_PER_BYTE]
                else:
                    raise ValueError(f"{name} is packed but {shape_name} is missing; cannot count its elements")
            else:
                shape = list(entry["shape"])
            q_elements += math.prod(shape)
            q_rows += math.prod(shape[:-1])  # output rows: [out, in] -> out
        elif module in quantized and leaf.startswith("weight_"):
            by_role["quant_params"] += size
            if leaf != "weight_shape":
                q_meta += size
            if leaf == "weight_g_idx":
                g_idx_elements += math.prod(entry["shape"])
        elif name.endswith(ACTIVATION_PARAM_SUFFIXES):
            by_role["quant_params"] += size
        elif entry["dtype"] in FLOAT_DTYPES:
            by_role["kept_16bit"] += size
        else:
            by_role["other"] += size

    total = sum(by_dtype.values())
    return {
        "total_weight_bytes": total,
        "weights_gib": total / GIB,
        "bytes_by_dtype": dict(sorted(by_dtype.items())),
        "bytes_by_role": by_role,
        "num_tensors": len(entries),
        "quantized_modules": len(quantized),
        "quantized_weight_elements": q_elements,
        "quantized_weight_rows": q_rows,
        "g_idx_elements": g_idx_elements,
        "quantized_weight_bytes": q_bytes,
        "quantized_metadata_bytes": q_meta,
        "effective_bits_per_weight": (8 * (q_bytes + q_meta) / q_elements) if q_elements else None,
        "files": [f.name for f in files],
    }


def expected_quantized_bytes(
    n_elements: int,
    bits: int,
    group_size: int,
    scale_bytes: int = 2,
    zero_point: bool = False,
    zero_point_bits: int | None = None,
) -> float:
    """Expected storage of quantized weights plus their scales and zero points, in bytes.

    Formula (compressed-tensors layout)::

        n_elements * bits / 8                                  # the quantized values
        + (n_elements / group_size) * scale_bytes              # one scale per group
        + (n_elements / group_size) * zero_point_bits / 8      # one zero point per group, if asymmetric

    ``group_size`` is the number of weights sharing one scale: the group size for ``strategy:
    group``, ``in_features`` for per-channel. ``zero_point_bits`` defaults to ``bits``
    (compressed-tensors packs int4 zero points eight to an int32 along the output dimension).
    E.g. W4A16 g64 with bf16 scales: 4 + 16/64 = 4.25 bits per weight; asymmetric:
    4 + 16/64 + 4/64 = 4.3125.

    Args:
        n_elements: number of original weight elements.
        bits: bits per quantized value (4 or 8).
        group_size: weights per scale (> 0).
        scale_bytes: bytes per scale (2 for bf16/fp16 scales, 4 for fp32).
        zero_point: whether a zero point is stored per group (asymmetric quantization).
        zero_point_bits: bits per stored zero point (default ``bits``).

    Raises:
        ValueError: ``group_size`` < 1.
    """
    if group_size < 1:
        raise ValueError(f"group_size={group_size} must be >= 1")
    groups = n_elements / group_size
    total = n_elements * bits / 8 + groups * scale_bytes
    if zero_point:
        total += groups * (zero_point_bits if zero_point_bits is not None else bits) / 8
    return total


def expected_bits(bits: int, group_size: int, scale_bytes: int = 2, zero_point: bool = False) -> float:
    """Expected effective bits per weight: ``8 * expected_quantized_bytes(n, ...) / n`` (independent of n)."""
    return 8 * expected_quantized_bytes(group_size, bits, group_size, scale_bytes, zero_point) / group_size


def count_parameters(model_dir: str | Path) -> int:
    """Elements of every floating-point tensor in ``model_dir``'s safetensors files (headers only).

    Raises:
        FileNotFoundError: no safetensors file in ``model_dir``.
    """
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors file in {model_dir}")
    return sum(math.prod(e["shape"]) for f in files for e in read_header(f).values() if e["dtype"] in FLOAT_DTYPES)


# model types whose full-attention q_proj also emits a per-head output gate (q and gate interleaved,
# 2 x heads x head_dim outputs; transformers' Qwen3_5Attention / Qwen3NextAttention)
GATED_ATTENTION_MODEL_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_next")


def linear_weight_elements(dims: ModelDims | Mapping[str, Any], model_type: str | None = None) -> int | None:
    """Weight elements of the Linear layers a scheme quantizes in a Llama-like decoder (``lm_head`` excluded).

    Per attention layer: ``q_proj`` hidden x (heads * head_dim) (twice that for the gated attention of
    :data:`GATED_ATTENTION_MODEL_TYPES`), ``k_proj`` and ``v_proj`` hidden x (kv_heads * head_dim)
    each, ``o_proj`` (heads * head_dim) x hidden; per layer, ``gate_proj``, ``up_proj`` and
    ``down_proj`` hidden x intermediate each. A hybrid model (``layer_types``) has attention
    projections only in its ``num_kv_layers`` full-attention layers; its linear-attention projections
    stay 16-bit (the quantize recipes ignore them), so they are not counted. E.g. SmolLM2-135M
    (576, 1536, 9 heads / 3 kv of 64, 30 layers): 30 x 3,538,944 = 106,168,320; Qwen3.5-9B (4096,
    12288, 16 heads / 4 kv of 256, 8 of 32 layers full attention): 8 x 58,720,256 + 32 x 150,994,944
    = 5,301,600,256, the quantized elements of the W4A16 checkpoint measured on the H200.

    Returns:
        The count, or None when ``dims`` lacks ``hidden_size``, ``intermediate_size``,
        ``num_attention_heads`` or ``num_hidden_layers``.
    """
    d = ModelDims.of(dims)
    hidden, inter, heads, layers = d.hidden_size, d.intermediate_size, d.num_attention_heads, d.num_hidden_layers
    if hidden is None or inter is None or heads is None or layers is None:
        return None
    kv = d.num_key_value_heads or heads
    head_dim = d.head_dim or hidden // heads
    q_out = heads * head_dim * (2 if model_type in GATED_ATTENTION_MODEL_TYPES else 1)
    attention = hidden * q_out + 2 * hidden * kv * head_dim + heads * head_dim * hidden
    attention_layers = d.num_kv_layers or layers  # materialize: all layers unless hybrid
    return attention_layers * attention + layers * 3 * hidden * inter


def predicted_weight_bytes(
    n_params: int,
    linear_elements: int | None = None,
    weight_bits: int = 16,
    group_size: int | None = None,
    symmetric: bool = True,
    scale_bytes: int = 2,
) -> float:
    """Bytes of a model's weights under a scheme, predicted from its 16-bit source before quantizing.

    Formula (compressed-tensors layout, lm_head and embeddings kept 16-bit)::

        P = n_params, L = min(linear_elements or P, P)
        16-bit:     2 * P
        quantized:  expected_quantized_bytes(L, weight_bits, group_size, scale_bytes,
                                             a zero point per group if not symmetric)
                    + 2 * (P - L)

    ``scale_bytes`` is 2 for bf16 scales, 1 for NVFP4's FP8 E4M3 group scales (NVFP4's 4-byte per-tensor
    global scales, one per module, are left out: a few KiB). FP8_BLOCK passes its block's 128 x 128 = 16,384
    weights as ``group_size``.

    Args:
        n_params: parameters of the model (all floating-point elements).
        linear_elements: Linear weight elements the scheme quantizes (:func:`linear_weight_elements`);
            None: all ``n_params``.
        weight_bits: bits per quantized weight; >= 16: nothing is quantized.
        group_size: weights per scale (per-channel: ``in_features``); needed when ``weight_bits < 16``.
        symmetric: no zero points stored.
        scale_bytes: bytes per scale (2: bf16; 1: FP8 E4M3, NVFP4).

    Returns:
        Predicted bytes (float).

    Raises:
        ValueError: ``weight_bits < 16`` without a ``group_size``.
    """
    half = float(DTYPE_BYTES["bfloat16"])
    if weight_bits >= 16:
        return half * n_params
    if group_size is None:
        raise ValueError(f"weight_bits={weight_bits} needs a group_size (weights per scale)")
    linear = min(linear_elements or n_params, n_params)
    quantized = expected_quantized_bytes(linear, weight_bits, group_size, scale_bytes, zero_point=not symmetric)
    return quantized + half * (n_params - linear)


class CheckpointSizeError(ValueError):
    """A quantized checkpoint's size is far from what its scheme predicts, or nothing in it is quantized.

    ``comparison`` holds the dict :func:`check_against_prediction` would have returned.
    """

    def __init__(self, message: str, comparison: dict[str, Any]):
        super().__init__(message)
        self.comparison = comparison


def check_against_prediction(
    memory: CheckpointMemory | Mapping[str, Any],
    weight_bits: int,
    group_size: int | None,
    symmetric: bool,
    *,
    scheme: str = "the scheme",
    scale_dtype: str = "bfloat16",
    tolerance: float = 0.10,
    scale_bytes: int | None = None,
    global_scale_bytes: int = 0,
) -> dict[str, Any]:
    """Compare a checkpoint's quantized bytes with what its scheme predicts; raise when far apart.

    Predicted bytes (compressed-tensors layout, the formula of :func:`expected_quantized_bytes`)
    for ``n`` quantized weight elements in ``rows`` output rows::

        groups = rows                  if group_size is None (per-channel: one scale per row)
               = n / group_size        otherwise
        n * weight_bits / 8                               # the quantized values
        + groups * scale_bytes                            # one scale per group
        + groups * weight_bits / 8    if not symmetric    # one zero point per group
        + g_idx_elements * 4                              # int32 weight_g_idx, if stored (GPTQ actorder)
        + quantized_modules * global_scale_bytes          # per-tensor global scales (NVFP4: float32, 4 B)

    Measured bytes: ``quantized_weight_bytes + quantized_metadata_bytes`` (``weight_shape`` is not
    counted). E.g. SmolLM2-135M W4A16 g64 symmetric: 106,168,320 weights -> 53,084,160 B of int4
    + 1,658,880 groups * 2 B = 56,401,920 B, 4.25 bits/weight. NVFP4 (compressed-tensors preset: FP4 E2M1
    values, one FP8 E4M3 scale per 16 weights, a float32 global scale per module; NVIDIA's NVFP4 layout):
    4 + 8/16 = 4.5 bits/weight plus 4 B per module. FP8_BLOCK (one bf16 scale per 128 x 128 block,
    DeepSeek-V3's layout): ``group_size`` 16,384, 8 + 16/16,384 bits/weight; edge blocks of a dimension that
    is not a multiple of 128 hold fewer weights, so the prediction is then a little low.

    Args:
        memory: :func:`checkpoint_memory` of the checkpoint, typed or as the dict it returns.
        weight_bits: ``scheme.weight_bits`` (1..8).
        group_size: the resolved group size; ``None`` for per-channel.
        symmetric: ``scheme.symmetric``; asymmetric schemes store a zero point per group.
        scheme: the scheme's name for messages (e.g. its label ``W4A16``).
        scale_dtype: dtype the scales are stored in (the checkpoint's saved dtype), one of
            :data:`SCALE_DTYPE_BYTES`.
        tolerance: largest allowed ``|measured - predicted| / predicted``.
        scale_bytes: bytes per scale where the format fixes them (NVFP4: 1, FP8 E4M3); None: ``scale_dtype``'s.
        global_scale_bytes: bytes of per-tensor scales stored once per quantized module (NVFP4: 4).

    Returns:
        ``{"scheme", "weight_bits", "group_size", "symmetric", "scale_bytes", "quantized_modules",
        "quantized_weight_elements", "predicted_bytes", "measured_bytes",
        "predicted_bits_per_weight", "measured_bits_per_weight", "relative_deviation",
        "tolerance", "ok": True}``; bytes as numbers, deviation as a fraction (0.01 = 1%).

    Raises:
        CheckpointSizeError: no module is quantized, or the relative deviation exceeds
            ``tolerance``; the message names the scheme, predicted and measured bytes and
            bits/weight, and the deviation.
        ValueError: ``weight_bits``, ``group_size``, ``scale_dtype`` or ``tolerance`` out of range.
    """
    if not 1 <= weight_bits <= 8:
        raise ValueError(f"weight_bits={weight_bits}: a quantizing scheme stores 1..8 bits per weight")
    if group_size is not None and group_size < 1:
        raise ValueError(f"group_size={group_size} must be >= 1 or None (per-channel)")
    if scale_dtype not in SCALE_DTYPE_BYTES:
        raise ValueError(f"scale_dtype={scale_dtype!r}; allowed: {sorted(SCALE_DTYPE_BYTES)}")
    if tolerance <= 0:
        raise ValueError(f"tolerance={tolerance} must be > 0")
    if scale_bytes is None:
        scale_bytes = SCALE_DTYPE_BYTES[scale_dtype]
    ck = memory if isinstance(memory, CheckpointMemory) else CheckpointMemory.model_validate(memory)
    n, modules = int(ck.quantized_weight_elements or 0), int(ck.quantized_modules or 0)
    layout = f"weight_bits={weight_bits}, group_size={group_size or 'channel'}, " + (
        "symmetric" if symmetric else "asymmetric"
    )
    comparison: dict[str, Any] = {
        "scheme": scheme,
        "weight_bits": weight_bits,
        "group_size": group_size,
        "symmetric": symmetric,
        "scale_bytes": scale_bytes,
        "quantized_modules": modules,
        "quantized_weight_elements": n,
        "tolerance": tolerance,
    }
    if modules == 0 or n == 0:
        comparison.update(ok=False, measured_bytes=0, predicted_bytes=None, relative_deviation=None)
        raise CheckpointSizeError(
            f"{scheme} ({layout}) should quantize weights, but the checkpoint has no quantized module "
            f"(no *.weight_packed and no int8/fp8 *.weight among its {ck.num_tensors or '?'} tensors "
            f"in {', '.join(ck.files or []) or '?'}); it looks unquantized",
            comparison,
        )
    groups = int(ck.quantized_weight_rows or 0) if group_size is None else n / group_size
    predicted = n * weight_bits / 8 + groups * scale_bytes
    if not symmetric:
        predicted += groups * weight_bits / 8
    predicted += G_IDX_BYTES * (ck.g_idx_elements or 0)
    predicted += global_scale_bytes * modules
    measured = int(ck.quantized_weight_bytes or 0) + int(ck.quantized_metadata_bytes or 0)
    deviation = (measured - predicted) / predicted
    comparison.update(
        predicted_bytes=predicted,
        measured_bytes=measured,
        predicted_bits_per_weight=8 * predicted / n,
        measured_bits_per_weight=8 * measured / n,
        relative_deviation=deviation,
        ok=abs(deviation) <= tolerance,
    )
    if not comparison["ok"]:
        raise CheckpointSizeError(
            f"checkpoint size does not match {scheme} ({layout}, {scale_dtype} scales): predicted "
            f"{predicted:,.0f} B ({8 * predicted / n:.3f} bits/weight) for {n:,} quantized weights in "
            f"{modules} modules, measured {measured:,} B ({8 * measured / n:.3f} "
            f"bits/weight), {deviation:+.1%} (tolerance ±{tolerance:.0%}); the checkpoint is not stored "
            "the way the scheme says, so its memory and speed would be reported under the wrong label",
            comparison,
        )
    return comparison
