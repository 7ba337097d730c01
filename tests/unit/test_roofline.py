"""Roofline efficiency at concurrency 1: bytes a decode step reads, the ideal time, and the c=1 TPOT
(values worked by hand on tiny fake safetensors files)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from quantverdict.measure import sweep
from quantverdict.measure.roofline import c1_tpot_ms, decode_read_bytes, efficiency

SIZES = {"BF16": 2, "F32": 4, "I32": 4, "F8_E4M3": 1}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A valid safetensors file (zeros) with tensors ``name -> (dtype, shape)``, laid out in order."""
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = SIZES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


# bytes of each tensor: BF16 [4, 8] = 4 * 8 * 2 = 64; I32 [4, 1] = 16; BF16 [4, 1] = 8; BF16 [8] = 16;
# BF16 [16, 8] = 256; BF16 [6, 8] = 96; BF16 [2, 8] = 32
LAYERS = {
    "model.layers.0.self_attn.q_proj.weight": ("BF16", [4, 8]),  # 64
    "model.layers.0.mlp.down_proj.weight_packed": ("I32", [4, 1]),  # 16
    "model.layers.0.mlp.down_proj.weight_scale": ("BF16", [4, 1]),  # 8
    "model.norm.weight": ("BF16", [8]),  # 16
}
EMBED = {"model.embed_tokens.weight": ("BF16", [16, 8])}  # 256
VISION = {
    "model.visual.blocks.0.attn.qkv.weight": ("BF16", [6, 8]),  # 96
    "mtp.fc.weight": ("BF16", [2, 8]),  # 32
}


def test_untied_embeddings_two_shards(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {**EMBED, **LAYERS})
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {**VISION, "lm_head.weight": ("BF16", [16, 8])})
    out = decode_read_bytes(tmp_path, tie_word_embeddings=False)
    # read: 64 + 16 + 8 + 16 + lm_head 256 = 360; embedding table (one row per token) 256 not read;
    # vision tower 96 + MTP head 32 = 128 skipped; total = 360 + 128 + 256 = 744
    assert out == {"decode_bytes": 360, "embedding_bytes": 256, "skipped_bytes": 128, "total_bytes": 744}


def test_tied_embeddings_count_the_table_once_as_the_lm_head(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "model.safetensors", {**EMBED, **LAYERS, **VISION})
    out = decode_read_bytes(tmp_path, tie_word_embeddings=True)
    # read: 64 + 16 + 8 + 16 + the tied table 256 = 360; total = every byte = 360 + 128 = 488
    assert out == {"decode_bytes": 360, "embedding_bytes": 256, "skipped_bytes": 128, "total_bytes": 488}
    # the same file read as untied: the table is not read at all (no lm_head in the file)
    assert decode_read_bytes(tmp_path)["decode_bytes"] == 104  # 64 + 16 + 8 + 16


def test_language_model_prefix_of_a_vlm_checkpoint(tmp_path: Path) -> None:
    # Qwen3.5 saves the text model under model.language_model.*: its embed_tokens is still the table
    write_safetensors(
        tmp_path / "model.safetensors",
        {
            "model.language_model.embed_tokens.weight": ("BF16", [16, 8]),
            "model.visual.merger.weight": ("BF16", [2, 8]),
            "model.language_model.layers.0.linear_attn.in_proj_qkv.weight": ("BF16", [4, 8]),
        },
    )
    out = decode_read_bytes(tmp_path)
    assert out == {"decode_bytes": 64, "embedding_bytes": 256, "skipped_bytes": 32, "total_bytes": 352}


def test_no_safetensors_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no .safetensors file"):
        decode_read_bytes(tmp_path)


def test_efficiency_hand_worked() -> None:
    # 16e9 bytes at 4.0e12 B/s = 4.0 ms ideal; measured TPOT 5.0 ms -> 4.0 / 5.0 = 0.8;
    # achieved 16e9 B / 0.005 s = 3.2e12 B/s
    out = efficiency(16e9, 4.0e12, 5.0)
    assert out["ideal_ms_per_token"] == pytest.approx(4.0)
    assert out["tpot_ms"] == 5.0
    assert out["efficiency"] == pytest.approx(0.8)
    assert out["achieved_bytes_per_s"] == pytest.approx(3.2e12)
    # a 4-bit checkpoint of 5e9 bytes: 1.25 ms ideal, TPOT 2.5 ms -> 0.5
    assert efficiency(5e9, 4.0e12, 2.5)["efficiency"] == pytest.approx(0.5)


@pytest.mark.parametrize("args", [(0, 4.0e12, 5.0), (16e9, 0, 5.0), (16e9, 4.0e12, 0), (16e9, 4.0e12, -1.0)])
def test_efficiency_rejects_non_positive(args: tuple[float, float, float]) -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        efficiency(*args)


def _pt(c: int, tpot: float, repeat: int = 0, valid: bool = True) -> dict:
    return {
        "concurrency": c,
        "offered_rate_rps": "inf",
        "repeat": repeat,
        "tpot_ms_p50": tpot,
        "valid": valid,
        "output_tokens_total": 128,
        "output_tokens_requested": 128,
        "completed": 1,
    }


def test_c1_tpot_from_the_summary() -> None:
    # c=1 repeats 5.4, 4.8, 5.0 -> median 5.0; the c=16 level (9.0) is not c=1
    points = [_pt(1, 5.4, 0), _pt(1, 4.8, 1), _pt(1, 5.0, 2), _pt(16, 9.0)]
    summary = sweep.summarize(points, "concurrency")
    assert c1_tpot_ms(summary, points) == pytest.approx(5.0)
    # an invalid repeat is left out of the summary: 5.4 and 4.8 -> (4.8 + 5.4) / 2 = 5.1
    points[2]["valid"] = False
    assert c1_tpot_ms(sweep.summarize(points, "concurrency"), points) == pytest.approx(5.1)


def test_c1_tpot_from_points_without_a_summary() -> None:
    # valid c=1 points 6.0 and 5.0 -> (5.0 + 6.0) / 2 = 5.5; the invalid 50.0 (wrong request count,
    # output tokens all there) is left out like everywhere else (validity.point_valid)
    points = [_pt(1, 6.0), _pt(1, 5.0, 1), {**_pt(1, 50.0, 2), "valid": False, "output_valid": True}, _pt(16, 9.0)]
    assert c1_tpot_ms([], points) == pytest.approx(5.5)


def test_c1_tpot_none_without_a_concurrency_1_load() -> None:
    points = [_pt(16, 9.0), {"concurrency": None, "offered_rate_rps": 1.0, "tpot_ms_p50": 4.0}]
    assert c1_tpot_ms(sweep.summarize(points, "concurrency"), points) is None
    assert c1_tpot_ms([], []) is None
