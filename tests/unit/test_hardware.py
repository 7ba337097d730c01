"""GPU facts and the checks made before any work on env.device=cuda, on hand-built GPU lists."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest

from composed import composed
from quantverdict.config.compose import compose
from quantverdict.config.schema import ConfigError
from quantverdict.measure.memory import count_parameters, linear_weight_elements
from quantverdict.orchestrate import hardware
from quantverdict.orchestrate.hardware import (
    check_scheme_on_gpu,
    check_weights_fit,
    gpu_info,
    parse_nvidia_smi,
    predict_weight_bytes,
    visible,
)
from quantverdict.orchestrate.job import run_job

# what the H200 machine printed for nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_cap
# --format=csv,noheader,nounits; the uuid and PCI bus id are made up in
# nvidia-smi's form
H200_SMI = "0, NVIDIA H200, 580.159.04, 143771, 9.0, GPU-0a1b2c3d-4e5f-6789-abcd-ef0123456789, 00000000:18:00.0\n"
A100 = {
    "index": 0,
    "name": "NVIDIA A100-SXM4-80GB",
    "driver_version": "550.54",
    "memory_total_mib": 81920.0,
    "compute_cap": "8.0",
}
H100 = {
    "index": 0,
    "name": "NVIDIA H100 80GB HBM3",
    "driver_version": "550.54",
    "memory_total_mib": 81559.0,
    "compute_cap": "9.0",
}
L4 = {"index": 0, "name": "NVIDIA L4", "driver_version": "550.54", "memory_total_mib": 23034.0, "compute_cap": "8.9"}
T4 = {"index": 0, "name": "Tesla T4", "driver_version": "550.54", "memory_total_mib": 15360.0, "compute_cap": "7.5"}
V100 = {
    "index": 0,
    "name": "Tesla V100-SXM2-16GB",
    "driver_version": "550.54",
    "memory_total_mib": 16384.0,
    "compute_cap": "7.0",
}

SMOLLM2 = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
}
# Llama-3-8B's shape with a 32,000 vocabulary: the random-weight model measured on the H200 (../shared/gpu/README.md)
LLAMA8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
}
# 32 x 218,103,808 Linear + 2 x 32,000 x 4,096 embeddings/lm_head + (2 x 32 + 1) x 4,096 norms
LLAMA8B_PARAMS = 6_979_321_856 + 262_144_000 + 266_240


def scheme(name: str):  # noqa: ANN201
    return composed(f"scheme={name}").scheme


def test_parse_nvidia_smi_real_output() -> None:
    assert parse_nvidia_smi(H200_SMI) == [
        {
            "index": 0,
            "name": "NVIDIA H200",
            "driver_version": "580.159.04",
            "memory_total_mib": 143771.0,
            "compute_cap": "9.0",
            "uuid": "GPU-0a1b2c3d-4e5f-6789-abcd-ef0123456789",
            "pci_bus_id": "00000000:18:00.0",
        }
    ]
    two = parse_nvidia_smi(
        "0, NVIDIA A100, Inc, 550.54, 81920, 8.0, GPU-a, 00000000:07:00.0\n"
        "1, Tesla T4, 550.54, [N/A], 7.5, GPU-b, 00000000:08:00.0\n\n"
    )
    assert [g["name"] for g in two] == ["NVIDIA A100, Inc", "Tesla T4"]  # a comma inside the name
    assert two[1]["memory_total_mib"] is None
    assert [g["uuid"] for g in two] == ["GPU-a", "GPU-b"]


def test_cuda_visible_devices_as_cuda_counts_them() -> None:
    gpus = [dict(A100, index=0), dict(T4, index=1)]
    assert visible(gpus, None) == gpus
    assert visible(gpus, "1") == [gpus[1]]
    assert visible(gpus, "1,0") == [gpus[1], gpus[0]]
    # measured on the one-GPU H200 machine with torch.cuda.device_count(): "" 0, "-1" 0, "0,7" 1, "7,0" 0, "0,0" 0
    one = [H100]
    assert visible(one, "") == [] and visible(one, "-1") == []
    assert visible(one, "0,7") == [H100] and visible(one, "7,0") == []
    assert visible(one, "0,0") == []
    # GPU-<uuid> names, a unique prefix enough, in the order given; one that names no GPU ends the list
    named = [dict(A100, index=0, uuid="GPU-f9e56818-2a52-aaaa"), dict(T4, index=1, uuid="GPU-0b1c2d3e-4f50-bbbb")]
    assert visible(named, "GPU-0b1c2d3e,GPU-f9e56818-2a52") == [named[1], named[0]]
    assert visible(named, "GPU-f9e5,GPU-99999999") == [named[0]]
    assert visible(named, "GPU-,0") == []  # "GPU-" fits both: ambiguous, names none
    # MIG instances are not mapped: every GPU, none with a uuid (which one ran is not known)
    assert [g["uuid"] for g in visible(named, "MIG-4f1e2d3c-aaaa")] == [None, None]


def test_gpu_info_without_nvidia_smi_is_empty() -> None:
    assert gpu_info(nvidia_smi="/nonexistent/nvidia-smi") == []


# what the H200 machine printed for nvidia-smi --query-gpu=index,power.limit,enforced.power.limit,clocks.max.sm,
# clocks.max.memory --format=csv,noheader,nounits
H200_LIMITS = "0, 700.00, 700.00, 1980, 3201\n"


def test_parse_limits_real_output_and_not_available() -> None:
    assert hardware.parse_limits(H200_LIMITS) == {
        0: {"power_limit_w": 700.0, "enforced_power_limit_w": 700.0, "clocks_max_sm_mhz": 1980.0,
            "clocks_max_memory_mhz": 3201.0}
    }  # fmt: skip
    two = hardware.parse_limits("0, [N/A], [N/A], 1590, 1593\n1, 300.00, 250.00, 1410, 1215\n\n")
    assert two[0]["power_limit_w"] is None and two[0]["clocks_max_sm_mhz"] == 1590.0
    assert two[1]["enforced_power_limit_w"] == 250.0  # capped below its limit
    assert hardware.parse_limits('Field "clocks.max.sm" is not a valid field to query.\n') == {}


def _fake_smi(tmp_path: Path, limits_exit: int, gpus: str = H200_SMI, limits: str = H200_LIMITS) -> str:
    """A stand-in nvidia-smi: ``gpus`` to QUERY; to LIMITS_QUERY ``limits``, or an error and ``limits_exit``."""
    (tmp_path / "gpus.txt").write_text(gpus)
    (tmp_path / "limits.txt").write_text(limits)
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/usr/bin/env bash\n"
        f'if [ "$1" = "--query-gpu={hardware.QUERY}" ]; then cat "{tmp_path}/gpus.txt"; exit 0; fi\n'
        f'if [ {limits_exit} -ne 0 ]; then echo "Field is not a valid field to query." >&2; exit {limits_exit}; fi\n'
        f'cat "{tmp_path}/limits.txt"\n'
    )
    smi.chmod(0o755)
    return str(smi)


def test_gpu_info_adds_the_limits_and_keeps_the_gpus_when_that_query_fails(tmp_path: Path) -> None:
    (gpu,) = gpu_info(cuda_visible_devices="0", nvidia_smi=_fake_smi(tmp_path, 0))
    assert gpu["uuid"] == "GPU-0a1b2c3d-4e5f-6789-abcd-ef0123456789"
    assert (gpu["enforced_power_limit_w"], gpu["clocks_max_sm_mhz"]) == (700.0, 1980.0)
    # a driver that refuses a field (nvidia-smi exits 2 on an unknown one): the GPU is still there, limits None
    (gpu,) = gpu_info(cuda_visible_devices="0", nvidia_smi=_fake_smi(tmp_path, 2))
    assert gpu["compute_cap"] == "9.0"
    assert [gpu[k] for k in hardware.LIMIT_KEYS] == [None, None, None, None]
    # two GPUs, limits for the second only (index 1): the first keeps None, and CUDA_VISIBLE_DEVICES=1 keeps its own
    two = H200_SMI + H200_SMI.replace("0, NVIDIA", "1, NVIDIA").replace("GPU-0a1b", "GPU-9f8e")
    smi = _fake_smi(tmp_path, 0, gpus=two, limits="1, 600.00, 550.00, 1980, 3201\n")
    first, second = gpu_info(cuda_visible_devices="0,1", nvidia_smi=smi)
    assert first["power_limit_w"] is None and (second["power_limit_w"], second["enforced_power_limit_w"]) == (600, 550)
    (only,) = gpu_info(cuda_visible_devices="1", nvidia_smi=smi)
    assert only["uuid"].startswith("GPU-9f8e") and only["enforced_power_limit_w"] == 550.0


def test_fp8_is_refused_below_compute_capability_8_9() -> None:
    with pytest.raises(ConfigError) as err:
        check_scheme_on_gpu(scheme("fp8"), [A100])
    msg = str(err.value)
    assert "scheme=fp8 (FP8_DYNAMIC)" in msg and "NVIDIA A100-SXM4-80GB (compute capability 8.0)" in msg
    assert "FP8 W8A8 needs compute capability >= 8.9 (Ada/Hopper)" in msg
    assert "scheme=w8a8 (int8 W8A8)" in msg and "scheme=int8 (W8A16), awq or gptq (W4A16)" in msg
    check_scheme_on_gpu(scheme("fp8"), [H100])  # 9.0 >= 8.9
    check_scheme_on_gpu(scheme("fp8"), [L4])  # 8.9: Ada
    # the other schemes run on the A100 (8.0 >= 7.5)
    for name in ("bf16", "awq", "gptq", "int8", "w8a8"):
        check_scheme_on_gpu(scheme(name), [A100])


def test_weight_only_and_int8_w8a8_need_turing() -> None:
    for name in ("awq", "gptq", "int8", "w8a8"):
        check_scheme_on_gpu(scheme(name), [T4])  # 7.5
        with pytest.raises(ConfigError, match=r"compute capability 7\.0\).*needs compute capability >= 7\.5"):
            check_scheme_on_gpu(scheme(name), [V100])
    check_scheme_on_gpu(scheme("bf16"), [V100])


def test_no_visible_gpu_names_env_device() -> None:
    with pytest.raises(ConfigError, match=r"env.device='cuda' but no GPU is visible.*allowed: cpu, cuda"):
        check_scheme_on_gpu(scheme("awq"), [])
    with pytest.raises(ConfigError, match="env.device='cuda'"):
        check_weights_fit(1.0, [], 0.9, "awq", "m")


def test_linear_weight_elements_by_hand() -> None:
    # SmolLM2-135M per layer: q 576*576 + k,v 2*576*192 + o 576*576 + gate,up,down 3*576*1536
    #   = 331,776*2 + 110,592*2 + 884,736*3 = 3,538,944; x 30 layers = 106,168,320
    assert linear_weight_elements(SMOLLM2) == 106_168_320
    # Llama-3-8B per layer: 2*4096*4096 + 2*4096*1024 + 3*4096*14336 = 218,103,808; x 32 = 6,979,321,856
    assert linear_weight_elements(LLAMA8B) == 6_979_321_856
    assert linear_weight_elements({"hidden_size": 8}) is None


def test_predicted_weights_match_measured_checkpoints() -> None:
    # docs/results/cpu-grid.md, checkpoint MiB measured from the safetensors files of the real make run
    model = {"dims": SMOLLM2, "num_parameters": 134_515_008, "path": "unused"}
    measured_mib = {"bf16": 256.6, "gptq": 107.9, "awq": 108.7, "int8": 155.6, "fp8": 155.6, "w8a8": 155.6}
    for name, mib in measured_mib.items():
        predicted = predict_weight_bytes(scheme(name), model) / 2**20
        assert predicted == pytest.approx(mib, rel=0.002), name
    # bf16 by hand: 134,515,008 * 2 = 269,030,016 bytes
    assert predict_weight_bytes(scheme("bf16"), model) == 269_030_016
    # gptq (W4A16 g64 symmetric) by hand: 106,168,320 * (4/8 + 2/64) + 2 * (134,515,008 - 106,168,320)
    #   = 53,084,160 + 3,317,760 + 2 * 28,346,688 = 56,401,920 + 56,693,376 = 113,095,296
    assert predict_weight_bytes(scheme("gptq"), model) == 113_095_296


def test_predicted_weights_match_vllm_on_the_h200() -> None:
    # vLLM's "model weights" GiB for the Llama-3-8B-shaped model, ../shared/gpu/README.md
    model = {"dims": LLAMA8B, "num_parameters": LLAMA8B_PARAMS, "path": "unused"}
    bf16 = predict_weight_bytes(scheme("bf16"), model) / 2**30
    assert bf16 == pytest.approx(13.49, rel=0.001)  # 7,241,732,096 * 2 bytes = 13.489 GiB
    w4 = predict_weight_bytes(compose(["scheme=gptq", "scheme.group_size=128"]).scheme, model)
    assert w4 / 2**30 == pytest.approx(3.85, rel=0.005)  # data-free W4A16 preset: group 128, 3.840 GiB
    assert predict_weight_bytes(scheme("fp8"), model) / 2**30 == pytest.approx(7.03, rel=0.01)


# Qwen3.5-9B's text dimensions (docs/results/gpu-records/qwen3.5-9b-shape): 8 of 32 layers full attention
QWEN35_9B = {
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 32,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "vocab_size": 248320,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "num_kv_layers": 8,
}
QWEN35_9B["layer_types"] = QWEN35_9B["layer_types"] * 8


def test_hybrid_counts_only_the_attention_layers_and_the_gated_q_proj() -> None:
    # per full-attention layer: q_proj 4096 x (16*256*2: query and output gate) = 33,554,432, k/v 2 x 4096 x 1024
    #   = 8,388,608, o_proj 4096 x 4096 = 16,777,216 -> 58,720,256; x 8 layers = 469,762,048
    # MLP: 3 x 4096 x 12288 = 150,994,944 per layer; x 32 = 4,831,838,208; sum 5,301,600,256
    # = the W4A16 checkpoint measured on the H200: 2,650,800,128 bytes of packed 4-bit weights x 2 elements per byte
    assert linear_weight_elements(QWEN35_9B, "qwen3_5") == 5_301_600_256
    # the same dims without the gate (a plain hybrid): q_proj 16,777,216 smaller in each of 8 layers
    assert linear_weight_elements(QWEN35_9B) == 5_301_600_256 - 8 * 16_777_216
    # W4A16 g128: 5,301,600,256 / 2 + 5,301,600,256 / 128 * 2 + 2 x (9,409,813,744 - 5,301,600,256)
    #   = 2,650,800,128 + 82,837,504 + 8,216,426,976 = 10,950,064,608; the checkpoint held 10,950,066,656
    model = {"dims": QWEN35_9B, "num_parameters": 9_409_813_744, "model_type": "qwen3_5", "path": "unused"}
    w4 = compose(["scheme=gptq", "scheme.group_size=128"]).scheme
    assert predict_weight_bytes(w4, model) == 10_950_064_608


def test_predicted_weights_count_parameters_from_the_checkpoint(tmp_path: Path) -> None:
    # no num_parameters (source=local): counted from the safetensors header; 2x3 + 4 = 10 bf16 elements
    header = json.dumps(
        {
            "a.weight": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
            "b.bias": {"dtype": "BF16", "shape": [4], "data_offsets": [12, 20]},
        }
    ).encode()
    (tmp_path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(20))
    assert count_parameters(tmp_path) == 10
    assert predict_weight_bytes(scheme("bf16"), {"dims": {}, "num_parameters": None, "path": str(tmp_path)}) == 20


def test_weights_over_the_gpu_budget_are_refused() -> None:
    model = {"dims": LLAMA8B, "num_parameters": LLAMA8B_PARAMS, "path": "unused"}
    bf16 = predict_weight_bytes(scheme("bf16"), model)
    # T4: 15,360 MiB = 15.00 GiB x 0.9 = 13.50 GiB budget; bf16 weights 13.489 GiB just fit
    check_weights_fit(bf16, [T4], 0.9, "bf16", "llama8b")
    with pytest.raises(ConfigError) as err:  # 15.00 x 0.85 = 12.75 GiB < 13.49
        check_weights_fit(bf16, [T4], 0.85, "bf16", "llama8b")
    msg = str(err.value)
    assert "model llama8b with scheme=bf16: the weights alone are predicted at 13.49 GiB" in msg
    assert "Tesla T4: 15.00 GiB x bench.server.gpu_memory_utilization=0.85 = 12.75 GiB" in msg
    assert "lower-bit scheme" in msg and "a GPU with more memory" in msg
    check_weights_fit(predict_weight_bytes(scheme("gptq"), model), [T4], 0.85, "gptq", "llama8b")  # 3.84 GiB


def test_cuda_job_without_a_gpu_fails_before_any_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # hides every GPU, on any machine
    cfg = compose(["env=gpu", "scheme=awq", "tracking.enabled=false", f"paths.output_root={tmp_path}"])
    with pytest.raises(ConfigError, match="env.device='cuda' but no GPU is visible"):
        run_job(cfg, tmp_path / "job")
    rec = json.loads((tmp_path / "job" / "record.json").read_text())
    assert rec["status"] == "failed" and rec["failed_stage"] == "gpu_check"
    assert rec["environment"]["gpu"] == []
    assert list(rec["stages"]) == ["gpu_check"]  # no setup, no materialize


def test_fp8_job_on_an_a100_fails_before_any_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(hardware, "gpu_info", lambda cuda_visible_devices=None: [A100])
    cfg = compose(["env=gpu", "scheme=fp8", "tracking.enabled=false", f"paths.output_root={tmp_path}"])
    with caplog.at_level(logging.ERROR), pytest.raises(ConfigError, match="FP8 W8A8 needs compute capability >= 8.9"):
        run_job(cfg, tmp_path / "job")
    rec = json.loads((tmp_path / "job" / "record.json").read_text())
    assert rec["failed_stage"] == "gpu_check" and "NVIDIA A100-SXM4-80GB" in rec["error"]
    assert rec["environment"]["gpu"] == [A100]
    assert list(rec["stages"]) == ["gpu_check"]


def test_weight_only_fp8_needs_turing_not_ada() -> None:
    # FP8 weights with 16-bit activations: vLLM's CompressedTensorsW8A16Fp8 (FP8 Marlin), minimum 7.5
    # (no shipped label: FP8_DYNAMIC fixes 8-bit activations, so the scheme is built past validation)
    w8a16_fp8 = dataclasses.replace(compose(["scheme=fp8"]).scheme, activation_bits=16)
    check_scheme_on_gpu(w8a16_fp8, [A100])
    check_scheme_on_gpu(w8a16_fp8, [T4])
    with pytest.raises(ConfigError, match=r"W8A16 weight-only needs compute capability >= 7\.5.*use scheme=bf16"):
        check_scheme_on_gpu(w8a16_fp8, [V100])
