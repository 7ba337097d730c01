"""Keep-16-bit patterns match a module wherever it sits, and a saved checkpoint is checked for modules they
mean that were quantized anyway (safetensors files written here with struct/json, no torch)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from composed import load_scheme
from quantverdict.config.schemes import resolve_recipe
from quantverdict.measure.keep16 import anywhere, check_kept, ignore_patterns
from test_memory import write_safetensors
from test_schemes import SMOLLM2

LM_HEADS = ["lm_head", "language_model.lm_head", "model.language_model.lm_head"]  # plain, Llama-4, deeper
NOT_HEADS = ["my_lm_head", "lm_head.proj", "model.layers.0.mlp.down_proj"]


def compressed_tensors_ignores(name: str, patterns: list[str]) -> bool:
    """compressed-tensors 0.19 ``match_name``, by name: ``re:`` -> ``re.match`` (anchored at the start), else
    the pattern must equal the module's full name."""
    return any(re.match(p[3:], name) if p.startswith("re:") else p == name for p in patterns)


@pytest.mark.parametrize("scheme", ["gptq", "awq", "int8", "fp8", "w8a8"])
def test_the_shipped_schemes_keep_a_wrapped_lm_head_16_bit(scheme: str) -> None:
    patterns = ignore_patterns(resolve_recipe(load_scheme(scheme), SMOLLM2))
    assert patterns  # scheme.ignore reached the recipe
    for name in LM_HEADS:
        assert compressed_tensors_ignores(name, patterns), (name, patterns)
    for name in NOT_HEADS:
        assert not compressed_tensors_ignores(name, patterns), (name, patterns)


def test_model_patterns_keep_their_meaning() -> None:
    # Qwen3.5's model.quantize_ignore: regexes as written; a dotted path is matched at any depth, dots literal
    qwen = ["re:.*linear_attn.*", "re:.*visual.*", "re:.*embed_tokens$"]
    got = ignore_patterns(resolve_recipe(load_scheme("gptq"), SMOLLM2, extra_ignore=[*qwen, "model.embed_tokens"]))
    assert got == [anywhere("lm_head"), *qwen, anywhere("model.embed_tokens")]
    assert compressed_tensors_ignores("language_model.model.embed_tokens", [anywhere("model.embed_tokens")])
    assert not compressed_tensors_ignores("language_model.modelXembed_tokens", [anywhere("model.embed_tokens")])
    assert anywhere("Linear") == "Linear"  # a class name: compressed-tensors matches it against module classes


def _head(module: str, kind: str) -> dict:
    """The tensors of a 16 x 32 Linear as llm-compressor saves it: kept (bf16), int4 packed, int8 or fp8."""
    if kind == "bf16":
        return {f"{module}.weight": ("BF16", [16, 32], None)}
    if kind == "int4":
        return {
            f"{module}.weight_packed": ("I32", [16, 4], None),
            f"{module}.weight_scale": ("BF16", [16, 1], None),
            f"{module}.weight_shape": ("I64", [2], None),
        }
    dtype = {"int8": "I8", "fp8": "F8_E4M3"}[kind]
    return {f"{module}.weight": (dtype, [16, 32], None), f"{module}.weight_scale": ("BF16", [16, 1], None)}


def test_a_quantized_wrapped_head_is_named(tmp_path: Path) -> None:
    write_safetensors(
        tmp_path / "model-00001-of-00002.safetensors",
        {**_head("language_model.model.layers.0.mlp.down_proj", "int4"), **_head("language_model.lm_head", "int4")},
    )
    write_safetensors(
        tmp_path / "model-00002-of-00002.safetensors",
        {**_head("language_model.model.embed_tokens", "bf16"), **_head("vision_model.proj", "fp8")},
    )
    # the plain name that reached llm-compressor still means the wrapped head
    got = check_kept(tmp_path, ["lm_head", "re:.*embed_tokens$", "re:.*visual.*"])
    assert got["quantized"] == ["language_model.lm_head"]
    assert got["kept_16bit"] == ["language_model.model.embed_tokens"]
    # a vision projection no pattern names may be quantized
    assert check_kept(tmp_path, ["re:.*vision.*"])["quantized"] == ["vision_model.proj"]


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_8_bit_heads_are_quantized_heads(tmp_path: Path, kind: str) -> None:
    write_safetensors(tmp_path / "model.safetensors", _head("lm_head", kind))
    assert check_kept(tmp_path, [anywhere("lm_head")])["quantized"] == ["lm_head"]


def test_a_kept_head_passes(tmp_path: Path) -> None:
    write_safetensors(
        tmp_path / "model.safetensors",
        {**_head("language_model.lm_head", "bf16"), **_head("language_model.model.layers.0.mlp.up_proj", "int4")},
    )
    got = check_kept(tmp_path, [anywhere("lm_head")])
    assert got == {"patterns": [anywhere("lm_head")], "kept_16bit": ["language_model.lm_head"], "quantized": []}


def test_no_checkpoint_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        check_kept(tmp_path, ["lm_head"])
