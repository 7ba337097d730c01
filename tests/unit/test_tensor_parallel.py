"""Tensor parallelism: memory per GPU, the fit check per GPU, GPUs needed for a budget, the review's GPU lines,
the server command and the config checks. Numbers worked out by hand from Llama-3.1-70B's config.

Llama-3.1-70B (conf/model/llama3.1-70b-shape.yaml): per layer 8192x64x128 (q) + 2x8192x8x128 (k, v) +
64x128x8192 (o) + 3x8192x28672 (MLP) = 67,108,864 + 16,777,216 + 67,108,864 + 704,643,072 = 855,638,016;
x 80 layers = 68,451,041,280; + embeddings and lm_head 2 x 128,256 x 8,192 = 2,101,346,304 ->
70,552,387,584 parameters, 141,104,775,168 bytes in bf16 = 131.414 GiB (65.707 GiB per GPU at TP=2).
KV cache per token in bf16: 2 x 80 x 8 x 128 x 2 = 327,680 bytes; per GPU at TP=2 (4 of the 8 KV heads)
163,840 bytes, x 4,096 tokens = 0.625 GiB.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from quantverdict.config.compose import CONF_DIR, compose
from quantverdict.config.schema import ConfigError, ReviewConfig
from quantverdict.config.validate import parallel_serving_errors
from quantverdict.measure import tensor_parallel as tpm
from quantverdict.orchestrate import dummy, hardware, preflight
from quantverdict.processes.envs import StageEnv
from quantverdict.results.record import JobRecord
from quantverdict.review import gpus
from quantverdict.review.document import Ceiling, Memory, Scheme
from quantverdict.review.words import say
from quantverdict.serving.server import VLLMServer, build_command
from review_records import blank_scheme

GIB = 2**30
LLAMA70B = yaml.safe_load((CONF_DIR / "model" / "llama3.1-70b-shape.yaml").read_text())["synthetic"]["config"]
PARAMS_70B = 70_552_387_584
# what the H200 machine printed for nvidia-smi (143,771 MiB = 140.40 GiB)
H200 = {
    "index": 0,
    "name": "NVIDIA H200",
    "driver_version": "580.159.04",
    "memory_total_mib": 143771.0,
    "compute_cap": "9.0",
}
H200_1 = {**H200, "index": 1}


def test_llama70b_shape_has_the_published_parameter_count() -> None:
    assert preflight.synthetic_parameters(LLAMA70B) == PARAMS_70B
    dims = dummy.shape_dims(LLAMA70B)
    assert dims["num_kv_layers"] == 80 and dims["head_dim"] == 128 and dims["tie_word_embeddings"] is False


def test_kv_heads_split_until_each_gpu_keeps_one() -> None:
    assert [tpm.kv_heads_per_gpu(8, tp) for tp in (1, 2, 4, 8, 16)] == [8, 4, 2, 1, 1]
    assert tpm.kv_share_per_gpu(8, 2) == 0.5 and tpm.kv_share_per_gpu(8, 16) == 0.125
    assert tpm.kv_share_per_gpu(2, 8) == 0.5  # 2 KV heads over 8 GPUs: each holds one, half the cache


def test_per_gpu_need_of_llama70b_bf16_at_tp2() -> None:
    need = hardware.per_gpu_need_bytes(2.0 * PARAMS_70B, dummy.shape_dims(LLAMA70B), 4096, 2.0, 2)
    assert need["weights_bytes"] / GIB == pytest.approx(65.707, abs=1e-3)
    assert need["kv_bytes"] == 163_840 * 4096  # 0.625 GiB
    assert need["total_bytes"] / GIB == pytest.approx(66.332, abs=1e-3)


def test_fit_check_judges_each_gpu_of_the_tp_group() -> None:
    bf16 = 2.0 * PARAMS_70B  # 131.41 GiB > 140.40 x 0.9 = 126.36 GiB of one H200
    with pytest.raises(ConfigError) as err:
        hardware.check_weights_fit(bf16, [H200, H200_1], 0.9, "bf16", "llama3.1-70b-shape")
    msg = str(err.value)
    assert "predicted at 131.41 GiB per GPU" in msg and "126.36 GiB" in msg
    assert "bench.server.tensor_parallel_size=2" in msg  # what to change
    kv = 163_840 * 4096
    hardware.check_weights_fit(bf16, [H200, H200_1], 0.9, "bf16", "llama3.1-70b-shape", 2, kv)  # 66.33 GiB fits


def test_a_job_seeing_fewer_gpus_than_its_tp_is_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"tensor_parallel_size=2 needs 2 GPUs; this job sees 1 \(index 0\).*num_gpus=2"
    ):
        hardware.check_gpu_count([H200], 2)
    hardware.check_gpu_count([H200, H200_1], 2)


@pytest.mark.parametrize(
    ("weights", "kv", "heads", "budget", "expected"),
    [
        (131.414, 10.0, 8, 80.0, 2),  # bf16 70B: 141.4 on one; 65.7 + 5.0 = 70.7 on two
        (37.0, 10.0, 8, 80.0, 1),  # W4A16: 47 on one
        (66.0, 10.0, 8, 80.0, 1),  # FP8: 76 on one
        (131.414, 10.0, 8, 60.0, 4),  # two: 70.7 > 60; four: 32.9 + 2.5 = 35.4
        (700.0, 0.0, 8, 80.0, None),  # 87.5 on eight: not within 8 GPUs
    ],
)
def test_gpus_needed_for_a_per_gpu_budget(
    weights: float, kv: float, heads: int, budget: float, expected: int | None
) -> None:
    assert tpm.gpus_needed(weights, kv, heads, budget) == expected


def _card(scheme: str, label: str, weights_gib: float, source: str, tok_s: float | None) -> Scheme:
    sc = blank_scheme(f"m_{scheme}", scheme, label, is_baseline=scheme == "bf16")
    sc.memory = Memory().model_copy(
        update={"weights_gib": weights_gib, "weights_source": source, "kv_needed_gib": 10.0, "state_needed_gib": 0.0}
    )
    top = {"kind": "saturated", "output_tok_s": tok_s, "lower_bound": False}
    sc.speed.ceiling = Ceiling.model_validate(dict.fromkeys(Ceiling.model_fields) | top)
    return sc


def _rec(scheme: str, tp: int) -> dict[str, Any]:
    return {
        "job": {"id": f"m_{scheme}", "output_dir": f"/x/{scheme}"},
        "environment": {"device": "cuda", "gpus_used": tp},
        "model": {"dims": {"num_key_value_heads": 8}},
        "config": {},
    }


def test_review_says_how_many_gpus_each_scheme_needs_and_tok_s_per_gpu() -> None:
    cards = [
        _card("bf16", "BF16", 65.707, "vLLM log", 2400.0),  # logged by one of the two GPUs: 131.41 in all
        _card("gptq", "W4A16", 37.0, "vLLM log", 1500.0),
        _card("fp8", "FP8_DYNAMIC", 66.0, "vLLM log", 2100.0),
    ]
    recs = [_rec("bf16", 2), _rec("gptq", 1), _rec("fp8", 1)]
    needs = gpus.gpu_needs(list(zip(cards, map(JobRecord.view, recs))), ReviewConfig(memory_budget_gib=80.0))
    assert needs is not None
    # bf16's whole weights 2 x 65.707 = 131.4 GiB need two 80 GiB GPUs; gptq (37) and fp8 (66) fit on one
    assert [(f.gpus, f.labels) for f in needs.fits] == [(2, ["BF16"]), (1, ["W4A16", "FP8_DYNAMIC"])]
    assert [(r.scheme, r.gpus, r.output_tok_s_per_gpu) for r in needs.speeds] == [
        ("bf16", 2, 1200.0),  # 2,400 / 2
        ("gptq", 1, 1500.0),
        ("fp8", 1, 2100.0),
    ]
    lines = say("gpu_lines", "speed.j2", g=needs, budget=80.0, requests=16).split("\n")
    assert lines[0] == (
        "GPUs needed at 80 GiB per GPU (whole weights / GPUs + the KV cache for 16 requests, per GPU): "
        "BF16 on two GPUs or W4A16/FP8_DYNAMIC on one."
    )
    assert lines[1] == (
        "Throughput per GPU (sustained output tok/s / GPUs used): bf16 2,400 tok/s on 2 GPUs = 1,200 per GPU; "
        "gptq 1,500 tok/s on 1 GPU = 1,500 per GPU; fp8 2,100 tok/s on 1 GPU = 2,100 per GPU."
    )
    # without a memory budget no GPU count can be given: the throughput line alone
    unbudgeted = gpus.gpu_needs(list(zip(cards, map(JobRecord.view, recs))), ReviewConfig(memory_budget_gib=None))
    assert say("gpu_lines", "speed.j2", g=unbudgeted, budget=None, requests=16).strip() == lines[1]
    cpu = [JobRecord.view({**r, "environment": {"device": "cpu"}}) for r in recs]
    assert gpus.gpu_needs(list(zip(cards, cpu)), ReviewConfig(memory_budget_gib=80.0)) is None


def test_server_command_shards_and_loads_dummy_weights() -> None:
    cfg = compose(
        [
            "model=tiny-llama-shape",
            "env.device=cuda",
            "bench.server.tensor_parallel_size=2",
            "bench.server.load_format=dummy",
        ]
    )
    env = StageEnv(name="serve", python="python3", env={})
    cmd, _ = build_command(env, "/m", "m", cfg.bench.server, 4096, "cuda")
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "2" and cmd[cmd.index("--load-format") + 1] == "dummy"
    default, _ = build_command(env, "/m", "m", compose([]).bench.server, 4096, "cpu")
    assert "--tensor-parallel-size" not in default and "--load-format" not in default


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["bench.server.tensor_parallel_size=2"],
            "bench.server.tensor_parallel_size=2 shards the server over GPUs; env.device=cpu has none: use 1, "
            "or env=gpu",
        ),
        (["bench.server.tensor_parallel_size=0"], "bench.server.tensor_parallel_size=0 must be >= 1"),
        (["bench.server.load_format=dumy"], "allowed: auto, dummy (did you mean 'dummy'?)"),
        (
            ["bench.server.load_format=dummy"],
            "only for speed of a synthetic model (model.source=synthetic), not model.source=pypi_gguf",
        ),
    ],
)
def test_config_refuses_tp_on_cpu_and_dummy_weights_of_a_real_model(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        compose(overrides)
    assert message in str(err.value)


def test_dummy_weights_of_a_synthetic_model_are_allowed() -> None:
    assert parallel_serving_errors(compose(["model=tiny-llama-shape", "bench.server.load_format=dummy"])) == []


def test_lm_eval_vllm_engine_shards_like_the_server() -> None:
    cfg = compose(["eval=gpu", "env.device=cuda", "bench.server.tensor_parallel_size=2"])
    assert cfg.eval.vllm_args["tensor_parallel_size"] == 2


def test_dummy_proxy_keeps_the_architecture_and_shrinks_the_dimensions(tmp_path: Path) -> None:
    proxy = dummy.proxy_config(LLAMA70B)
    assert proxy["model_type"] == "llama" and proxy["rope_parameters"] == LLAMA70B["rope_parameters"]
    assert (proxy["hidden_size"], proxy["intermediate_size"], proxy["num_hidden_layers"]) == (256, 512, 1)
    # every group size the schemes use divides the proxy's in_features (256, 512)
    assert all(n % g == 0 for n in (256, 512) for g in (128, 64, 32))
    assert proxy["vocab_size"] == 49152  # the borrowed tokenizer's: every id is inside the vocabulary


def test_port_zero_gives_each_server_a_free_port_that_vllm_is_told(tmp_path: Path) -> None:
    cfg = compose(["bench.server.port=0"]).bench.server
    env = StageEnv(name="serve", python="python3", env={})
    a = VLLMServer(env, "/m", "m", cfg, 2048, "cpu", tmp_path / "a.log")
    b = VLLMServer(env, "/m", "m", cfg, 2048, "cpu", tmp_path / "b.log")
    for server in (a, b):
        assert server.port > 0 and server.command[server.command.index("--port") + 1] == str(server.port)
        assert server.base_url.endswith(f":{server.port}")
    strict = compose(["bench.server.strict_port=true"]).bench.server
    fixed = VLLMServer(env, "/m", "m", strict, 2048, "cpu", tmp_path / "c.log")
    assert fixed.port == 8765  # a port insisted on is passed as it is (checked when the server starts)
