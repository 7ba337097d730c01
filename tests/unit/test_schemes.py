"""Scheme registry: group-size derivation, recipe resolution and the checkpoint key (values by hand)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from composed import load_scheme
from quantverdict.config.compose import compose
from quantverdict.config.schema import ConfigError, SchemeConfig
from quantverdict.config.schemes import (
    checkpoint_key,
    data_free_equivalent,
    derive_group_size,
    quantized_in_features,
    read_dims,
    resolve_recipe,
)

CONF = Path(__file__).resolve().parents[2] / "conf" / "scheme"
SMOLLM2 = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "num_hidden_layers": 30,
}


# --- quantized_in_features ---------------------------------------------------------------------


def test_in_features_smollm2() -> None:
    # q/k/v/gate/up read hidden 576; o_proj reads 9 heads x 64 = 576; down_proj reads 1536
    assert quantized_in_features(SMOLLM2) == [576, 1536]


def test_in_features_head_dim_defaults_and_differs() -> None:
    # no head_dim: 4096 / 32 = 128 -> o_proj in = 32 * 128 = 4096; Llama-2-7B: [4096, 11008]
    assert quantized_in_features({"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32}) == [
        4096,
        11008,
    ]
    # explicit head_dim different from hidden/heads (Qwen3-like): o_proj in = 16 * 128 = 2048
    dims = {"hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16, "head_dim": 128}
    assert quantized_in_features(dims) == [1024, 2048, 3072]


def test_in_features_missing_key() -> None:
    with pytest.raises(ConfigError, match="intermediate_size"):
        quantized_in_features({"hidden_size": 576, "num_attention_heads": 9})


# --- derive_group_size -------------------------------------------------------------------------


def test_auto_smollm2_is_64() -> None:
    # 576 % 128 = 64 (128 fails), 576 % 64 = 0 and 1536 % 64 = 0 -> 64
    assert derive_group_size("auto", [128, 64, 32], [576, 1536]) == 64


def test_auto_takes_largest_regardless_of_order() -> None:
    # 4096 and 11008: 11008 = 86 * 128 -> 128 divides both
    assert derive_group_size("auto", [32, 128, 64], [4096, 11008]) == 128


def test_auto_no_candidate_divides() -> None:
    # 100 % 32 = 4, 100 % 64 = 36, 100 % 128 = 100 -> none
    with pytest.raises(ConfigError, match=r"scheme.group_size='auto'.*\[128, 64, 32\]"):
        derive_group_size("auto", [128, 64, 32], [576, 100])


def test_channel_is_none() -> None:
    assert derive_group_size("channel", [128, 64, 32], [576, 1536]) is None


def test_integer_that_divides() -> None:
    # 576 / 32 = 18, 1536 / 32 = 48
    assert derive_group_size("32", [128, 64, 32], [576, 1536]) == 32


def test_integer_that_does_not_divide_names_key_value_dim_candidates() -> None:
    # 576 % 128 = 64 -> error names scheme.group_size, 128, the dimension 576 and the candidates
    with pytest.raises(ConfigError) as err:
        derive_group_size("128", [128, 64, 32], [576, 1536])
    msg = str(err.value)
    assert "scheme.group_size=128" in msg
    assert "576" in msg
    assert "[128, 64, 32]" in msg
    assert "[64, 32]" in msg  # the candidates that would fit


def test_garbage_value() -> None:
    with pytest.raises(ConfigError, match="scheme.group_size='big'"):
        derive_group_size("big", [128], [576])


# --- resolve_recipe ----------------------------------------------------------------------------


def _group_recipe() -> dict:
    return {
        "quant_stage": {
            "quant_modifiers": {
                "GPTQModifier": {
                    "ignore": ["lm_head"],
                    "config_groups": {
                        "group_0": {
                            "targets": ["Linear"],
                            "weights": {"num_bits": 4, "strategy": "group", "group_size": "auto"},
                        }
                    },
                }
            }
        }
    }


def _w4(group_size: str = "auto", recipe: dict | None = None) -> SchemeConfig:
    """A 4-bit symmetric scheme around ``recipe`` (default: the group-wise GPTQ recipe above)."""
    return SchemeConfig(
        name="gptq",
        label="W4A16",
        method="gptq",
        weight_bits=4,
        group_size=group_size,
        recipe=recipe if recipe is not None else _group_recipe(),
    )


def _weights(recipe: dict) -> dict:
    return recipe["quant_stage"]["quant_modifiers"]["GPTQModifier"]["config_groups"]["group_0"]["weights"]


def test_resolve_rejects_recipe_that_contradicts_the_scheme() -> None:
    # _group_recipe() has num_bits 4; the scheme says 8 bits, asymmetric (recipe: no `symmetric` key)
    scheme = SchemeConfig(name="x", label="W8A16", method="gptq", weight_bits=8, recipe=_group_recipe())
    with pytest.raises(ConfigError, match=r"num_bits=4 but scheme.weight_bits=8"):
        resolve_recipe(scheme, SMOLLM2)
    recipe = _group_recipe()
    _weights(recipe)["symmetric"] = True
    scheme = SchemeConfig(name="x", label="W4A16", method="gptq", weight_bits=4, symmetric=False, recipe=recipe)
    with pytest.raises(ConfigError, match=r"symmetric=True but scheme.symmetric=False"):
        resolve_recipe(scheme, SMOLLM2)


def test_resolve_auto_fills_64_and_leaves_the_scheme_untouched() -> None:
    scheme = _w4()
    out = resolve_recipe(scheme, SMOLLM2)
    assert _weights(out) == {"num_bits": 4, "strategy": "group", "group_size": 64}
    assert _weights(scheme.recipe)["group_size"] == "auto"  # deep copy


def test_resolve_integer_override() -> None:
    scheme = _w4("32")
    assert _weights(resolve_recipe(scheme, SMOLLM2))["group_size"] == 32


def test_resolve_integer_override_that_does_not_fit() -> None:
    scheme = _w4("128")
    with pytest.raises(ConfigError, match="scheme.group_size=128"):
        resolve_recipe(scheme, SMOLLM2)


def test_resolve_channel_override_turns_group_into_channel() -> None:
    scheme = _w4("channel")
    assert _weights(resolve_recipe(scheme, SMOLLM2)) == {"num_bits": 4, "strategy": "channel", "group_size": None}


def test_resolve_strategy_channel_gets_no_group_size() -> None:
    recipe = _group_recipe()
    _weights(recipe).update(strategy="channel", group_size="auto")
    scheme = SchemeConfig(name="x", label="W4A16", method="rtn", weight_bits=4, recipe=recipe)
    assert _weights(resolve_recipe(scheme, SMOLLM2))["group_size"] is None


def test_resolve_empty_recipe() -> None:
    assert resolve_recipe(SchemeConfig(name="bf16", label="BF16", method="none", group_size="channel"), SMOLLM2) == {}


@pytest.mark.parametrize(
    ("name", "modifiers"),
    [
        ("awq", ["AWQModifier", "QuantizationModifier"]),
        ("gptq", ["GPTQModifier"]),
        ("int8", ["QuantizationModifier"]),
        ("fp8", ["QuantizationModifier"]),
        ("w8a8", ["SmoothQuantModifier", "GPTQModifier"]),
    ],
)
def test_shipped_schemes_resolve_for_smollm2(name: str, modifiers: list[str]) -> None:
    out = resolve_recipe(load_scheme(name), SMOLLM2)
    mods = out["quant_stage"]["quant_modifiers"]
    assert list(mods) == modifiers  # order matters: AWQ / SmoothQuant before the quantizer
    assert "auto" not in json.dumps(out)
    # lm_head stays 16-bit wherever it sits; AWQModifier takes no `ignore` in llm-compressor 0.14.0.1
    quantizer = mods[modifiers[-1]]
    assert quantizer["ignore"] == ["re:(?:.*\\.)?lm_head$"]
    assert "ignore" not in mods.get("AWQModifier", {})
    if name in ("awq", "gptq"):
        weights = quantizer["config_groups"]["group_0"]["weights"]
        assert (weights["num_bits"], weights["strategy"], weights["group_size"]) == (4, "group", 64)
        assert weights["symmetric"] is (name == "gptq")
    if name == "awq":
        assert mods["AWQModifier"]["n_grid"] < 20  # coarser than the default grid (CPU time)


def test_read_dims(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**SMOLLM2, "vocab_size": 49152, "model_type": "llama"}))
    dims = read_dims(tmp_path)
    assert dims["hidden_size"] == 576 and dims["vocab_size"] == 49152 and "model_type" not in dims


# --- checkpoint_key ----------------------------------------------------------------------------


def test_checkpoint_key_is_sha256_of_canonical_json() -> None:
    key = checkpoint_key("m", "gptq", {"b": 1, "a": [1, 2]}, {"n": 16}, {"torch": "2.13.0"})
    canonical = (
        '{"calibration":{"n":16},"model":"m","recipe":{"a":[1,2],"b":1},"scheme":"gptq","versions":{"torch":"2.13.0"}}'
    )
    assert key == hashlib.sha256(canonical.encode()).hexdigest()[:16]
    assert len(key) == 16


def test_checkpoint_key_ignores_order_but_not_values() -> None:
    base = checkpoint_key("m", "gptq", {"a": 1, "b": 2}, {"n": 16, "s": 128}, {"t": "1"})
    assert base == checkpoint_key("m", "gptq", {"b": 2, "a": 1}, {"s": 128, "n": 16}, {"t": "1"})
    assert base != checkpoint_key("m", "gptq", {"a": 1, "b": 2}, {"n": 64, "s": 128}, {"t": "1"})
    assert base != checkpoint_key("m", "gptq", {"a": 1, "b": 2}, {"n": 16, "s": 128}, {"t": "2"})
    assert base != checkpoint_key("m", "awq", {"a": 1, "b": 2}, {"n": 16, "s": 128}, {"t": "1"})


# --- data_free_equivalent (synthetic models: same checkpoint format by round-to-nearest) ---------------


def test_data_free_gptq_is_a_quantization_modifier_without_hessian_args() -> None:
    recipe = resolve_recipe(load_scheme("gptq"), SMOLLM2)
    out = data_free_equivalent(recipe)
    # conf/scheme/gptq.yaml minus dampening_frac (modifier) and actorder (weights); group_size auto -> 64
    assert out == {
        "quant_stage": {
            "quant_modifiers": {
                "QuantizationModifier": {
                    "ignore": ["re:(?:.*\\.)?lm_head$"],
                    "config_groups": {
                        "group_0": {
                            "targets": ["Linear"],
                            "weights": {
                                "num_bits": 4,
                                "type": "int",
                                "symmetric": True,
                                "strategy": "group",
                                "group_size": 64,
                            },
                        }
                    },
                }
            }
        }
    }
    # the input is left as it was
    gptq = recipe["quant_stage"]["quant_modifiers"]["GPTQModifier"]
    assert gptq["dampening_frac"] == 0.01 and gptq["config_groups"]["group_0"]["weights"]["actorder"] == "static"


def test_data_free_awq_drops_the_awq_rescaling_keeps_the_quantizer() -> None:
    recipe = resolve_recipe(load_scheme("awq"), SMOLLM2)
    out = data_free_equivalent(recipe)
    mods = out["quant_stage"]["quant_modifiers"]
    assert list(mods) == ["QuantizationModifier"]
    assert mods["QuantizationModifier"] == recipe["quant_stage"]["quant_modifiers"]["QuantizationModifier"]
    weights = mods["QuantizationModifier"]["config_groups"]["group_0"]["weights"]
    assert (weights["num_bits"], weights["symmetric"], weights["group_size"]) == (4, False, 64)


def test_data_free_w8a8_drops_smoothquant_and_keeps_the_preset_scheme() -> None:
    out = data_free_equivalent(resolve_recipe(load_scheme("w8a8"), SMOLLM2))
    # conf/scheme/w8a8.yaml: SmoothQuantModifier dropped; GPTQModifier(ignore, targets, scheme W8A8,
    # dampening_frac) -> QuantizationModifier(ignore, targets, scheme W8A8)
    assert out == {
        "quant_stage": {
            "quant_modifiers": {
                "QuantizationModifier": {"ignore": ["re:(?:.*\\.)?lm_head$"], "targets": ["Linear"], "scheme": "W8A8"}
            }
        }
    }


@pytest.mark.parametrize("name", ["int8", "fp8"])
def test_data_free_leaves_data_free_recipes_alone(name: str) -> None:
    recipe = resolve_recipe(load_scheme(name), SMOLLM2)
    assert data_free_equivalent(recipe) == recipe


def test_resolve_extra_ignore_appends_to_every_ignore_list() -> None:
    recipe = {
        "stage_a": {"mods": {"QuantizationModifier": {"ignore": ["lm_head"], "targets": ["Linear"], "scheme": "W8A8"}}},
        "stage_b": {
            "mods": {
                "AWQModifier": {"n_grid": 10},  # no ignore list: none is added
                "GPTQModifier": {"ignore": ["lm_head", "re:.*visual.*"], "targets": ["Linear"], "scheme": "W8A8"},
            }
        },
    }
    scheme = SchemeConfig(
        name="x", label="W8A8", method="gptq", weight_bits=8, activation_bits=8, group_size="channel", recipe=recipe
    )
    extra = ["re:.*linear_attn.*", "re:.*visual.*"]
    out = resolve_recipe(scheme, SMOLLM2, extra_ignore=extra)
    head = "re:(?:.*\\.)?lm_head$"  # the plain name in its match-anywhere form; regexes as written
    assert out["stage_a"]["mods"]["QuantizationModifier"]["ignore"] == [head, "re:.*linear_attn.*", "re:.*visual.*"]
    # already-present patterns are not repeated
    assert out["stage_b"]["mods"]["GPTQModifier"]["ignore"] == [head, "re:.*visual.*", "re:.*linear_attn.*"]
    assert "ignore" not in out["stage_b"]["mods"]["AWQModifier"]
    assert recipe["stage_a"]["mods"]["QuantizationModifier"]["ignore"] == ["lm_head"]  # the scheme is untouched
    # the shipped gptq scheme with Qwen3.5's model.quantize_ignore
    qwen = ["re:.*linear_attn.*", "re:.*visual.*", "re:.*embed_tokens$"]
    got = resolve_recipe(load_scheme("gptq"), SMOLLM2, extra_ignore=qwen)
    assert got["quant_stage"]["quant_modifiers"]["GPTQModifier"]["ignore"] == [head, *qwen]


# --- fields the scheme's format fixes ---------------------------------------------------------------


def _config_error(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        compose(list(overrides))
    return str(err.value)


def test_bits_the_label_fixes_are_refused_before_any_work() -> None:
    # BF16 is 16-bit weights and activations; W4A16 (awq) fixes 4-bit weights, and its recipe says 4 too
    assert "scheme.weight_bits=3 does not fit scheme.label=BF16, which fixes it; allowed: 16" in _config_error(
        "scheme.weight_bits=3"
    )
    msg = _config_error("scheme=awq", "scheme.weight_bits=3")
    assert "scheme.weight_bits=3 does not fit scheme.label=W4A16, which fixes it; allowed: 4" in msg
    assert "recipe weights num_bits=4 but scheme.weight_bits=3" in msg
    assert "scheme.activation_bits=8 does not fit scheme.label=W8A16, which fixes it; allowed: 16" in _config_error(
        "scheme=int8", "scheme.activation_bits=8"
    )


def test_unknown_label_names_the_allowed_ones_and_the_closest() -> None:
    msg = _config_error("scheme=gptq", "scheme.label=W4A61")
    assert (
        "scheme.label='W4A61' is not allowed; allowed: BF16, W4A16, W8A16, W8A8, FP8_DYNAMIC, FP8_BLOCK, W4AFP8, "
        "NVFP4A16, NVFP4 (did you mean 'W4A16'?)" in msg
    )


def test_symmetry_and_group_sizes_vllm_requires() -> None:
    # vLLM's int8 W8A8 kernels take symmetric weights only; the w8a8 recipe's preset W8A8 is symmetric
    msg = _config_error("scheme=w8a8", "scheme.symmetric=false")
    assert "scheme.symmetric=false: vLLM serves W8A8 weights only symmetric (no zero point); allowed: true" in msg
    assert "recipe scheme='W8A8' has symmetric=True but scheme.symmetric=False" in msg
    # Marlin takes group sizes 32, 64, 128 (and per-channel); 96 is none of them
    assert (
        "scheme.group_size=96: vLLM's W4A16 kernels take group sizes [32, 64, 128]; allowed: auto, channel, 32, 64, 128"
        in (_config_error("scheme=gptq", "scheme.group_size=96"))
    )
    assert "scheme.group_size='128': FP8_DYNAMIC has per-channel weight scales; allowed: channel" in _config_error(
        "scheme=fp8", "scheme.group_size=128"
    )
    assert "scheme.group_size_candidates=[256, 64]: [256] not taken" in _config_error(
        "scheme=awq", "scheme.group_size_candidates=[256,64]"
    )


def test_method_none_is_the_baseline_only() -> None:
    msg = _config_error("scheme=int8", "scheme.method=none")
    assert (
        "scheme.method='none' with scheme.label=W8A16: method none is the unquantized BF16 baseline and only it" in msg
    )
    assert "scheme.method=none quantizes nothing, but scheme.recipe is not empty" in msg


def test_recipe_preset_of_another_format_is_refused() -> None:
    msg = _config_error(
        "scheme=fp8", "scheme.recipe.quant_stage.quant_modifiers.QuantizationModifier.scheme=FP8_DYNAMC"
    )
    assert (
        "recipe scheme='FP8_DYNAMC' is not a FP8_DYNAMIC preset; allowed: FP8_DYNAMIC (did you mean 'FP8_DYNAMIC'?)"
        in msg
    )
