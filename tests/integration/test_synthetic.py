"""Synthetic models end to end (materialize -> quantize -> memory -> record) on CPU, with tiny shapes.

The hybrid case: ``tiny-qwen3.5-shape`` is a Qwen3_5ForConditionalGeneration with 3 Gated DeltaNet
(linear-attention) layers, 1 full-attention layer (index 3) and a vision tower, quantized with the real
AWQ and SmoothQuant + GPTQ (``synthetic.calibrate: true``), so llm-compressor's mappings for mixed layer
types are exercised. Expected by hand from the config:

* quantized: q/k/v/o of the one full-attention layer (4) + gate/up/down of all 4 layers (12) = 16
  modules; 16-bit: every ``linear_attn`` projection, the vision tower, ``lm_head``, the embeddings;
* AWQ smooths a norm only into quantized layers: ``input_layernorm`` of layers 0-2 feeds only the
  16-bit linear-attention projections, so it must be unchanged, while layer 3's (feeding q/k/v) may
  change; every ``post_attention_layernorm`` feeds the quantized MLP;
* KV cache: 1 of 4 layers holds one (``num_kv_layers`` = 1).

``tiny-llama-shape`` with gptq checks that random-weight models get round-to-nearest in the same
W4A16 format (no Hessian, so no ``g_idx``) and that accuracy is recorded as not applicable.
vLLM on this CPU cannot serve the VLM class (no torchvision in the serve env): the sweep is skipped
with that reason; the GPU grid serves it.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest

from clihelp import run_cli
from quantverdict.measure.memory import read_header
from quantverdict.results.record import find_records, load

pytestmark = pytest.mark.integration

CALIB = ["scheme.calibration.num_samples=8", "scheme.calibration.seq_len=128"]


def _tensors(folder: str) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        for name, entry in read_header(f).items():
            out[name] = {**entry, "file": f}
    return out


def _bf16(entry: dict) -> bytes:
    with open(entry["file"], "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        begin, end = entry["data_offsets"]
        fh.seek(8 + n + begin)
        return fh.read(end - begin)


def _quantized_modules(tensors: dict[str, dict]) -> set[str]:
    return {
        name.rsplit(".", 1)[0]
        for name, e in tensors.items()
        if name.endswith(".weight_packed") or (name.endswith(".weight") and e["dtype"] in ("I8", "F8_E4M3"))
    }


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory, stage_envs: dict, embedded_model: dict) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("hybrid")
    proc = run_cli(
        out,
        "model=tiny-qwen3.5-shape",
        "scheme=bf16,awq,w8a8",
        "bench.server.port=8793",
        *CALIB,
        multirun=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {r["job"]["scheme"]: r for r in map(load, find_records(out / "multirun"))}


def test_hybrid_quantizes_only_full_attention_and_mlp(hybrid: dict[str, dict]) -> None:
    for scheme in ("awq", "w8a8"):
        rec = hybrid[scheme]
        assert rec["status"] == "ok", rec.get("error")
        mods = _quantized_modules(_tensors(rec["checkpoint"]["path"]))
        expected = {f"model.language_model.layers.3.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
        expected |= {
            f"model.language_model.layers.{i}.mlp.{p}" for i in range(4) for p in ("gate_proj", "up_proj", "down_proj")
        }
        assert mods == expected, sorted(mods ^ expected)
        assert rec["memory"]["checkpoint"]["quantized_modules"] == 16


def test_awq_and_smoothquant_smooth_only_norms_feeding_quantized_layers(hybrid: dict[str, dict]) -> None:
    norm = "model.language_model.layers.{}.input_layernorm"
    # AWQ maps layers 0-2's input norm to the linear-attention projections, which stay 16-bit: skipped
    sm = hybrid["awq"]["checkpoint"]["smoothing"]
    assert sorted(sm["skipped"]) == [norm.format(i) for i in range(3)], sm
    # SmoothQuant: exactly the full-attention layer's input norm (-> q/k/v) and every MLP's input norm
    sq = hybrid["w8a8"]["checkpoint"]["smoothing"]["smoothed"]
    post = "model.language_model.layers.{}.post_attention_layernorm"
    assert sorted(sq) == sorted([norm.format(3)] + [post.format(i) for i in range(4)]), sq
    src = _tensors(hybrid["bf16"]["checkpoint"]["path"])
    awq = _tensors(hybrid["awq"]["checkpoint"]["path"])
    for i in range(3):  # the skipped norms are byte-for-byte the source's
        name = norm.format(i) + ".weight"
        assert _bf16(awq[name]) == _bf16(src[name]), name


def test_hybrid_record_counts_kv_layers_and_skips_accuracy(hybrid: dict[str, dict]) -> None:
    for rec in hybrid.values():
        assert rec["model"]["dims"]["num_kv_layers"] == 1
        assert rec["model"]["dims"]["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
        assert rec["stages"]["evaluate"]["status"] == "not_applicable"
        assert set(rec["accuracy"]) == {"not_applicable"}
        # the VLM class (no torchvision in the CPU serve env); awq on AVX2 already for want of a 4-bit kernel
        assert rec["speed"]["unsupported"]
        assert "serve" not in rec["environment"]["dtypes"]
    for scheme in ("bf16", "w8a8"):
        assert re.search(
            r"cannot serve Qwen3_5ForConditionalGeneration.*torchvision", hybrid[scheme]["speed"]["unsupported"]
        )
    cfg = json.loads(Path(hybrid["awq"]["checkpoint"]["path"], "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3_5ForConditionalGeneration"]  # the vision tower was kept


def test_random_weights_get_round_to_nearest_in_the_same_format(
    tmp_path: Path, stage_envs: dict, embedded_model: dict
) -> None:
    proc = run_cli(tmp_path, "model=tiny-llama-shape", "scheme=gptq", "bench.enabled=false", *CALIB)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (rec,) = map(load, find_records(tmp_path / "runs"))
    assert rec["status"] == "ok", rec.get("error")
    assert any("replaced by round-to-nearest in the same W4A16 format" in n for n in rec["notes"])
    tensors = _tensors(rec["checkpoint"]["path"])
    assert not any(n.endswith("weight_g_idx") for n in tensors)
    # 2 layers x 7 Linear layers; hidden 256 -> group size 128: 4 + 16/128 = 4.125 bits per weight
    assert rec["memory"]["checkpoint"]["quantized_modules"] == 14
    assert rec["memory"]["checkpoint"]["effective_bits_per_weight"] == pytest.approx(4.125)
    assert rec["accuracy"] == {"not_applicable": rec["stages"]["evaluate"]["detail"]}


def test_the_128_wide_formats_and_nvfp4_on_a_shape_whose_layers_they_divide(
    tmp_path: Path, stage_envs: dict, embedded_model: dict
) -> None:
    """W4AFP8 and FP8_BLOCK need layers in multiples of 128 (the embedded model's 576 is not): tiny-llama-shape's
    256/512 are. Expected by hand: 2 layers x 7 Linear = 14 modules of 2 x (256x256 + 2 x 256x128 + 256x256 +
    3 x 256x512) = 1,179,648 weights.

    * w4afp8: int4 packed eight to an int32 ``weight_packed`` (the pack-quantized format vLLM's W4A8 kernel
      reads, not compressed-tensors' inferred int-quantized, one int8 a weight), a bf16 scale per 128:
      4 + 16/128 = 4.125 bits per weight;
    * fp8_block: FP8 E4M3 weights, one bf16 scale per 128x128 block: 8 + 16/16,384 bits; q_proj's scales 2x2;
    * nvfp4: calibrated on text even on random weights (its activations' global scale is static), 4 + 8/16
      bits plus one float32 global scale per module: 4.5 + 14 x 32 / 1,179,648 = 4.5003797...
    """
    proc = run_cli(
        tmp_path,
        "model=tiny-llama-shape",
        "scheme=w4afp8,fp8_block,nvfp4",
        "bench.enabled=false",
        *CALIB,
        multirun=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    recs = {r["job"]["scheme"]: r for r in map(load, find_records(tmp_path / "multirun"))}
    assert set(recs) == {"w4afp8", "fp8_block", "nvfp4"}
    bits = {"w4afp8": 4.125, "fp8_block": 8 + 16 / 16384, "nvfp4": 4.5 + 14 * 32 / 1_179_648}
    for scheme, rec in recs.items():
        assert rec["status"] == "ok", (scheme, rec.get("error"))
        assert rec["memory"]["checkpoint"]["quantized_modules"] == 14, scheme
        assert rec["memory"]["checkpoint"]["effective_bits_per_weight"] == pytest.approx(bits[scheme], rel=1e-9)
    w4 = _tensors(recs["w4afp8"]["checkpoint"]["path"])
    q = "model.layers.0.self_attn.q_proj"
    assert (w4[f"{q}.weight_packed"]["dtype"], w4[f"{q}.weight_packed"]["shape"]) == ("I32", [256, 32])
    assert w4[f"{q}.weight_scale"]["shape"] == [256, 2]
    cfg = json.loads(Path(recs["w4afp8"]["checkpoint"]["path"], "config.json").read_text())
    assert cfg["quantization_config"]["format"] == "pack-quantized"
    fb = _tensors(recs["fp8_block"]["checkpoint"]["path"])
    assert (fb[f"{q}.weight"]["dtype"], fb[f"{q}.weight_scale"]["shape"]) == ("F8_E4M3", [2, 2])
    assert not any("round-to-nearest" in n for n in recs["nvfp4"]["notes"])
