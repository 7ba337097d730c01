"""A quantized weight dequantizes back within half a quantization step of the original.

Round to nearest on a uniform grid of step ``scale`` moves a value by at most ``scale / 2``; values
outside the grid's range are clamped, but min/max scales (compressed-tensors ``calculate_qparams``)
put the extremes at most half a step beyond the last level: symmetric int4 maps ``max|w|`` to
``max|w| / (max|w| / 7.5) = 7.5`` -> 7 (0.5 away), asymmetric rounds the zero point, shifting the
range by at most half a step. So ``|W - dequant(quant(W))| <= scale / 2`` elementwise, with the scale
of the element's own group. Float32 arithmetic adds ``|W / scale| * 2**-24`` <= 128 * 6e-8 ~ 1e-5 steps;
the tests allow 1e-4.

The computation runs in the quantize environment with compressed-tensors' own functions
(``dequantize_child.py``); a wrong ``g_idx`` shows the check can fail.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from quantverdict.processes.envs import StageEnv

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("dequantize_child.py")
HALF = 0.5 + 1e-4  # half a step plus float32 rounding (see the module docstring)
LAYER0 = [
    f"model.layers.0.{m}"
    for m in (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    )
]


@pytest.fixture(scope="module")
def int8_checkpoint(quantized: dict[str, Any]) -> tuple[Path, Path]:
    """SmolLM2-135M quantized by the real quantize stage with ``conf/scheme/int8.yaml`` (W8A16: int8
    per-channel, pack-quantized, round to nearest; data-free, ~1 min on 2 cores) and its bf16 source: the test run's
    int8 checkpoint (the checkpoint cache's entry), the one tests/integration/test_quantize.py checks."""
    res, scheme, model = quantized["int8"]
    assert scheme.method == "rtn" and scheme.weight_bits == 8
    assert res["quantized_modules"] == 210 and Path(res["path"]).is_dir(), res  # 30 layers x 7 Linear
    return Path(res["path"]), model


@pytest.fixture(scope="module")
def results(stage_envs: dict[str, StageEnv], int8_checkpoint: tuple[Path, Path]) -> dict[str, Any]:
    """One run of the child in the quantize environment (~20 s, most of it importing torch)."""
    env = stage_envs["quantize"]
    args = [str(int8_checkpoint[0]), str(int8_checkpoint[1]), *LAYER0]
    proc = subprocess.run(
        [env.python, str(CHILD), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env.env, "OMP_WAIT_POLICY": "PASSIVE"},  # as a stage child's (children._child)
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("case", "q_min", "q_max"),
    [
        ("int4_symmetric_g64", -8, 7),  # 4-bit signed levels
        ("int4_asymmetric_g64", -8, 7),
        ("int8_channel", -128, 127),
        ("actorder_weight", -8, 7),
        ("actorder_group", -8, 7),
    ],
)
def test_round_trip_within_half_a_step(results: dict[str, Any], case: str, q_min: int, q_max: int) -> None:
    r = results["random"][case]
    assert r["max_ratio"] <= HALF, f"{case}: an element is {r['max_ratio']:.4f} steps from its original"
    assert r["frac_over_half"] == 0
    # the extremes of each group reach the ends of the range (min/max scales)
    assert (r["q_min"], r["q_max"]) == (q_min, q_max)


@pytest.mark.parametrize("case", ["actorder_weight_wrong_g_idx", "actorder_group_wrong_g_idx"])
def test_wrong_g_idx_is_caught(results: dict[str, Any], case: str) -> None:
    # the identity g_idx uses another group's scale for permuted columns: the same check must fail
    r = results["random"][case]
    assert r["max_ratio"] > 1.0
    assert r["frac_over_half"] > 0.05


def test_int8_checkpoint(results: dict[str, Any]) -> None:
    """Stored int8 per-channel weights of a real W8A16 checkpoint against the bf16 source weights.

    The quantize stage computes round-to-nearest schemes in the source dtype (bfloat16), where
    ``W / scale`` is itself rounded to bfloat16 (8 significant bits, relative error <= u = 2**-8)
    before it is rounded to an integer, so an element may land up to ``u * |W / scale|`` further
    than half a step: ``|W - dequant| / scale <= 0.5 + u * |W / scale|`` elementwise. Overall: bf16
    values in [64, 128) are 0.5 apart, so ``W / scale`` moves by <= 0.25 and the error is <= 0.75 steps.
    """
    assert results["checkpoint"], "the child compared no module"
    for module, r in results["checkpoint"].items():
        assert (r["q_min"], r["q_max"]) == (-128, 127), module
        assert r["ulp_bound"] <= HALF, f"{module}: {r['ulp_bound']:.4f} steps beyond the bf16 rounding bound"
        assert r["max_ratio"] <= 0.75 + 1e-4, module
