"""Checkpoint memory accounting on small safetensors files written here with struct/json (no torch)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from quantverdict.measure import memory
from quantverdict.measure.memory import (
    CheckpointSizeError,
    check_against_prediction,
    checkpoint_memory,
    expected_bits,
    expected_quantized_bytes,
    predicted_weight_bytes,
    read_header,
    tensor_bytes,
)

DTYPE_BYTES = {"I64": 8, "I32": 4, "F32": 4, "BF16": 2, "F16": 2, "I8": 1, "U8": 1, "F8_E4M3": 1}


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
    assert mem["quantized_weight_rows"] == 4 + 3 + 2  # output rows of DOWN [4, 64], Q [3, 16], K [2, 8]
    assert mem["g_idx_elements"] == 0
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


# --- size gate: measured quantized bytes against the scheme's prediction -----------------------------


def packed(module: str, rows: int, cols: int, bits: int) -> dict[str, tuple[str, list[int], bytes | None]]:
    """A pack-quantized weight: ``32 // bits`` values per int32 along each row, plus its weight_shape."""
    return {
        f"{module}.weight_packed": ("I32", [rows, cols * bits // 32], None),
        f"{module}.weight_shape": ("I64", [2], struct.pack("<2q", rows, cols)),
    }


def test_prediction_group_asymmetric_passes(tmp_path: Path) -> None:
    write_safetensors(
        tmp_path / "model.safetensors",
        {
            **packed(DOWN, 4, 64, 4),  # 4 x 8 int32 = 128 B
            f"{DOWN}.weight_scale": ("BF16", [4, 2], None),  # 64 / 32 = 2 groups per row: 16 B
            f"{DOWN}.weight_zero_point": ("I32", [1, 2], None),  # 4 rows packed in one int32: 8 B
            **packed(Q, 8, 64, 4),  # 8 x 8 int32 = 256 B
            f"{Q}.weight_scale": ("BF16", [8, 2], None),  # 32 B
            f"{Q}.weight_zero_point": ("I32", [1, 2], None),  # 8 rows in one int32: 8 B
        },
    )
    cmp = check_against_prediction(checkpoint_memory(tmp_path), 4, 32, False, scheme="W4A16")
    # n = 4*64 + 8*64 = 768 weights; values 768 * 4 / 8 = 384 B; 768 / 32 = 24 groups -> scales 24 * 2 = 48 B,
    # zero points 24 * 4 / 8 = 12 B; predicted 384 + 48 + 12 = 444 B = 8 * 444 / 768 = 4.625 bits/weight
    assert cmp["predicted_bytes"] == 444
    assert cmp["predicted_bits_per_weight"] == pytest.approx(4.625)
    # measured: 128 + 256 + 16 + 32 + 8 + 8 = 448 B (int32 zero points carry padding): 4 / 444 = +0.9%
    assert cmp["measured_bytes"] == 448
    assert cmp["relative_deviation"] == pytest.approx(4 / 444)
    assert cmp["ok"] is True


def test_prediction_per_channel_uses_rows(tmp_path: Path) -> None:
    write_safetensors(
        tmp_path / "model.safetensors",
        {
            f"{Q}.weight": ("I8", [3, 16], None),  # 48 B
            f"{Q}.weight_scale": ("BF16", [3, 1], None),  # 6 B
            f"{K}.weight": ("I8", [2, 8], None),  # 16 B
            f"{K}.weight_scale": ("BF16", [2, 1], None),  # 4 B
        },
    )
    cmp = check_against_prediction(checkpoint_memory(tmp_path), 8, None, True, scheme="W8A8")
    # n = 48 + 16 = 64; one scale per output row: 3 + 2 = 5 rows * 2 B = 10 B; 64 + 10 = 74 B, all stored
    assert cmp["predicted_bytes"] == 74
    assert cmp["measured_bytes"] == 74
    assert cmp["predicted_bits_per_weight"] == pytest.approx(9.25)  # 8 * 74 / 64
    assert cmp["relative_deviation"] == 0


def test_prediction_fp32_scales(tmp_path: Path) -> None:
    write_safetensors(
        tmp_path / "model.safetensors",
        {f"{K}.weight": ("F8_E4M3", [2, 8], None), f"{K}.weight_scale": ("F32", [2, 1], None)},  # 16 B + 8 B
    )
    mem = checkpoint_memory(tmp_path)
    # float32 scales: 16 + 2 rows * 4 B = 24 B, as stored
    assert check_against_prediction(mem, 8, None, True, scale_dtype="float32")["predicted_bytes"] == 24
    # assuming bf16 scales predicts 16 + 2 * 2 = 20 B: measured 24 is +20% -> fails
    with pytest.raises(CheckpointSizeError, match=r"\+20\.0%"):
        check_against_prediction(mem, 8, None, True, scale_dtype="bfloat16")


def test_prediction_counts_g_idx(tmp_path: Path) -> None:
    write_safetensors(
        tmp_path / "model.safetensors",
        {
            **packed(DOWN, 4, 64, 4),  # 128 B
            f"{DOWN}.weight_scale": ("BF16", [4, 2], None),  # 16 B
            f"{DOWN}.weight_g_idx": ("I32", [64], None),  # one int32 per input column: 256 B
        },
    )
    mem = checkpoint_memory(tmp_path)
    assert mem["g_idx_elements"] == 64
    cmp = check_against_prediction(mem, 4, 32, True, scheme="W4A16")
    # 256 weights * 4 / 8 = 128 B + 8 groups * 2 B = 16 B + 64 * 4 B g_idx = 256 B -> 400 B, as stored;
    # without the g_idx term the prediction would be 144 B and 400 B would be +178%
    assert cmp["predicted_bytes"] == 400
    assert cmp["measured_bytes"] == 400


def test_prediction_twice_too_large_fails(tmp_path: Path) -> None:
    # the scheme says W4A16 g64 symmetric, but the weights were stored as int8 (4 per int32)
    write_safetensors(
        tmp_path / "model.safetensors",
        {
            **packed(DOWN, 4, 128, 8),  # 4 x 32 int32 = 512 B
            f"{DOWN}.weight_scale": ("BF16", [4, 2], None),  # 16 B
        },
    )
    # predicted: 512 weights * 4 / 8 = 256 B + 512 / 64 = 8 groups * 2 B = 16 B -> 272 B (4.250 bits/weight);
    # measured 512 + 16 = 528 B (8 * 528 / 512 = 8.250 bits/weight); (528 - 272) / 272 = +94.1%
    with pytest.raises(CheckpointSizeError) as err:
        check_against_prediction(checkpoint_memory(tmp_path), 4, 64, True, scheme="W4A16")
    msg = str(err.value)
    assert "W4A16 (weight_bits=4, group_size=64, symmetric" in msg
    assert "predicted 272 B (4.250 bits/weight)" in msg
    assert "measured 528 B (8.250 bits/weight)" in msg
    assert "+94.1% (tolerance ±10%)" in msg
    assert err.value.comparison["ok"] is False
    assert isinstance(err.value, ValueError)


def test_prediction_no_quantized_module_fails(tmp_path: Path) -> None:
    write_safetensors(
        tmp_path / "model.safetensors",
        {f"{Q}.weight": ("BF16", [3, 16], None), "lm_head.weight": ("BF16", [4, 4], None)},
    )
    with pytest.raises(CheckpointSizeError, match="FP8_DYNAMIC .* has no quantized module"):
        check_against_prediction(checkpoint_memory(tmp_path), 8, None, True, scheme="FP8_DYNAMIC")


def test_prediction_rejects_bad_arguments(ckpt: Path) -> None:
    mem = checkpoint_memory(ckpt)
    with pytest.raises(ValueError, match="weight_bits=16"):
        check_against_prediction(mem, 16, None, True)
    with pytest.raises(ValueError, match="scale_dtype='int8'"):
        check_against_prediction(mem, 8, None, True, scale_dtype="int8")


def test_one_gib_and_one_dtype_table() -> None:
    assert memory.GIB == 1_073_741_824 and memory.MIB == 1_048_576
    assert memory.SCALE_DTYPE_BYTES == {"bfloat16": 2, "float16": 2, "float32": 4}
    # KV-cache and served dtypes of vLLM: fp8 variants 1 byte, half 2, float 4
    assert {memory.DTYPE_BYTES[d] for d in ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc")} == {1}
    assert memory.DTYPE_BYTES["half"] == 2 and memory.DTYPE_BYTES["float"] == 4


def test_tensor_bytes_by_hand(ckpt: Path) -> None:
    assert tensor_bytes({"dtype": "BF16", "shape": [4], "data_offsets": [12, 20]}) == 8
    # the fixture's byte counts: shard 1 128 + 16 + 8 + 16 + 160 + 32 = 360, shard 2 48 + 6 + 16 + 8 + 4 = 82
    shards = sorted(ckpt.glob("*.safetensors"))
    assert [sum(tensor_bytes(e) for e in read_header(f).values()) for f in shards] == [360, 82]


def test_predicted_weight_bytes_by_hand() -> None:
    # 1,000 parameters, 640 of them in quantized Linears, W4 g64 with 2-byte scales:
    # 640 * 4 / 8 = 320 B + 640 / 64 = 10 scales * 2 B = 20 B, and 360 16-bit weights * 2 B = 720 B -> 1,060
    assert predicted_weight_bytes(1000, 640, 4, 64, symmetric=True) == 1060
    assert predicted_weight_bytes(1000, 640, 4, 64, symmetric=False) == 1065  # + 10 zero points * 4 bits
    assert predicted_weight_bytes(1000) == 2000  # 16-bit: 2 B per parameter
    assert predicted_weight_bytes(1000, None, 4, 64) == 531.25  # all quantized: 500 + 1000 / 64 * 2
    assert predicted_weight_bytes(1000, 5000, 4, 64) == 531.25  # Linears capped at the parameter count
    with pytest.raises(ValueError, match="group_size"):
        predicted_weight_bytes(1000, 640, 4, None)
