"""The decode-step fit and the byte-ratio prediction, against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from quantverdict.config.schema import ConfigError, ReviewConfig
from quantverdict.config.targets import load_target, target_errors
from quantverdict.measure.decode_bytes import (
    decode_step_bytes,
    kv_capacity,
    predicted_speed_ratio,
    target_kv_budget_bytes,
)
from quantverdict.measure.decode_fit import fit_decode_step, in_flight
from quantverdict.measure.kv_cache import hybrid_paging
from quantverdict.measure.memory import GIB

GB = 1e9


def test_points_on_an_exact_line_give_that_line() -> None:
    # 20 ms fixed + 313 µs per sequence (the seed's 4B): c=1 -> 20.313, c=8 -> 22.504, c=16 -> 25.008 ms
    fit = fit_decode_step([1, 8, 16], [20.313, 22.504, 25.008])
    assert fit.fixed_us == pytest.approx(20_000.0, abs=1e-6)
    assert fit.per_seq_us == pytest.approx(313.0, abs=1e-9)
    assert fit.r2 == pytest.approx(1.0)
    assert fit.n == 3 and fit.concurrency_range == (1.0, 16.0)
    assert fit.tpot_us(59) == pytest.approx(20_000 + 59 * 313)


def test_fit_quality_of_scattered_points() -> None:
    # x = 0, 1, 2, 3 (in ms-scale, shifted to c = 1..4); y = 1, 3, 2, 4 ms. Mean x 2.5, mean y 2.5 ms;
    # Sxy = (-1.5)(-1.5)+(-0.5)(0.5)+(0.5)(-0.5)+(1.5)(1.5) = 4; Sxx = 5 -> slope 0.8 ms/seq = 800 µs/seq,
    # intercept 2.5 - 0.8 x 2.5 = 0.5 ms; fitted 1.3, 2.1, 2.9, 3.7: SS_res = 0.09+0.81+0.81+0.09 = 1.8,
    # SS_tot = 2.25+0.25+0.25+2.25 = 5 -> R^2 = 1 - 1.8/5 = 0.64
    fit = fit_decode_step([1, 2, 3, 4], [1.0, 3.0, 2.0, 4.0])
    assert fit.per_seq_us == pytest.approx(800.0)
    assert fit.fixed_us == pytest.approx(500.0)
    assert fit.r2 == pytest.approx(0.64)


def test_seed_per_sequence_costs_ratio_like_the_bytes() -> None:
    four = fit_decode_step([1, 30], [10.313, 10.313 + 29 * 0.313])
    nine = fit_decode_step([1, 30], [12.395, 12.395 + 29 * 0.395])
    assert nine.per_seq_us / four.per_seq_us == pytest.approx(395 / 313)  # 1.26
    assert round(nine.per_seq_us / four.per_seq_us, 2) == 1.26


@pytest.mark.parametrize(
    ("conc", "tpot", "match"),
    [
        ([1], [1.0], "at least 2"),
        ([1, 2], [1.0], "TPOT values"),
        ([4, 4], [1.0, 2.0], "no slope"),
        ([1, 2], [1.0, math.nan], "finite"),
    ],
)
def test_fit_refuses_what_cannot_be_fitted(conc: list, tpot: list, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        fit_decode_step(conc, tpot)


def test_in_flight_by_littles_law_and_by_concurrency() -> None:
    # 4 req/s x 2.5 s mean E2E = 10 requests in flight
    assert in_flight({"achieved_rps": 4.0, "e2e_ms_mean": 2500.0}, "rate") == pytest.approx(10.0)
    assert in_flight({"concurrency": 16}, "concurrency") == 16.0
    assert in_flight({"achieved_rps": None, "e2e_ms_mean": 10.0}, "rate") is None


def test_seed_byte_ratio_prediction() -> None:
    four = decode_step_bytes(8.61 * GB)  # 4B fp16 weights
    nine = decode_step_bytes(11.21 * GB)  # 9B AWQ weights
    ratio = predicted_speed_ratio(nine, four)
    assert ratio == pytest.approx(8.61 / 11.21)  # 0.7681
    assert round(1 / ratio, 2) == 1.30
    measured = 821 / 1092  # the seed's ceilings (tok/s), 9B AWQ over 4B fp16
    assert round(measured, 2) == 0.75
    assert measured / ratio == pytest.approx(0.9789, abs=1e-4)  # measured / predicted
    assert round(4 / 9, 3) != round(ratio, 3)  # the parameter count's 1/2.25 = 0.444 is far off


def test_kv_reads_add_to_the_weights() -> None:
    # 1 GB weights + 8 sequences x (1,000 tokens x 32,768 B + 1,000,000 B state) = 1e9 + 8 x 33,768,000
    assert decode_step_bytes(1e9, 32_768, 8, 1_000, 1_000_000) == 1e9 + 8 * 33_768_000
    with pytest.raises(ValueError):
        decode_step_bytes(0)
    with pytest.raises(ValueError):
        predicted_speed_ratio(0, 1)


def test_target_budget_and_capacity() -> None:
    # A10G: 23,028 MiB = 22.48828125 GiB; x 0.9 = 20.2394531 GiB; minus 11.21 GiB of weights = 9.0294531 GiB
    kv = target_kv_budget_bytes(22.48828125, 0.9, 11.21 * GIB)
    assert kv / GIB == pytest.approx(9.0294531, abs=1e-7)
    assert target_kv_budget_bytes(22.48828125, 0.9, 21 * GIB) < 0  # weights over the budget
    # 1 GiB at 32,768 B/token: 32,768 tokens; 4,096-token requests: 8 of them
    cap = kv_capacity(GIB, 32_768, 4_096)
    assert cap == {"kv_tokens": 32_768, "max_concurrency": 8.0}
    assert kv_capacity(-5.0, 32_768, 4_096) == {"kv_tokens": 0, "max_concurrency": 0.0}


def test_hybrid_capacity_counts_whole_paged_sequences() -> None:
    # Qwen3.5-9B bf16 (kv_cache docstring): a 4,096-token sequence takes (16 x 8 + 24) x 1,114,112 B =
    # 169,345,024 B; 6.65 GiB = 7,140,383,539 B holds floor(42.16) = 42 of them
    dims = {
        "num_hidden_layers": 32,
        "num_kv_layers": 8,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
    }
    paging = hybrid_paging(dims, 2, 2)
    cap = kv_capacity(6.65 * GIB, 32_768, 4_096, paging)
    assert cap == {"kv_tokens": 42 * 4_096, "max_concurrency": 42.0}


def test_shipped_targets_and_a_wrong_name() -> None:
    a10g = load_target("a10g")
    assert a10g.memory_gib == pytest.approx(23_028 / 1024, abs=1e-3) and a10g.memory_fraction == 0.9
    assert load_target("h200").memory_gib == pytest.approx(143_771 / 1024, abs=1e-3)
    assert load_target("a10g", 0.85).memory_fraction == 0.85
    with pytest.raises(ConfigError, match="did you mean 'a10g'"):
        load_target("a10")
    assert any("a100-40gb" in e for e in target_errors(ReviewConfig(target="a100")))
    assert target_errors(ReviewConfig(target="l4", target_memory_fraction=1.5)) == [
        "review.target_memory_fraction=1.5 must be in (0, 1], e.g. 0.9 (vLLM's default)"
    ]
