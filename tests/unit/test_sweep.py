"""Sweep planning and parsing of ``vllm bench serve`` results, checked against hand-computed values."""

from __future__ import annotations

import math

import pytest

from quantverdict.config.compose import compose
from quantverdict.measure import bench_result, capacity, kernels, sweep, sweep_plan, validity
from quantverdict.measure.points import Spread
from quantverdict.measure.sweep_plan import INF, SweepPoint

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
    points = sweep_plan.plan("rate", [1, 2.5, math.inf], [4], repeats=2)
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
    points = sweep_plan.plan("concurrency", [1.0], [1, 16], repeats=1)
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
        sweep_plan.plan(mode, rates, conc, repeats)


def test_normalize_rate():
    assert sweep_plan.normalize_rate(float("inf")) == INF
    assert sweep_plan.normalize_rate(".inf") == INF
    assert sweep_plan.normalize_rate("4") == 4.0
    assert sweep_plan.format_rate(0.5) == "0.5"
    with pytest.raises(ValueError):
        sweep_plan.normalize_rate(0)


def test_parse_result_hand_values():
    point = SweepPoint(2.0, None, 0)
    p = bench_result.parse_result(RESULT, point, num_prompts=4, output_len=16)
    assert p.point == "rate-2_r0"
    assert p.offered_rate_rps == 2.0 and p.concurrency is None and p.repeat == 0
    assert p.completed == 3 and p.failed == 1
    assert p.duration_s == 2.0
    assert p.achieved_rps == 1.5  # 3 completed / 2.0 s
    assert p.output_tok_s == 24.0  # 48 tokens / 2.0 s
    assert p.total_tok_s == 120.0  # (192 + 48) / 2.0 s
    assert p.output_tokens_total == 48  # 3 x 16
    assert p.output_tokens_requested == 64  # 4 prompts x 16 tokens: 16 missing = the failed request
    assert p.input_tokens_total == 192
    # vLLM's names -> ours: p99_ttft_ms -> ttft_ms_p99, e2el -> e2e
    assert (p.ttft_ms_p50, p.ttft_ms_p90, p.ttft_ms_p99) == (100.0, 150.0, 159.0)
    assert (p.tpot_ms_p50, p.tpot_ms_p99) == (20.0, 25.0)
    assert (p.itl_ms_p50, p.itl_ms_p99) == (19.0, 41.0)
    assert (p.e2e_ms_p50, p.e2e_ms_p99, p.e2e_ms_mean) == (400.0, 509.0, 410.0)
    assert p.peak_concurrent_requests == 2
    assert p.error_samples == ["ClientConnectorError: refused"]


def test_parse_result_without_percentiles_gives_none():
    minimal = {"completed": 2, "duration": 4.0}
    p = bench_result.parse_result(minimal, SweepPoint(INF, 8, 1), num_prompts=2, output_len=10)
    assert p.failed == 0  # 2 sent - 2 completed
    assert p.offered_rate_rps == "inf" and p.concurrency == 8
    assert p.ttft_ms_p99 is None and p.achieved_rps is None
    assert p.output_tokens_requested == 20  # 2 x 10
    assert not p.has("error_samples")


def test_summary_line():
    p = bench_result.parse_result(RESULT, SweepPoint(2.0, None, 0), num_prompts=4, output_len=16)
    line = bench_result.summary_line(p, 1, 2)
    assert line.startswith("point 1/2 rate=2 r0: 3/4 ok, 1.50 req/s, 24.0 out tok/s, TTFT p50 100 ms")


# --------------------------------------------------------------------------------------------------
# Validity from the per-request lists of --save-detailed


def detailed(starts, ttfts, itls, lens, errors=None, **summary):  # type: ignore[no-untyped-def]
    """A --save-detailed result: latencies = TTFT + sum(ITL) (what vLLM's client measures), completed and
    duration from the lists, vLLM's summary numbers as given."""
    lat = [t + sum(i) for t, i in zip(ttfts, itls)]
    errors = errors or [""] * len(starts)
    ok = [i for i, e in enumerate(errors) if not e]
    end = max(starts[i] + lat[i] for i in ok)
    dur = end - min(starts)
    return {
        "completed": len(ok),
        "failed": len(starts) - len(ok),
        "duration": dur,
        "request_throughput": len(ok) / dur,
        "output_throughput": sum(lens) / dur,
        "total_output_tokens": sum(lens),
        "start_times": list(starts),
        "ttfts": list(ttfts),
        "itls": [list(i) for i in itls],
        "latencies": lat,
        "output_lens": list(lens),
        "errors": errors,
        **summary,
    }


# 4 requests, 4 output tokens each (TTFT s | ITL gaps s | E2E = TTFT + sum(ITL)):
#   r0: 0.5  | .25 .25 .25 | 1.25      r1: 0.25 | .5 .25 .25 | 1.25
#   r2: 0.75 | .25 .5 .5   | 2.0       r3: 0.25 | .25 .25 .25 | 1.0
FOUR = dict(
    starts=[0.0, 0.5, 1.0, 2.0],
    ttfts=[0.5, 0.25, 0.75, 0.25],
    itls=[[0.25, 0.25, 0.25], [0.5, 0.25, 0.25], [0.25, 0.5, 0.5], [0.25, 0.25, 0.25]],
    lens=[4, 4, 4, 4],
)


def test_percentile_is_numpys_linear_by_hand() -> None:
    xs = [50, 15, 40, 20, 35]  # sorted: 15 20 35 40 50
    assert sweep.percentile(xs, 50) == 35  # rank 0.5 * 4 = 2 -> x[2]
    assert sweep.percentile(xs, 90) == pytest.approx(46.0)  # rank 3.6 -> 40 + 0.6 * (50 - 40)
    assert sweep.percentile(xs, 99) == pytest.approx(49.6)  # rank 3.96 -> 40 + 0.96 * 10
    assert sweep.percentile(xs, 0) == 15 and sweep.percentile(xs, 100) == 50
    assert sweep.percentile([1, 2], 50) == 1.5  # rank 0.5 -> halfway
    assert sweep.percentile([7], 99) == 7
    # nearest-rank (ceil(q/100 * n) - 1 -> x[4] = 50) or rank = q/100 * n (4.95: out of range) would both fail
    with pytest.raises(ValueError):
        sweep.percentile([], 50)
    with pytest.raises(ValueError):
        sweep.percentile([1.0], 101)


def test_percentile_equals_numpy_on_fixed_lists() -> None:
    import numpy as np  # matplotlib's dependency: always in the orchestrator venv

    lists = [[3.0, 1.0, 2.0], [0.1 * i * i for i in range(37)], [5.5] * 4 + [1e-3, 9e3], list(range(100, 0, -3))]
    for xs in lists:
        for q in (0, 1, 25, 50, 90, 95, 99, 99.9, 100):
            assert sweep.percentile(xs, q) == float(np.percentile(xs, q))  # bit-for-bit


def test_recomputed_latencies_by_hand_and_itl_excludes_ttft() -> None:
    res = detailed(**FOUR, p99_itl_ms=500.0, p50_ttft_ms=375.0)
    p = bench_result.parse_result(res, SweepPoint(1.0, None, 0), num_prompts=4, output_len=4)
    assert p.metrics_source == "recomputed"
    # TTFT sorted .25 .25 .5 .75: p50 rank 1.5 -> .375 s; p90 rank 2.7 -> .5 + .7 * .25 = .675 s; mean 1.75 / 4
    assert p.ttft_ms_p50 == pytest.approx(375.0) and p.ttft_ms_p90 == pytest.approx(675.0)
    assert p.ttft_ms_mean == pytest.approx(437.5)
    # ITL: the 12 gaps after the first token: nine .25 and three .5 (no TTFT among them).
    # p50 rank 5.5 -> .25; p90 rank 9.9 -> .5; mean (9 * .25 + 3 * .5) / 12 = .3125 s
    assert p.itl_ms_p50 == pytest.approx(250.0) and p.itl_ms_p99 == pytest.approx(500.0)
    assert p.itl_ms_mean == pytest.approx(312.5)
    # TPOT = (E2E - TTFT) / (n - 1): .75/3 = .25, 1/3, 1.25/3, .75/3 = .25 -> sorted .25 .25 .3333 .4167
    # p50 rank 1.5 -> (.25 + .3333) / 2 = .291667 s
    assert p.tpot_ms_p50 == pytest.approx(1000 * (0.25 + 1 / 3) / 2)
    # E2E sorted 1.0 1.25 1.25 2.0: p90 rank 2.7 -> 1.25 + .7 * .75 = 1.775 s
    assert p.e2e_ms_p90 == pytest.approx(1775.0)
    # vLLM's own numbers are kept apart; where given they agree with ours
    assert p.vllm_itl_ms_p99 == 500.0 and p.vllm_ttft_ms_p50 == 375.0
    assert p.vllm_max_rel_diff == pytest.approx(0.0, abs=1e-12)
    assert p.itl_sum_max_err_ms == pytest.approx(0.0) and p.itl_per_token is True
    assert p.valid is True and p.short_requests == 0 and p.output_valid is True


def test_itl_lists_that_include_the_ttft_make_the_point_invalid() -> None:
    res = detailed(**FOUR)
    # a client that measured the first "gap" from the request start: ITL lists begin with the TTFT
    res["itls"] = [[t, *i] for t, i in zip(res["ttfts"], res["itls"])]
    p = bench_result.parse_result(res, SweepPoint(1.0, None, 0), num_prompts=4, output_len=4)
    # TTFT + sum(ITL) - E2E = the TTFT itself: worst 0.75 s
    assert p.itl_sum_max_err_ms == pytest.approx(750.0)
    assert p.valid is False and "not the gaps after the first token" in p.invalid_reasons[0]
    assert p.itl_per_token is False  # 4 gaps for 4 tokens


def test_short_outputs_make_a_point_invalid() -> None:
    # 4 requests asked 4 tokens: r2 stopped after 2, r3 failed (0 tokens): 10 of 16 = 62.5% < 90%
    res = detailed(**{**FOUR, "lens": [4, 4, 2, 0]}, errors=["", "", "", "ReadTimeout"])
    p = bench_result.parse_result(res, SweepPoint(1.0, None, 0), num_prompts=4, output_len=4)
    assert p.output_tokens_total == 10 and p.output_tokens_requested == 16
    assert p.short_requests == 2  # the short one and the failed one
    assert p.output_valid is False and p.valid is False
    assert "10 of 16 requested output tokens (62%" in p.invalid_reasons[0]
    # 15 of 16 (93.75% >= 90%): valid, one short request counted
    ok = bench_result.parse_result(detailed(**{**FOUR, "lens": [4, 4, 3, 4]}), SweepPoint(1.0, None, 0), 4, 4)
    assert ok.valid is True and ok.short_requests == 1


def test_warmup_requests_in_the_result_make_it_invalid() -> None:
    # 3 prompts sent, but the lists hold 4 requests: a warm-up request counted in the rates and percentiles
    p = bench_result.parse_result(
        detailed(**FOUR), SweepPoint(1.0, None, 0), num_prompts=3, output_len=4, warmup_requests=1
    )
    assert p.valid is False and "4 requests in the result, 3 sent" in p.invalid_reasons[0]
    assert p.warmup_requests == 1


def _steady_run(n: int, gap: float, done: list[float]) -> dict:  # type: ignore[type-arg]
    """n requests sent every `gap` s, request i completing at done[i]; 4 tokens, ITL .25 s each."""
    starts = [gap * i for i in range(n)]
    ttfts = [d - s - 0.75 for s, d in zip(starts, done)]
    return detailed(starts, ttfts, [[0.25] * 3] * n, [4] * n)


def test_steady_state_excludes_ramp_up_and_drain() -> None:
    # 8 requests at 2 req/s (sent 0, .5, ..., 3.5), each 1 s long: completions 1.0, 1.5, ..., 4.5.
    res = _steady_run(8, 0.5, [1.0 + 0.5 * i for i in range(8)])
    p = bench_result.parse_result(res, SweepPoint(2.0, None, 0), num_prompts=8, output_len=4)
    # window (first completion 1.0, last sent 3.5] = 2.5 s: completions 1.5 2 2.5 3 3.5 -> 5 / 2.5 = 2 req/s;
    # requests sent in it: 1.5 .. 3.5 -> 5 -> 2 req/s
    assert p.steady_window_s == 2.5 and p.steady_completions == 5
    assert p.steady_rps == 2.0 and p.steady_arrival_rps == 2.0
    # tokens streamed at s + .25, .5, .75, 1.0 inside (1.0, 3.5]: 0+2+4+4+4+4+2+0 = 20 -> 8 tok/s
    assert p.steady_output_tok_s == 8.0 and p.throughput_basis == "steady_window"
    # whole run: 8 / 4.5 s = 1.78 req/s = 0.89 x offered (ramp-up and drain counted): would read saturated
    assert p.achieved_rps == pytest.approx(8 / 4.5)
    # saturation: completions 1.0 .. 4.5 (7 / 3.5 s = 2 req/s) at the pace of the sends 0 .. 3.5 (7 / 3.5 s): 1.0
    assert p.saturated is False and p.saturation_ratio == 1.0 and p.saturation_basis == "arrival_pace"


def test_saturated_open_loop_in_the_steady_window() -> None:
    # 16 requests at 2 req/s (sent 0 .. 7.5) into a server that finishes one per second (at 1, 2, ..., 16)
    res = _steady_run(16, 0.5, [1.0 + i for i in range(16)])
    p = bench_result.parse_result(res, SweepPoint(2.0, None, 0), num_prompts=16, output_len=4)
    # window (1, 7.5] = 6.5 s: 6 completions (2..7), 13 requests sent (1.5 .. 7.5)
    assert p.steady_completions == 6 and p.steady_arrivals == 13
    # completions 1 .. 16 (15 / 15 s = 1 req/s) against sends 0 .. 7.5 (15 / 7.5 s = 2 req/s): 0.5
    assert p.saturation_ratio == pytest.approx(0.5) and p.saturated is True
    assert p.throughput_rps == pytest.approx(6 / 6.5)  # the server's rate, not the offered 2 req/s


def test_a_closed_loop_window_shorter_than_two_lifetimes_has_no_steady_rate() -> None:
    # c=4, two waves of 4 requests, each 10 s long (TTFT 9.25 s + 3 gaps of .25 s): wave 1 sent at 0, .1, .2, .3
    # ends at 10, 10.1, 10.2, 10.3, each end sending the next: wave 2 at 10 .. 10.3, ending 20 .. 20.3
    starts = [0.0, 0.1, 0.2, 0.3, 10.0, 10.1, 10.2, 10.3]
    res = detailed(starts, [9.25] * 8, [[0.25] * 3] * 8, [4] * 8)
    closed = bench_result.parse_result(res, SweepPoint(INF, 4, 0), num_prompts=8, output_len=4)
    # window (10.0, 10.3] = 0.3 s, 3 completions (10.1 .. 10.3): 10 req/s by the old rule, against a whole run of
    # 8 / 20.3 s = 0.39 req/s; 0.3 s < 2 x the median E2E of 10 s: no steady rate, the whole run stands
    assert closed.steady_window_s == pytest.approx(0.3) and closed.steady_completions == 3
    assert closed.steady_rps is None and closed.steady_output_tok_s is None
    assert "shorter than 2 request lifetimes (E2E p50 10 s)" in closed.steady_reason
    assert closed.throughput_basis == "whole_run" and closed.throughput_rps == pytest.approx(8 / 20.3)
    # a record written before the rule: its stored steady window is set aside the same way when read
    old = closed.model_copy(update={"steady_rps": 10.0, "steady_output_tok_s": 40.0, "throughput_rps": 10.0})
    old = old.model_copy(update={"throughput_tok_s": 40.0, "throughput_basis": "steady_window"})
    again = bench_result.rebase_steady(old)
    assert again.throughput_rps == pytest.approx(8 / 20.3) and again.throughput_basis == "whole_run"
    assert again.throughput_tok_s == closed.output_tok_s and again.steady_rps is None
    # the rule comes first, as at measurement: a stored point whose window also held too few completions says so
    few = bench_result.rebase_steady(
        closed.model_copy(update={"steady_reason": "only 2 completion(s) in the steady window"})
    )
    assert few.steady_reason == closed.steady_reason
    # the same timings in an open loop keep their window: its completions are not waves of one start
    assert bench_result.parse_result(res, SweepPoint(4.0, None, 0), 8, 4).steady_rps == pytest.approx(10.0)
    open_loop = old.model_copy(update={"concurrency": None})
    assert bench_result.rebase_steady(open_loop) is open_loop and open_loop.throughput_rps == 10.0


def test_saturation_without_a_window_burst_and_closed_loop() -> None:
    # too few requests for a steady window: every one sent before the first completes; the paces still compare
    res = detailed(**{**FOUR, "starts": [0.0, 0.1, 0.2, 0.3]})
    p = bench_result.parse_result(res, SweepPoint(4.0, None, 0), num_prompts=4, output_len=4)
    assert p.steady_rps is None and "no steady state" in p.steady_reason
    # completions 1.25, .1+1.25=1.35, .2+2=2.2, .3+1=1.3: 3 / (2.2 - 1.25) = 3.16 req/s against sends 3 / .3 s = 10
    assert p.saturation_basis == "arrival_pace" and p.saturation_ratio == pytest.approx(3 / 0.95 / 10)
    assert p.saturated is True and p.throughput_rps == pytest.approx(4 / 2.2)
    # without per-request lists: (4 - 1) / (duration 2.2 s - E2E p50 1.25 s) = 3.16 req/s against the offered 4
    bare = {k: v for k, v in res.items() if k not in ("start_times", "ttfts", "itls", "latencies")}
    q = bench_result.parse_result({**bare, "p50_e2el_ms": 1250.0}, SweepPoint(4.0, None, 0), 4, 4)
    assert q.saturation_basis == "estimated_pace" and q.saturation_ratio == pytest.approx(3 / 0.95 / 4)
    assert q.saturated is True
    burst = bench_result.parse_result(res, SweepPoint(INF, None, 0), 4, 4)
    assert burst.saturated is None and burst.saturation_basis == "burst"
    closed = bench_result.parse_result(res, SweepPoint(INF, 2, 0), 4, 4)
    assert closed.saturated is None and closed.saturation_basis == "closed_loop"


def _pt(rate, rep, tok, *, rps=1.0, sat=None, valid=True, conc=None, ttft99=100.0):  # type: ignore[no-untyped-def]
    return {
        "point": f"p{rate}-{conc}-{rep}",
        "offered_rate_rps": rate,
        "concurrency": conc,
        "repeat": rep,
        "completed": 8,
        "valid": valid,
        "saturated": sat,
        "saturation_basis": None if sat is None else "arrival_pace",  # decided under the current rule
        "output_tok_s": tok,
        "achieved_rps": rps,
        "throughput_tok_s": tok,
        "throughput_rps": rps,
        "ttft_ms_p99": ttft99,
        "itl_ms_p99": 20.0,
    }


def test_summarize_median_spread_and_invalid_points_left_out() -> None:
    pts = [
        _pt(1.0, 0, 10.0, sat=False),
        _pt(1.0, 1, 30.0, sat=False),
        _pt(1.0, 2, 20.0, sat=True),
        _pt(1.0, 3, 5.0, valid=False),  # short outputs: never averaged in
        _pt(INF, 0, 40.0),
        _pt(INF, 1, 50.0),
    ]
    s = sweep.summarize(pts, "rate")
    assert [lv.offered_rate_rps for lv in s] == [1.0, INF]  # inf sorts last
    one = s[0]
    assert one.repeats == 4 and one.valid_repeats == 3 and one.invalid_points == ["p1.0-None-3"]
    # median of 10, 30, 20 = 20 (the invalid 5 would make it 15); spread 10..30
    assert (one.metrics or {})["output_tok_s"] == Spread(median=20.0, min=10.0, max=30.0, n=3)
    assert one.saturated_repeats == 1 and one.saturated is False  # 1 of 3: not most
    # even count: the mean of the middle two, (40 + 50) / 2
    assert (s[1].metrics or {})["output_tok_s"] == Spread(median=45.0, min=40.0, max=50.0, n=2)
    assert s[1].saturated is None


def test_sustained_ceiling_from_saturated_points() -> None:
    pts = [
        _pt(1.0, 0, 10.0, sat=False),
        _pt(4.0, 0, 50.0, rps=1.5, sat=True),
        _pt(4.0, 1, 54.0, rps=1.7, sat=True),
        _pt(INF, 0, 45.0, rps=1.4),
        _pt(8.0, 0, 99.0, sat=True, valid=False),  # invalid: its 99 tok/s never counts
    ]
    c = capacity.sustained_ceiling(sweep.summarize(pts, "rate"), "rate")
    # candidates: 4 req/s (saturated, median (50 + 54) / 2 = 52) and inf (45): 4 req/s wins
    assert c["kind"] == "saturated" and c["offered_rate_rps"] == 4.0
    assert c["output_tok_s"] == 52.0 and (c["output_tok_s_min"], c["output_tok_s_max"]) == (50.0, 54.0)
    assert c["rps"] == pytest.approx(1.6) and c["repeats"] == 2
    # the unsaturated 1 req/s point is not a ceiling: without 4 and inf, the ceiling is only a lower bound
    lb = capacity.sustained_ceiling(sweep.summarize(pts[:1], "rate"), "rate")
    assert lb["kind"] == "lower_bound" and lb["output_tok_s"] == 10.0
    assert capacity.sustained_ceiling(sweep.summarize(pts[-1:], "rate"), "rate")["kind"] == "none"


def test_concurrency_sweep_points_and_ceiling() -> None:
    pts = [_pt(INF, 0, 16.0, conc=1), _pt(INF, 0, 60.0, conc=4), _pt(INF, 0, 58.0, conc=16)]
    s = sweep.summarize(pts, "concurrency")
    assert [lv.concurrency for lv in s] == [1, 4, 16] and all(lv.saturated is None for lv in s)
    c = capacity.sustained_ceiling(s, "concurrency")
    assert c["kind"] == "closed_loop_max" and c["concurrency"] == 4 and c["output_tok_s"] == 60.0


def test_points_of_older_records_without_validity_keys() -> None:
    old = {
        "offered_rate_rps": 2.0,
        "concurrency": None,
        "achieved_rps": 1.0,
        "completed": 8,
        "output_tokens_total": 200,
        "output_tokens_requested": 256,
    }
    assert validity.point_valid(old) is False  # 200 / 256 = 78% < 90%
    assert validity.point_valid({**old, "output_tokens_total": 240}) is True  # 94%
    # no duration or latency kept: saturation cannot be told
    assert validity.point_saturation(old) == {
        "saturated": None,
        "saturation_ratio": None,
        "saturation_basis": "too_few_requests",
    }
    # (8 - 1) / (8 s - E2E p50 1 s) = 1 req/s against 2 offered: 0.5, saturated (its stored whole-run basis ignored)
    older = {**old, "duration_s": 8.0, "e2e_ms_p50": 1000.0, "saturated": False, "saturation_basis": "whole_run"}
    assert validity.point_saturation(older) == {
        "saturated": True,
        "saturation_ratio": pytest.approx(0.5),
        "saturation_basis": "estimated_pace",
    }
    # with the request times the record kept: sent 0, .5, .., 3.5 (2 req/s), done 2, 3, .., 9 (1 req/s): 0.5
    times = {"start_s": [0.5 * i for i in range(8)], "end_s": [2.0 + i for i in range(8)]}
    assert validity.point_saturation({**older, "request_times": times})["saturation_basis"] == "arrival_pace"
    assert validity.point_saturated({**old, "offered_rate_rps": None}) is None  # older records: None = unlimited


def test_kernel_check_relabels_a_weight_only_fallback() -> None:
    marlin = {
        "kernels": [{"kernel": "MarlinFP8ScaledMMLinearKernel", "method": "CompressedTensorsW8A8Fp8"}],
        "fallback": True,
        "fallback_lines": ["Your GPU does not have native support for FP8 computation ... Weight-only FP8"],
    }
    kc = kernels.kernel_check("FP8_DYNAMIC", marlin, activation_quantized=True)
    assert kc["effective_label"] == "FP8_DYNAMIC (weight-only fallback)" and kc["comparable_for_speed"] is False
    assert "native support for FP8" in kc["reason"]
    fast = {
        "kernels": [{"kernel": "CutlassFP8ScaledMMLinearKernel", "method": "CompressedTensorsW8A8Fp8"}],
        "fallback": False,
    }
    kc = kernels.kernel_check("FP8_DYNAMIC", fast, activation_quantized=True)
    assert kc["effective_label"] == "FP8_DYNAMIC" and kc["comparable_for_speed"] is True
    assert kc["kernels"] == ["CutlassFP8ScaledMMLinearKernel (CompressedTensorsW8A8Fp8)"]
    assert kernels.kernel_check("W8A8", {"kernels": [], "fallback": None}, True)["comparable_for_speed"] is None
    assert kernels.kernel_check("BF16", {"kernels": []}, False)["comparable_for_speed"] is True
    emu = {"kernels": [{"kernel": "EmulationKernel", "method": "CompressedTensorsW4A4"}], "fallback": True}
    assert kernels.kernel_check("W4A4", emu, True)["effective_label"] == "W4A4 (emulated)"


def test_cpu_concurrency_profile_composes() -> None:
    cfg = compose(["bench=cpu-concurrency"])
    assert cfg.bench.mode == "concurrency" and list(cfg.bench.concurrencies) == [1, 4]
    assert cfg.bench.num_prompts == 8
    points = sweep_plan.plan(cfg.bench.mode, list(cfg.bench.rates), list(cfg.bench.concurrencies), cfg.bench.repeats)
    assert [p.name for p in points] == ["conc-1_r0", "conc-4_r0"]
