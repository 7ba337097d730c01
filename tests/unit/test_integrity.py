"""Truncated or corrupt model files are caught before use."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from quantverdict.measure.integrity import IntegrityError, check_checkpoint, check_gguf, check_safetensors


def write_safetensors(path: Path, nbytes: int = 12) -> None:
    # one F32 tensor of 3 elements = 12 bytes of data
    header = json.dumps({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, nbytes]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * nbytes)


def test_complete_file_passes_and_one_byte_more_or_less_fails(tmp_path: Path) -> None:
    # shard 1: metadata and two F32 tensors listed out of order, "b" [2] at bytes 12..20 after "a" [3] at
    # 0..12: the data ends at byte 20 (the largest end offset, not the last one listed)
    header = json.dumps(
        {
            "__metadata__": {"format": "pt"},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]},
            "a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
        }
    ).encode()
    shard = tmp_path / "model-00001-of-00002.safetensors"
    complete = struct.pack("<Q", len(header)) + header + b"\0" * 20
    size = 8 + len(header) + 20
    shard.write_bytes(complete)
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors")  # shard 2: complete, 12 bytes of data
    (tmp_path / "config.json").write_text("{}")
    check_checkpoint(tmp_path)  # complete: raises nothing
    shard.write_bytes(complete + b"\0")
    wrong = rf"00001-of-00002.safetensors: {size + 1} bytes, but its header describes {size} "
    with pytest.raises(IntegrityError, match=wrong):
        check_checkpoint(tmp_path)
    shard.write_bytes(complete[:-1])
    wrong = rf"00001-of-00002.safetensors: {size - 1} bytes, but its header describes {size} "
    with pytest.raises(IntegrityError, match=wrong):
        check_checkpoint(tmp_path)
    # a complete first shard does not hide a truncated second one
    shard.write_bytes(complete)
    second = tmp_path / "model-00002-of-00002.safetensors"
    second.write_bytes(second.read_bytes()[:-4])
    with pytest.raises(IntegrityError, match="model-00002-of-00002.safetensors: .* bytes, but its header describes"):
        check_checkpoint(tmp_path)


def test_truncated_file_fails(tmp_path: Path) -> None:
    f = tmp_path / "model.safetensors"
    write_safetensors(f)
    data = f.read_bytes()
    f.write_bytes(data[:-5])  # 5 bytes of tensor data cut off
    with pytest.raises(IntegrityError, match="truncated"):
        check_safetensors(f)
    f.write_bytes(data[:20])  # cut inside the header
    with pytest.raises(IntegrityError, match="header declares"):
        check_safetensors(f)


def test_missing_config_fails(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "model.safetensors")
    with pytest.raises(IntegrityError, match="no config.json"):
        check_checkpoint(tmp_path)


def test_gguf_magic(tmp_path: Path) -> None:
    good, bad = tmp_path / "m.gguf", tmp_path / "x.gguf"
    good.write_bytes(b"GGUF" + b"\0" * 8)
    bad.write_bytes(b"<html>")
    check_gguf(good)
    with pytest.raises(IntegrityError, match="not a GGUF file"):
        check_gguf(bad)
    with pytest.raises(IntegrityError, match="no such GGUF file"):
        check_gguf(tmp_path / "missing.gguf")
