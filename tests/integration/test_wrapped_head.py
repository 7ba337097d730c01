"""A head under a wrapper stays 16-bit: a tiny random Llama-4-shaped model (``Llama4ForConditionalGeneration``:
the head is ``language_model.lm_head``, as in Llama-4 and other multimodal checkpoints) quantized to int8 by the
real quantize child (llm-compressor, compressed-tensors, CPU).

With the shipped scheme's ``scheme.ignore`` (``["lm_head"]``, resolved by
:func:`quantverdict.config.schemes.resolve_recipe`) the saved head is a plain bf16 ``weight``. With the plain
name handed to llm-compressor as it is (compressed-tensors then matches only a module named exactly
``lm_head``) the head is quantized, and the child fails naming it, leaving no checkpoint.

The model: 2 dense decoder layers (hidden 64), a 1-layer vision tower (hidden 32), SmolLM2's 49,152-token
vocabulary and tokenizer; 6.4 M parameters, most of them the embedding and the head (49,152 x 64 each).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from composed import load_scheme
from quantverdict.config.schemes import read_dims, resolve_recipe
from quantverdict.measure.memory import read_header
from quantverdict.processes.envs import StageEnv
from quantverdict.processes.runner import StageError, run_stage
from quantverdict.results.stage_results import MaterializeResult, QuantizeResult

pytestmark = pytest.mark.integration

HEAD = "language_model.lm_head"
WRAPPED = {
    "name": "tiny-wrapped-head",
    "source": "synthetic",
    "dtype": "bfloat16",
    "synthetic": {
        "architecture": "Llama4ForConditionalGeneration",
        "tokenizer_from": "smollm2-135m",
        "seed": 0,
        "config": {
            "model_type": "llama4",
            "tie_word_embeddings": False,
            "text_config": {
                "hidden_size": 64,
                "intermediate_size": 128,
                "intermediate_size_mlp": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "vocab_size": 49152,
                "moe_layers": [],  # dense feed-forward layers: plain Linear modules
                "max_position_embeddings": 2048,
                "attention_chunk_size": 2048,
            },
            "vision_config": {
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "image_size": 28,
                "patch_size": 14,
                "vision_output_dim": 64,
                "projector_input_dim": 64,
                "projector_output_dim": 64,
            },
        },
    },
}


@pytest.fixture(scope="module")
def wrapped_model(
    tmp_path_factory: pytest.TempPathFactory, stage_envs: dict[str, StageEnv], embedded_model: dict[str, Any]
) -> Path:
    root = tmp_path_factory.mktemp("wrapped")
    spec = {"model": WRAPPED, "out_dir": str(root / "model"), "tokenizer_path": embedded_model["path"]}
    result = run_stage(
        stage_envs["quantize"], "materialize", spec, root / "work", MaterializeResult, timeout_s=600
    ).model_dump()
    path = Path(result["path"])
    assert HEAD + ".weight" in read_header(next(path.glob("*.safetensors")))  # the head sits under the wrapper
    return path


def _quantize(env: StageEnv, model: Path, recipe: dict[str, Any], root: Path) -> dict[str, Any]:
    spec = {"model_path": str(model), "out_dir": str(root / "ckpt"), "recipe": recipe, "method": "rtn", "seed": 0}
    return run_stage(env, "quantize", spec, root / "work", QuantizeResult, timeout_s=600).model_dump()


def _tensors(ckpt: Path) -> dict[str, dict[str, Any]]:
    return {name: entry for f in ckpt.glob("*.safetensors") for name, entry in read_header(f).items()}


def test_the_wrapped_head_stays_16_bit(wrapped_model: Path, stage_envs: dict[str, StageEnv], tmp_path: Path) -> None:
    recipe = resolve_recipe(load_scheme("int8"), read_dims(wrapped_model))
    result = _quantize(stage_envs["quantize"], wrapped_model, recipe, tmp_path)
    ckpt = Path(result["path"])
    tensors = _tensors(ckpt)
    # the head: one plain bf16 weight of 49,152 x 64, no packed weight, no scale
    assert {n for n in tensors if n.startswith(HEAD + ".")} == {HEAD + ".weight"}
    assert (tensors[HEAD + ".weight"]["dtype"], tensors[HEAD + ".weight"]["shape"]) == ("BF16", [49152, 64])
    # the decoder's Linear layers were quantized (int8, pack-quantized: four to an int32)
    q = "language_model.model.layers.0.self_attn.q_proj"
    assert tensors[q + ".weight_packed"]["dtype"] == "I32" and q + ".weight_scale" in tensors
    assert result["kept_16bit"]["kept_16bit"] == [HEAD] and result["kept_16bit"]["quantized"] == []
    # the checkpoint's own ignore list (what vLLM reads) names the head
    config = json.loads((ckpt / "config.json").read_text())
    assert HEAD in config["quantization_config"]["ignore"]


def test_a_plain_name_reaching_llm_compressor_fails_naming_the_head(
    wrapped_model: Path, stage_envs: dict[str, StageEnv], tmp_path: Path
) -> None:
    recipe = resolve_recipe(load_scheme("int8"), read_dims(wrapped_model))
    recipe["quant_stage"]["quant_modifiers"]["QuantizationModifier"]["ignore"] = ["lm_head"]  # as written
    with pytest.raises(StageError) as err:
        _quantize(stage_envs["quantize"], wrapped_model, recipe, tmp_path)
    assert f"modules meant to stay 16-bit were quantized: {HEAD} " in str(err.value)
    assert not (tmp_path / "ckpt").exists() and not list(tmp_path.glob(".ckpt.tmp-*"))  # no checkpoint kept
