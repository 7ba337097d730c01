"""Cheap integrity checks of model files, run before they are used (standard library only).

A cached checkpoint is reused only if every safetensors file is complete: its header parses and
the file is exactly ``8 + header_len + max(data end offset)`` bytes long (safetensors format,
https://github.com/huggingface/safetensors#format). A GGUF file must start with the magic ``GGUF``
(https://github.com/ggml-org/ggml/blob/master/docs/gguf.md).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path


class IntegrityError(ValueError):
    """A model file is truncated, corrupt or missing; the message says which and what to do."""


def check_safetensors(path: Path) -> None:
    """Raise IntegrityError unless ``path`` is a complete safetensors file."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise IntegrityError(f"{path}: {size} bytes, shorter than a safetensors header")
        (n,) = struct.unpack("<Q", raw)
        if 8 + n > size:
            raise IntegrityError(f"{path}: header declares {n} bytes but the file has {size}")
        try:
            header = json.loads(fh.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise IntegrityError(f"{path}: header is not valid JSON ({exc})") from None
    header.pop("__metadata__", None)
    end = max((e["data_offsets"][1] for e in header.values()), default=0)
    if size != 8 + n + end:
        raise IntegrityError(f"{path}: {size} bytes, but its header describes {8 + n + end} (truncated or padded)")


def check_checkpoint(folder: Path) -> None:
    """Raise IntegrityError unless ``folder`` holds config.json and complete safetensors files."""
    if not (folder / "config.json").is_file():
        raise IntegrityError(f"{folder}: no config.json")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise IntegrityError(f"{folder}: no .safetensors file")
    for f in files:
        check_safetensors(f)


def check_gguf(path: Path) -> None:
    """Raise IntegrityError unless ``path`` exists and starts with the GGUF magic."""
    if not path.is_file():
        raise IntegrityError(f"{path}: no such GGUF file (model.path)")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise IntegrityError(f"{path}: not a GGUF file (starts with {magic!r}, expected b'GGUF'); check model.path")
