"""Repeated prompts inside one sweep point (vLLM's random dataset) are not cache reuse from the method:
counted by hand, subtracted from the judged hit rate (re-reading them into finished records:
tools/bench/tests/test_bench_gpu.py)."""

from __future__ import annotations

import pytest

from quantverdict.measure import bench_result, server_metrics
from quantverdict.measure.prompt_repeats import expected_repeats, prompt_repeats
from quantverdict.measure.sweep_plan import SweepPoint

BEFORE = {
    "vllm:prefix_cache_queries": 0.0,
    "vllm:prefix_cache_hits": 0.0,
    "vllm:prompt_tokens": 0.0,
    "vllm:generation_tokens": 0.0,
    "vllm:num_preemptions": 0.0,
}


def _after(queries: int, hits: int, gen: int) -> dict[str, float]:
    return {**BEFORE, "vllm:prefix_cache_queries": queries, "vllm:prefix_cache_hits": hits,
            "vllm:prompt_tokens": queries, "vllm:generation_tokens": gen}  # fmt: skip


def test_repeats_counted_by_their_first_characters() -> None:
    a, b = "x" * 70, "y" * 70
    got = prompt_repeats([(a, 10), (b, 20), (a, 10), (a + "tail", 12), (["batch"], 5)])
    # the third and fourth start like the first (the fourth with other last tokens): 2 repeats, 10 + 12 tokens
    assert got == {"requests": 5, "prompt_tokens": 57, "repeated_requests": 2, "repeated_tokens": 22}
    # a prompt differing inside the first 64 characters is not a repeat
    assert prompt_repeats([(a, 10), ("z" + a[1:], 10)])["repeated_requests"] == 0
    assert prompt_repeats([]) == {"requests": 0, "prompt_tokens": 0, "repeated_requests": 0, "repeated_tokens": 0}


def test_expected_repeats_is_the_birthday_count() -> None:
    # 2 starts over 2 ids: 2 - 2 x (1 - 1/4) = 0.5 expected repeats (a collision half the time)
    assert expected_repeats(2, 2) == pytest.approx(0.5)
    # the H200 sweep's largest point: 2,680 requests over SmolLM2's 49,152 ids ~ 72; 79 were counted
    # 3 starts over 3 ids: expected distinct 3 x (1 - (2/3)^3) = 19/9, so 3 - 19/9 = 8/9 repeats
    assert expected_repeats(3, 3) == pytest.approx(8 / 9)
    assert 71 < expected_repeats(2680, 49152) < 73.1  # n^2 / 2V = 73.06 bounds it from above
    with pytest.raises(ValueError, match="vocab"):
        expected_repeats(10, 0)


def test_hits_explained_by_the_points_own_repeats_are_valid() -> None:
    # the H200's bf16 point conc-256_r1: 686,080 tokens looked up, 19,088 hit, 79 repeats x 256 = 20,224
    c = server_metrics.server_checks(BEFORE, _after(686080, 19088, 343040), 686080, 343040, repeated_tokens=20224)
    assert c["prefix_cache_hit_rate"] == pytest.approx(19088 / 686080)  # 2.78%: over 1% on its own
    assert c["prefix_cache_excess_hit_rate"] == 0.0  # max(0, 19,088 - 20,224)
    assert c["prompt_repeat_rate"] == pytest.approx(20224 / 686080)
    assert c["server_invalid_reasons"] == []
    # the same hits with the repeats not counted (older records): judged whole, invalid, and the text says why
    (why,) = server_metrics.server_checks(BEFORE, _after(686080, 19088, 343040), 686080, 343040)[
        "server_invalid_reasons"
    ]
    assert "2.8% > 1%" in why and "not counted" in why


def test_hits_beyond_the_repeats_still_invalidate() -> None:
    # 100,000 looked up, 3,000 hit, 1,500 of them repeats: 1,500 beyond = 1.5% > 1%
    c = server_metrics.server_checks(BEFORE, _after(100000, 3000, 500), 100000, 500, repeated_tokens=1500)
    assert c["prefix_cache_excess_hit_rate"] == pytest.approx(0.015)
    (why,) = c["server_invalid_reasons"]
    assert "beyond the point's own repeated prompts 1.5% > 1%" in why and "1,500 repeated" in why
    # 1,000 beyond = exactly 1%: passes
    ok = server_metrics.server_checks(BEFORE, _after(100000, 2500, 500), 100000, 500, repeated_tokens=1500)
    assert ok["server_invalid_reasons"] == []
    assert server_metrics.excess_hits(None, 5) is None and server_metrics.excess_hits(7, None) == 7


RESULT = {
    "duration": 4.0, "completed": 4, "num_prompts": 4, "total_input_tokens": 1024, "total_output_tokens": 64,
    "request_throughput": 1.0, "output_throughput": 16.0, "total_token_throughput": 272.0,
    "input_lens": [256] * 4, "output_lens": [16] * 4, "ttfts": [0.1] * 4, "itls": [[0.05] * 15] * 4,
    "latencies": [0.85] * 4, "start_times": [0.0, 1.0, 2.0, 3.0], "errors": [""] * 4,
    "mean_ttft_ms": 100.0, "median_ttft_ms": 100.0, "p99_ttft_ms": 100.0,
}  # fmt: skip


def _side(hits: int, repeats: dict | None) -> dict:
    side = {"seed": 3, "wall_s": 5.5, "num_prompts": 4, "attempts": [{"num_prompts": 4, "duration_s": 4.0}],
            "counters_before": BEFORE, "counters_after": _after(1024, hits, 64)}  # fmt: skip
    if repeats is not None:
        side["prompt_repeats"] = repeats
    return side


def test_client_side_subtracts_the_sidecars_repeats() -> None:
    rep = {"requests": 4, "prompt_tokens": 1024, "repeated_requests": 1, "repeated_tokens": 256}
    p = bench_result.parse_result(RESULT, SweepPoint(1.0, None, 0), 4, 16)
    bench_result.add_client_side(p, _side(240, rep))  # one repeat, 15 blocks of 16 served: 240 of 1,024
    assert p.valid and p.prompt_repeat_rate == 0.25 and p.prefix_cache_excess_hit_rate == 0.0
    assert "(25.0% of prompt tokens repeat inside the point)" in bench_result.summary_line(p, 1, 1)
    q = bench_result.parse_result(RESULT, SweepPoint(1.0, None, 0), 4, 16)
    bench_result.add_client_side(q, _side(240, None))
    assert not q.valid and q.prefix_cache_excess_hit_rate == pytest.approx(240 / 1024)


def test_benchmark_split_table_flags_a_stage_over_ten_percent() -> None:
    from quantverdict.results.table import benchmark_split_table

    def rec(scheme: str, overhead: float, attempts: list[int]) -> dict:
        # start 100 s + windows 400 s: the target allows 50 s of overhead
        ts = {"server_start_s": 100.0, "compile_s": 20.0, "graph_capture_s": 4.0, "compile_cache_hit": False,
              "windows_s": 400.0, "overhead_s": overhead, "overhead_fraction": overhead / 500.0}  # fmt: skip
        return {
            "job": {"model": "m", "scheme": scheme},
            "stages": {"benchmark": {"wall_s": 100.0 + 400.0 + overhead + 3.0}},
            "speed": {"time_split": ts, "points": [{"attempts": a} for a in attempts]},
        }

    bf16 = rec("bf16", 50.0, [1, 1])
    bf16["speed"]["time_split"]["warmup_after_capture_s"] = 83.0  # gptq's split has none (an older record): "–"
    bf16["speed"]["sweep_client"] = {"calibration_s": 30.4}  # its warm-up waves, part of the 50 s
    text = benchmark_split_table([bf16, rec("gptq", 126.0, [1, 2])])
    # the client's overhead is 50 / 500 = 10.0%, but the stage (553 s) is 53 s over start + windows: 10.6%, flagged
    assert (
        "| m / bf16 | 100 | 20 / 4 / 83 (cache miss) | 400 (2 points) | 50 (warm-up waves 30) | 3 | 0 | 553 | 10.0%"
        " | 10.6% **> 10%** |"
    ) in text
    assert (
        "| m / gptq | 100 | 20 / 4 / – (cache miss) | 400 (2 points) | 126 | 3 | 1 | 629 | 25.2% | 25.8% **> 10%** |"
        in (text)
    )
    # within the target: 45 s of overhead and 3 s of stop make a stage of 548 s, 9.6% over start + windows
    assert "| 45 | 3 | 0 | 548 | 9.0% | 9.6% |" in benchmark_split_table([rec("fp8", 45.0, [1])])
    assert benchmark_split_table([{"job": {}, "speed": {}}]) == ""


def test_cache_summary_names_the_largest_hits_and_repeats() -> None:
    pts = [
        {"prefix_cache_hit_rate": 0.015, "prompt_repeat_rate": 0.016, "prefix_cache_excess_hit_rate": 0.0},
        {"prefix_cache_hit_rate": 0.028, "prompt_repeat_rate": 0.030, "prefix_cache_excess_hit_rate": 0.0001},
    ]
    text = server_metrics.cache_summary(pts)
    assert text is not None and "at most 2.8% of the prompt tokens looked up" in text
    assert "at most 3.0% of a point's prompt tokens repeat" in text and "at most 0.01% (limit 1%)" in text
    # repeats not counted (records before the count): said, not invented
    old = server_metrics.cache_summary([{"prefix_cache_hit_rate": 0.004}])
    assert old is not None and "at most 0.4%" in old and "not counted" in old
    assert server_metrics.cache_summary([{"output_tok_s": 1.0}]) is None  # no counters: no sentence
