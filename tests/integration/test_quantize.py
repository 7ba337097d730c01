"""Quantize the embedded model with every shipped scheme (real llm-compressor, CPU) and check the checkpoints.

Each scheme is quantized once per test run (the run-wide ``quantized`` fixture, as a job of the tier quantizes it and
through its checkpoint cache: the entry a job of the same scheme reuses, or made by such a job first) with a small
calibration (16 samples x 128 tokens of WikiText-2 valid, ``clihelp.CALIBRATION``; AWQ 8) and is then checked for: the
stage result, the number of quantized Linear layers
(SmolLM2-135M: 30 layers x 7 = 210; lm_head stays 16-bit), effective bits per weight against the
formula of :func:`quantverdict.measure.memory.expected_bits`, total bytes, and the
``quantization_config`` that vLLM reads from config.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from quantverdict.measure.memory import check_against_prediction, checkpoint_memory, expected_bits

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# SmolLM2-135M: per layer q 576x576, k 192x576, v 192x576, o 576x576, gate/up 1536x576, down 576x1536
#   = 331,776 * 2 + 110,592 * 2 + 884,736 * 3 = 3,538,944 weights; x 30 layers = 106,168,320
QUANT_ELEMENTS = 106_168_320
# output rows (one per-channel scale each) per layer: 576 + 192 + 192 + 576 + 1536 + 1536 + 576 = 5,184; x 30
QUANT_ROWS = 155_520
# 16-bit tensors kept: embeddings 49,152 x 576 = 28,311,552 + norms (2 x 30 + 1) x 576 = 35,136, x 2 B
KEPT_BYTES = (28_311_552 + 35_136) * 2  # 56,693,376
# one int64 [2] weight_shape per packed Linear: 210 x 16 B
SHAPE_BYTES = 210 * 16

# scheme -> (config.json format, bits, group size or None for per-channel, asymmetric zero point)
EXPECTED = {
    "gptq": ("pack-quantized", 4, 64, False),
    "awq": ("pack-quantized", 4, 64, True),
    "int8": ("pack-quantized", 8, None, False),
    "fp8": ("float-quantized", 8, None, False),
    "w8a8": ("int-quantized", 8, None, False),
}


@pytest.fixture(scope="module")
def results(quantized: dict[str, Any]) -> dict[str, Any]:
    """Each scheme quantized once per test run (tests/conftest.py): ``results[name]`` -> (checkpoint: the stage
    result stored with the cache entry plus its path and key; bf16: the stage result), scheme config, model path)."""
    return quantized


def test_bf16_is_identity(results: dict[str, Any]) -> None:
    res, _, model = results["bf16"]
    assert res["status"] == "ok"
    assert res["path"] == str(model)  # no copy, no quantization
    assert res["quantized_modules"] == 0
    assert res["memory"]["total_weight_bytes"] == 134_515_008 * 2  # all parameters in bf16 (tied lm_head)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_scheme_checkpoint(results: dict[str, Any], name: str) -> None:
    res, scheme, _ = results[name]
    fmt, bits, group, zero_point = EXPECTED[name]
    # the checkpoint cache's entry of the job's key (cache/checkpoints/<model>/<scheme>-<key>), its sanity check
    # against the source model passed (made now or reused)
    assert Path(res["path"]).name == f"{name}-{res['key']}" and Path(res["path"]).parent.name == "smollm2-135m"
    assert res["sanity"]["finite"] is True
    assert res["logits_finite"] is True
    # every Linear of the 30 decoder layers (7 each); lm_head is ignored
    assert res["quantized_modules"] == 210
    assert res["versions"]["llmcompressor"]
    if scheme.method in ("gptq", "awq", "smoothquant_gptq"):
        # clihelp.CALIBRATION, AWQ half its samples (conftest.AWQ_CALIBRATION)
        want = (8, 128) if name == "awq" else (16, 128)
        assert (res["calibration"]["num_samples"], res["calibration"]["seq_len"]) == want
    else:
        assert res["calibration"]["num_samples"] == 0
    # a 4-bit or 8-bit checkpoint must not lose the model: check-prompt NLL within 1 nat of the source
    assert res["prompt_nll"]["quantized"] < res["prompt_nll"]["source"] + 1.0

    ckpt = Path(res["path"])
    assert ckpt.is_dir() and not list(ckpt.parent.glob(f".{ckpt.name}.tmp-*"))  # renamed, no leftovers
    qcfg = json.loads((ckpt / "config.json").read_text())["quantization_config"]
    assert qcfg["quant_method"] == "compressed-tensors"
    assert qcfg["format"] == fmt
    assert qcfg["ignore"] == ["lm_head"]
    weights = qcfg["config_groups"]["group_0"]["weights"]
    assert weights["num_bits"] == bits
    assert weights["group_size"] == group
    assert weights["symmetric"] is (not zero_point)
    acts = qcfg["config_groups"]["group_0"]["input_activations"]
    if scheme.activation_bits == 8:
        assert acts["num_bits"] == 8 and acts["dynamic"] is True and acts["strategy"] == "token"
    else:
        assert acts is None

    mem = res["memory"]
    assert mem["quantized_weight_elements"] == QUANT_ELEMENTS
    if group:
        # W4A16 g64, bf16 scales: 4 + 16/64 = 4.25; asymmetric adds a packed int4 zero point: + 4/64 = 4.3125
        want = expected_bits(bits, group, scale_bytes=2, zero_point=zero_point)
    else:
        # per-channel: one bf16 scale per output row: 8 + 16 * 155,520 / 106,168,320 = 8.0234375
        want = bits + 16 * QUANT_ROWS / QUANT_ELEMENTS
    assert mem["effective_bits_per_weight"] == pytest.approx(want, rel=1e-6)
    quant_bytes = want * QUANT_ELEMENTS / 8
    shapes = SHAPE_BYTES if fmt == "pack-quantized" else 0
    assert mem["total_weight_bytes"] == pytest.approx(KEPT_BYTES + quant_bytes + shapes, rel=1e-6)
    assert mem["bytes_by_role"]["kept_16bit"] == KEPT_BYTES


# Predicted checkpoint bytes (stages.memory.check_against_prediction), worked out by hand for SmolLM2-135M:
# 106,168,320 quantized weights in 155,520 output rows (above); group_size auto = 64 (576 % 128 = 64; 64
# divides 576 and 1536).
# W4A16 g64 symmetric: 106,168,320 / 2 = 53,084,160 B + 1,658,880 groups * 2 B = 3,317,760 B -> 56,401,920 B
# W4A16 g64 asymmetric: + 1,658,880 int4 zero points * 0.5 B = 829,440 B -> 57,231,360 B
# 8-bit per-channel: 106,168,320 B + 155,520 rows * 2 B = 311,040 B -> 106,479,360 B
PREDICTED = {  # scheme -> (label, weight_bits, group_size, symmetric, predicted bytes)
    "gptq": ("W4A16", 4, 64, True, 56_401_920),
    "awq": ("W4A16", 4, 64, False, 57_231_360),
    "int8": ("W8A16", 8, None, True, 106_479_360),
    "w8a8": ("W8A8", 8, None, True, 106_479_360),
    "fp8": ("FP8_DYNAMIC", 8, None, True, 106_479_360),
}


@pytest.mark.parametrize("name", list(PREDICTED))
def test_checkpoint_matches_its_prediction(results: dict[str, Any], name: str) -> None:
    """The checkpoint this module built (was: a unit test that read whatever ~/.cache held, else skipped)."""
    res, _, _ = results[name]
    label, bits, group, symmetric, predicted = PREDICTED[name]
    cmp = check_against_prediction(checkpoint_memory(Path(res["path"])), bits, group, symmetric, scheme=label)
    assert cmp["predicted_bytes"] == predicted
    assert abs(cmp["relative_deviation"]) <= 0.10
