"""Test helpers: a Hugging Face hub cache filled by hand, in the layout huggingface_hub reads.

The layout (https://huggingface.co/docs/huggingface_hub/guides/manage-cache)::

    <cache>/models--ORG--NAME/blobs/<sha256 of the file>
    <cache>/models--ORG--NAME/snapshots/<commit>/<file>  ->  ../../blobs/<sha256>
    <cache>/models--ORG--NAME/refs/<branch or tag>       (text: the commit)

and a tiny transformers-format folder written without torch (config.json, one bf16 safetensors file,
tokenizer_config.json) for tests that do not load the weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from pathlib import Path

# a tiny Llama: vocab 32, hidden 8, one layer; the tensors below and their element counts
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 32,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
    "dtype": "bfloat16",
}
TINY_TENSORS = {  # name -> shape
    "model.embed_tokens.weight": [32, 8],  # 256
    "lm_head.weight": [32, 8],  # 256
    "model.norm.weight": [8],  # 8
}
TINY_PARAMETERS = 256 + 256 + 8


def write_safetensors(path: Path, tensors: dict[str, list[int]]) -> None:
    """A safetensors file of zero-filled bf16 tensors: 8-byte little-endian header length, the JSON header
    (``dtype``, ``shape``, ``data_offsets`` from the end of the header), then the data."""
    header, offset = {}, 0
    for name, shape in tensors.items():
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


def write_tiny_folder(folder: Path) -> Path:
    """:data:`TINY_CONFIG` as a transformers-format folder (config.json, model.safetensors,
    tokenizer_config.json); returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TINY_CONFIG, indent=2))
    write_safetensors(folder / "model.safetensors", TINY_TENSORS)
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
    return folder


def fill_hub_cache(cache_dir: Path, hf_id: str, folder: Path, commit: str, refs: tuple[str, ...] = ("main",)) -> Path:
    """Put the files of ``folder`` into ``cache_dir`` as huggingface_hub would have downloaded ``hf_id`` at
    ``commit`` (blobs named by their sha256, the snapshot's files relative symlinks to them, ``refs/<ref>``
    naming the commit); returns the snapshot folder."""
    repo = cache_dir / ("models--" + hf_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for f in sorted(p for p in folder.iterdir() if p.is_file()):
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        blob = repo / "blobs" / digest
        if not blob.exists():
            shutil.copyfile(f, blob)
        link = snapshot / f.name
        link.unlink(missing_ok=True)
        link.symlink_to(os.path.relpath(blob, snapshot))
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot
