"""Checkpoint memory accounting from safetensors headers (standard library only).

A safetensors file starts with an 8-byte little-endian unsigned header length ``N``, then ``N``
bytes of JSON: ``{tensor_name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
{...}}`` with offsets in bytes relative to the end of the header
(https://github.com/huggingface/safetensors#format). Only the header is read, plus the few bytes of
each ``*.weight_shape`` tensor.

Tensor roles follow the compressed-tensors checkpoint layout that llm-compressor writes:

* ``quantized_weights``: ``<module>.weight_packed`` (int4 packed eight to an int32,
  ``pack-quantized``) and ``<module>.weight`` stored as int8 / uint8 / fp8 (``int-quantized``,
  ``float-quantized``, ``naive-quantized``).
* ``quant_params``: every other ``<module>.weight_*`` next to a quantized weight (``weight_scale``,
  ``weight_zero_point``, ``weight_g_idx``, ``weight_global_scale``, ``weight_shape``) and
  activation parameters (``input_scale``, ``input_zero_point``, ...).
* ``kept_16bit``: floating-point tensors left unquantized (embeddings, norms, ``lm_head``).
* ``other``: anything else (e.g. integer buffers).

Runs in the orchestrator; no torch.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

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
        ``weight_shape`` for packed weights, else the stored shape), ``quantized_weight_bytes``,
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

    def nbytes(entry: dict[str, Any]) -> int:
        begin, end = entry["data_offsets"]
        return int(end) - int(begin)

    quantized: dict[str, str] = {}  # module -> name of its quantized weight tensor
    for name, (_, entry) in entries.items():
        if name.endswith(".weight_packed") or (name.endswith(".weight") and entry["dtype"] in QUANT_STORAGE_DTYPES):
            quantized[_module_of(name)] = name

    by_dtype: dict[str, int] = {}
    by_role = {"quantized_weights": 0, "quant_params": 0, "kept_16bit": 0, "other": 0}
    q_elements = q_bytes = q_meta = 0
    for name, (f, entry) in entries.items():
        size = nbytes(entry)
        by_dtype[entry["dtype"]] = by_dtype.get(entry["dtype"], 0) + size
        module = _module_of(name)
        leaf = name[len(module) + 1 :] if module else name
        if module in quantized and quantized[module] == name:
            by_role["quantized_weights"] += size
            q_bytes += size
            if name.endswith(".weight_packed"):
                shape_name = f"{module}.weight_shape"
                if shape_name not in entries:
                    raise ValueError(f"{name} is packed but {shape_name} is missing; cannot count its elements")
                sf, sentry = entries[shape_name]
                q_elements += math.prod(_read_ints(sf, sentry))
            else:
                q_elements += math.prod(entry["shape"])
        elif module in quantized and leaf.startswith("weight_"):
            by_role["quant_params"] += size
            if leaf != "weight_shape":
                q_meta += size
        elif name.endswith(ACTIVATION_PARAM_SUFFIXES):
            by_role["quant_params"] += size
        elif entry["dtype"] in FLOAT_DTYPES:
            by_role["kept_16bit"] += size
        else:
            by_role["other"] += size

    total = sum(by_dtype.values())
    return {
        "total_weight_bytes": total,
        "weights_gib": total / 2**30,
        "bytes_by_dtype": dict(sorted(by_dtype.items())),
        "bytes_by_role": by_role,
        "num_tensors": len(entries),
        "quantized_modules": len(quantized),
        "quantized_weight_elements": q_elements,
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
