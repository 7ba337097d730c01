"""Checkpoint memory accounting on small safetensors files written here with struct/json (no torch)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from quantverdict.stages.memory import (
    checkpoint_memory,
    expected_bits,
    expected_quantized_bytes,
    read_header,
)

DTYPE_BYTES = {"I64": 8, "I32": 4, "F32": 4, "BF16": 2, "F16": 2, "I8": 1, "F8_E4M3": 1}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes | None]]) -> None:
    """Write a safetensors file: 8-byte LE header length, JSON header, then the tensors' bytes.

    ``tensors``: name -> (dtype, shape, data or None for zeros).
    """
    header: dict = {"__metadata__": {"format": "pt"}}
    body = b""
    for name, (dtype, shape, data) in tensors.items():
        n = DTYPE_BYTES[dtype]
        for d in shape:
            n *= d
        blob = data if data is not None else bytes(n)
        assert len(blob) == n
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(body), len(body) + n]}
        body += blob
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the format pads the header to 8-byte alignment
    path.write_bytes(struct.pack("<Q", len(text)) + text + body)


DOWN = "model.layers.0.mlp.down_proj"
Q = "model.layers.0.self_attn.q_proj"
K = "model.layers.0.self_attn.k_proj"


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    # shard 1: an int4 packed asymmetric group-32 weight of shape [4, 64] plus kept 16-bit tensors
    write_safetensors(
        tmp_path / "model-00001-of-00002.safetensors",
        {
            f"{DOWN}.weight_packed": ("I32", [4, 8], None),  # 4 rows x (64 cols * 4 bit / 32) = 128 B
            f"{DOWN}.weight_scale": ("BF16", [4, 2], None),  # 64 / 32 = 2 groups per row: 16 B
            f"{DOWN}.weight_zero_point": ("I32", [1, 2], None),  # 4 rows packed in one int32: 8 B
            f"{DOWN}.weight_shape": ("I64", [2], struct.pack("<2q", 4, 64)),  # 16 B
            "model.embed_tokens.weight": ("BF16", [10, 8], None),  # 160 B
            "model.norm.weight": ("F32", [8], None),  # 32 B
        },
    )
    # shard 2: int8 per-channel weight [3, 16] and an fp8 weight [2, 8] with a static input scale
    write_safetensors(
        tmp_path / "model-00002-of-00002.safetensors",
        {
            f"{Q}.weight": ("I8", [3, 16], None),  # 48 B
            f"{Q}.weight_scale": ("BF16", [3, 1], None),  # 6 B
            f"{K}.weight": ("F8_E4M3", [2, 8], None),  # 16 B
            f"{K}.weight_scale": ("F32", [2, 1], None),  # 8 B
            f"{K}.input_scale": ("F32", [1], None),  # 4 B
        },
    )
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def test_read_header_skips_metadata(ckpt: Path) -> None:
    header = read_header(ckpt / "model-00002-of-00002.safetensors")
    assert "__metadata__" not in header
    assert header[f"{Q}.weight"] == {"dtype": "I8", "shape": [3, 16], "data_offsets": [0, 48]}


def test_totals_by_dtype(ckpt: Path) -> None:
    mem = checkpoint_memory(ckpt)
    # shard 1: 128 + 16 + 8 + 16 + 160 + 32 = 360; shard 2: 48 + 6 + 16 + 8 + 4 = 82; 360 + 82 = 442
    assert mem["total_weight_bytes"] == 442
    assert mem["weights_gib"] == pytest.approx(442 / 2**30)
    assert mem["num_tensors"] == 11
    assert mem["files"] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    # I32 128 + 8; BF16 16 + 160 + 6; I64 16; F32 32 + 8 + 4; I8 48; F8_E4M3 16
    assert mem["bytes_by_dtype"] == {"BF16": 182, "F32": 44, "F8_E4M3": 16, "I32": 136, "I64": 16, "I8": 48}


def test_roles(ckpt: Path) -> None:
    mem = checkpoint_memory(ckpt)
    assert mem["bytes_by_role"] == {
        "quantized_weights": 128 + 48 + 16,  # packed int4, int8, fp8 = 192
        "quant_params": 16 + 8 + 16 + 6 + 8 + 4,  # scales, zero point, weight_shape, input_scale = 58
        "kept_16bit": 160 + 32,  # embeddings + norm = 192
        "other": 0,
    }
    assert mem["quantized_modules"] == 3


def test_effective_bits(ckpt: Path) -> None:
    mem = checkpoint_memory(ckpt)
    # elements: 4*64 (from weight_shape, not the packed [4, 8]) + 3*16 + 2*8 = 256 + 48 + 16 = 320
    assert mem["quantized_weight_elements"] == 320
    assert mem["quantized_weight_bytes"] == 192
    # metadata: scales 16 + 6 + 8, zero point 8 = 38 (weight_shape and input_scale not counted)
    assert mem["quantized_metadata_bytes"] == 38
    # 8 * (192 + 38) / 320 = 1840 / 320 = 5.75
    assert mem["effective_bits_per_weight"] == pytest.approx(5.75)


def test_unquantized_checkpoint(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "model.safetensors", {"lm_head.weight": ("BF16", [4, 4], None)})
    mem = checkpoint_memory(tmp_path / "model.safetensors")  # a file path works too
    assert mem["total_weight_bytes"] == 32  # 16 elements * 2 B
    assert mem["bytes_by_role"]["kept_16bit"] == 32
    assert mem["quantized_modules"] == 0
    assert mem["effective_bits_per_weight"] is None


def test_packed_without_shape_is_an_error(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "model.safetensors", {"a.weight_packed": ("I32", [2, 2], None)})
    with pytest.raises(ValueError, match="a.weight_shape is missing"):
        checkpoint_memory(tmp_path)


def test_no_safetensors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        checkpoint_memory(tmp_path)


def test_truncated_header(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 100) + b"{}")
    with pytest.raises(ValueError, match="shorter"):
        checkpoint_memory(tmp_path)


def test_expected_quantized_bytes_w4a16_g64() -> None:
    # down_proj of SmolLM2: 576 x 1536 = 884,736 weights; 884,736 / 2 = 442,368 B of int4 values;
    # 884,736 / 64 = 13,824 groups * 2 B bf16 scale = 27,648 B -> 470,016 B
    assert expected_quantized_bytes(884_736, 4, 64, scale_bytes=2) == 470_016
    # asymmetric: + 13,824 int4 zero points * 0.5 B = 6,912 -> 476,928
    assert expected_quantized_bytes(884_736, 4, 64, scale_bytes=2, zero_point=True) == 476_928


def test_expected_bits() -> None:
    assert expected_bits(4, 64) == pytest.approx(4.25)  # 4 + 16/64
    assert expected_bits(4, 64, zero_point=True) == pytest.approx(4.3125)  # 4 + 16/64 + 4/64
    assert expected_bits(4, 128) == pytest.approx(4.125)  # 4 + 16/128
    assert expected_bits(8, 576) == pytest.approx(8 + 16 / 576)  # int8 per-channel, in_features 576
    assert expected_bits(8, 576, scale_bytes=4) == pytest.approx(8 + 32 / 576)  # fp32 scales


def test_expected_bytes_rejects_bad_group() -> None:
    with pytest.raises(ValueError, match="group_size=0"):
        expected_quantized_bytes(10, 4, 0)
