"""Sweep planning and parsing of ``vllm bench serve`` results, checked against hand-computed values."""

from __future__ import annotations

import math

import pytest

from quantverdict import sweep
from quantverdict.sweep import INF, SweepPoint

# A hand-written result in the shape `vllm bench serve --save-result --save-detailed` writes
# (keys from vllm/benchmarks/serve.py, vLLM 0.32.0): 4 prompts sent, 3 completed, 1 failed,
# 16 output tokens asked each, over 2.0 s.
RESULT = {
    "date": "20261129-224310",
    "backend": "vllm",
    "model_id": "smol",
    "num_prompts": 4,
    "request_rate": 2.0,
    "max_concurrency": None,
    "duration": 2.0,
    "completed": 3,
    "failed": 1,
    "total_input_tokens": 3 * 64,
    "total_output_tokens": 3 * 16,
    # vLLM: completed / duration = 3 / 2.0
    "request_throughput": 1.5,
    # total_output_tokens / duration = 48 / 2.0
    "output_throughput": 24.0,
    # (192 + 48) / 2.0
    "total_token_throughput": 120.0,
    "max_concurrent_requests": 2,
    "mean_ttft_ms": 110.0,
    "p50_ttft_ms": 100.0,
    "p90_ttft_ms": 150.0,
    "p99_ttft_ms": 159.0,
    "mean_tpot_ms": 20.0,
    "p50_tpot_ms": 20.0,
    "p90_tpot_ms": 24.0,
    "p99_tpot_ms": 25.0,
    "mean_itl_ms": 20.0,
    "p50_itl_ms": 19.0,
    "p90_itl_ms": 30.0,
    "p99_itl_ms": 41.0,
    "mean_e2el_ms": 410.0,
    "p50_e2el_ms": 400.0,
    "p90_e2el_ms": 500.0,
    "p99_e2el_ms": 509.0,
    "output_lens": [16, 16, 16, 0],
    "errors": ["", "", "", "ClientConnectorError: refused"],
}


def test_plan_rate_mode_keeps_order_and_names_inf():
    points = sweep.plan("rate", [1, 2.5, math.inf], [4], repeats=2)
    # 3 rates x 2 repeats = 6 points, rate-major
    assert [p.name for p in points] == [
        "rate-1_r0",
        "rate-1_r1",
        "rate-2.5_r0",
        "rate-2.5_r1",
        "rate-inf_r0",
        "rate-inf_r1",
    ]
    assert points[4].offered_rate_rps == INF
    assert points[4].request_rate_arg == "inf"
    assert points[0].offered_rate_rps == 1.0 and points[0].concurrency is None


def test_plan_concurrency_mode_uses_inf_rate():
    points = sweep.plan("concurrency", [1.0], [1, 16], repeats=1)
    assert [(p.name, p.request_rate_arg, p.concurrency) for p in points] == [
        ("conc-1_r0", "inf", 1),
        ("conc-16_r0", "inf", 16),
    ]


@pytest.mark.parametrize(
    ("mode", "rates", "conc", "repeats"),
    [("rate", [], [1], 1), ("concurrency", [1], [], 1), ("rate", [1], [1], 0), ("closed", [1], [1], 1)],
)
def test_plan_rejects_bad_input(mode, rates, conc, repeats):
    with pytest.raises(ValueError):
        sweep.plan(mode, rates, conc, repeats)


def test_normalize_rate():
    assert sweep.normalize_rate(float("inf")) == INF
    assert sweep.normalize_rate(".inf") == INF
    assert sweep.normalize_rate("4") == 4.0
    assert sweep.format_rate(0.5) == "0.5"
    with pytest.raises(ValueError):
        sweep.normalize_rate(0)


def test_parse_result_hand_values():
    point = SweepPoint(2.0, None, 0)
    p = sweep.parse_result(RESULT, point, num_prompts=4, output_len=16)
    assert p["point"] == "rate-2_r0"
    assert p["offered_rate_rps"] == 2.0 and p["concurrency"] is None and p["repeat"] == 0
    assert p["completed"] == 3 and p["failed"] == 1
    assert p["duration_s"] == 2.0
    assert p["achieved_rps"] == 1.5  # 3 completed / 2.0 s
    assert p["output_tok_s"] == 24.0  # 48 tokens / 2.0 s
    assert p["total_tok_s"] == 120.0  # (192 + 48) / 2.0 s
    assert p["output_tokens_total"] == 48  # 3 x 16
    assert p["output_tokens_requested"] == 64  # 4 prompts x 16 tokens: 16 missing = the failed request
    assert p["input_tokens_total"] == 192
    # vLLM's names -> ours: p99_ttft_ms -> ttft_ms_p99, e2el -> e2e
    assert (p["ttft_ms_p50"], p["ttft_ms_p90"], p["ttft_ms_p99"]) == (100.0, 150.0, 159.0)
    assert (p["tpot_ms_p50"], p["tpot_ms_p99"]) == (20.0, 25.0)
    assert (p["itl_ms_p50"], p["itl_ms_p99"]) == (19.0, 41.0)
    assert (p["e2e_ms_p50"], p["e2e_ms_p99"], p["e2e_ms_mean"]) == (400.0, 509.0, 410.0)
    assert p["peak_concurrent_requests"] == 2
    assert p["error_samples"] == ["ClientConnectorError: refused"]


def test_parse_result_without_percentiles_gives_none():
    minimal = {"completed": 2, "duration": 4.0}
    p = sweep.parse_result(minimal, SweepPoint(INF, 8, 1), num_prompts=2, output_len=10)
    assert p["failed"] == 0  # 2 sent - 2 completed
    assert p["offered_rate_rps"] == "inf" and p["concurrency"] == 8
    assert p["ttft_ms_p99"] is None and p["achieved_rps"] is None
    assert p["output_tokens_requested"] == 20  # 2 x 10
    assert "error_samples" not in p


def test_summary_line():
    p = sweep.parse_result(RESULT, SweepPoint(2.0, None, 0), num_prompts=4, output_len=16)
    line = sweep.summary_line(p, 1, 2)
    assert line.startswith("point 1/2 rate=2 r0: 3/4 ok, 1.50 req/s, 24.0 out tok/s, TTFT p50 100 ms")
