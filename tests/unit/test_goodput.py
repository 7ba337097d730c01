"""Per-request goodput (measure/goodput.py) against values worked out by hand."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from per_item_records import bench_result, write_bench_result
from quantverdict.config.schema import ReviewConfig
from quantverdict.config.validate import review_errors
from quantverdict.measure.bench_result import completed_requests, latency_samples
from quantverdict.measure.goodput import Slo, goodput, request_latencies
from quantverdict.results.record import JobRecord
from quantverdict.review.document import Scheme
from quantverdict.review.speed import NO_PER_REQUEST, speed_summary
from quantverdict.review.verdict import FAIL, PASS, latency_check
from quantverdict.review.words import say
from review_records import blank_scheme, record

# five requests sent over a 10 s benchmark, (TTFT s, E2E s, output tokens):
#   0: 0.5, 3.6, 32 -> TPOT (3.6 - 0.5) / 31 = 100 ms                 meets TTFT <= 1000 and TPOT <= 150
#   1: 1.2, 4.3, 32 -> TPOT 100 ms, TTFT 1200 ms > 1000                 misses TTFT
#   2: 0.4, 6.6, 32 -> TPOT (6.6 - 0.4) / 31 = 200 ms > 150             misses TPOT
#   3: 1.0, 1.0, 1  -> one token: TPOT 0 (vLLM), TTFT 1000 ms == 1000   meets both (<= is met)
#   4: failed                                                           never good
# good = 2 -> goodput 2 / 10 s = 0.2 req/s; attainment 2 / 5 sent = 40%
RESULT = bench_result([(0.5, 3.6, 32), (1.2, 4.3, 32), (0.4, 6.6, 32), (1.0, 1.0, 1), None], duration_s=10.0)
SLO = Slo(ttft_ms=1000.0, tpot_ms=150.0)


def test_goodput_by_hand() -> None:
    g = goodput(RESULT, SLO)
    assert (g.sent, g.completed, g.good) == (5, 4, 2)
    assert g.goodput_rps == pytest.approx(0.2) and g.attainment_pct == pytest.approx(40.0)
    assert g.missed == {"ttft": 1, "tpot": 1}
    assert g.to_dict()["slo_requests"] == 5 and g.to_dict()["good_requests"] == 2
    assert SLO.describe() == "TTFT <= 1,000 ms and TPOT <= 150 ms"


def test_per_request_tpot_is_vllms() -> None:
    reqs = request_latencies(RESULT)
    assert reqs[4] is None
    assert [round(r.value("tpot"), 6) for r in reqs if r is not None] == [100.0, 100.0, 200.0, 0.0]
    assert reqs[0] is not None and reqs[0].value("e2e") == pytest.approx(3600.0)


def test_every_objective_must_hold() -> None:
    # TTFT alone: requests 0, 2, 3 -> 3 good, 0.3 req/s. All three with E2E <= 3500 ms: request 0 (3600 ms)
    # drops out, request 3 (1000 ms) stays -> 1 good; E2E misses: 0 (3600), 1 (4300), 2 (6600) = 3
    assert goodput(RESULT, Slo(ttft_ms=1000.0)).good == 3
    assert goodput(RESULT, Slo(ttft_ms=1000.0)).goodput_rps == pytest.approx(0.3)
    g = goodput(RESULT, Slo(ttft_ms=1000.0, tpot_ms=150.0, e2e_ms=3500.0))
    assert g.good == 1 and g.missed == {"ttft": 1, "tpot": 1, "e2e": 3}
    with pytest.raises(ValueError, match="at least one objective"):
        goodput(RESULT, Slo())


def test_no_per_request_data_is_refused() -> None:
    with pytest.raises(ValueError, match="no per-request data"):
        goodput({"duration": 10.0, "completed": 5}, SLO)


# --- the review: goodput at the stated load and the verdict's latency check -----------------------------------

RC = ReviewConfig(log_to_mlflow=False, ttft_ms_p99=1000.0, itl_ms_p99=150.0, load_rps=1.0)
ALL_GOOD = bench_result([(0.5, 3.6, 32)] * 4, duration_s=4.0)  # 4 of 4 good over 4 s: 1.0 req/s, 100%


def _rec(tmp: Path, results: list[dict[str, Any]]) -> dict[str, Any]:
    """bf16 of review_records with its 1 req/s point repeated once per result, each pointing to its file."""
    rec = record("bf16")
    one, burst = rec["speed"]["points"]
    pts = []
    for i, res in enumerate(results):
        pts.append({**one, "repeat": i, "result_file": write_bench_result(tmp, f"rate-1_r{i}", res)})
    rec["speed"]["points"] = [*pts, burst]
    return rec


def _card(rec: dict[str, Any], rc: ReviewConfig = RC) -> Scheme:
    sp, _, missing = speed_summary(JobRecord.view(rec), rc)
    assert not missing
    sc = blank_scheme("j", "bf16", "BF16", is_baseline=True)
    sc.speed = sp
    return sc


def test_latency_check_counts_requests(tmp_path: Path) -> None:
    sc = _card(_rec(tmp_path, [RESULT]))
    # RESULT: 2 of 5 requests good over 10 s -> 0.2 req/s, 40%; the point's p99s are those review_records wrote
    assert sc.speed.goodput_rps == pytest.approx(0.2)
    assert say("goodput_how", "speed.j2", sp=sc.speed) == "at 1 req/s: 2 of 5 requests met the SLO (40.0%)"
    c = latency_check(sc, RC)
    assert c.outcome == FAIL
    assert c.text.startswith(
        "2 of 5 requests (40.0%) met TTFT <= 1,000 ms and TPOT <= 150 ms (< 99% needed) at 1 req/s"
    )
    assert c.cite == "TTFT <= 1,000 ms and TPOT <= 150 ms for 40.0% of requests (< 99%) at 1 req/s"
    assert c.shortfall == (
        "only 40.0% of requests met every objective, 59.0 points under 99% "
        "(requests over each objective: TTFT 1, TPOT 1)"
    )
    assert c.excess == pytest.approx(59 / 99)
    assert latency_check(sc, replace(RC, slo_attainment_pct=40.0)).outcome == PASS  # 40% >= 40%


def test_latency_check_passes_and_repeats_take_the_median(tmp_path: Path) -> None:
    sc = _card(_rec(tmp_path, [ALL_GOOD]))
    assert sc.speed.goodput_rps == pytest.approx(1.0)
    assert latency_check(sc, RC).outcome == PASS
    # two repeats: 40% and 100% -> median 70%, goodput median (0.2 + 1.0) / 2 = 0.6; 6 of 9 requests good
    sc = _card(_rec(tmp_path, [RESULT, ALL_GOOD]))
    assert sc.speed.goodput_rps == pytest.approx(0.6)
    assert say("goodput_how", "speed.j2", sp=sc.speed).endswith(
        "6 of 9 requests met the SLO (70.0%, median of 2 repeats)"
    )
    # an E2E objective of 3500 ms: ALL_GOOD's requests take 3600 ms -> none good
    sc = _card(_rec(tmp_path, [ALL_GOOD]), replace(RC, e2e_ms=3500.0))
    assert sc.speed.goodput_rps == 0.0
    assert latency_check(sc, replace(RC, e2e_ms=3500.0)).outcome == FAIL


def test_result_file_found_beside_a_moved_record(tmp_path: Path) -> None:
    rec = _rec(tmp_path, [ALL_GOOD])
    (tmp_path / "job" / "bench").mkdir(parents=True)
    Path(rec["speed"]["points"][0]["result_file"]).rename(tmp_path / "job" / "bench" / "rate-1_r0.json")
    rec["_review_dir"] = str(tmp_path / "job")
    assert _card(rec).speed.goodput_rps == pytest.approx(1.0)


def test_no_per_request_data_is_said_not_invented() -> None:
    sc = _card(record("bf16"))  # review_records' points have no result file
    assert sc.speed.goodput_rps is None and sc.speed.goodput_missing == "no_per_request"
    c = latency_check(sc, RC)
    assert c.outcome == PASS and c.text.endswith(
        f"({NO_PER_REQUEST}: judged on the p99s, not per request); ceiling 9.38 req/s"
    )


def test_goodput_settings_are_checked() -> None:
    assert review_errors(replace(RC, slo_attainment_pct=0.0)) == [
        "review.slo_attainment_pct=0.0 must be in (0, 100], e.g. 99"
    ]
    assert review_errors(replace(RC, e2e_ms=-1.0)) == ["review.e2e_ms=-1.0 must be > 0 or null"]


def test_percentiles_and_goodput_drop_the_same_failed_requests() -> None:
    # request 1 has tokens but an error string, request 2 no error but no token: with an errors list only
    # request 1 failed; without one, only request 2 (0 output tokens) did
    base = {
        "start_times": [0.0, 0.0, 0.0],
        "ttfts": [0.1, 0.2, 0.3],
        "itls": [[0.05], [0.05], []],
        "latencies": [0.15, 0.25, 0.3],
    }
    with_errors = {**base, "output_lens": [2, 2, 0], "errors": ["", "timeout", ""]}
    without = {**base, "output_lens": [2, 2, 0]}
    assert completed_requests(with_errors) == [0, 2] and completed_requests(without) == [0, 1]
    assert [r is None for r in request_latencies(with_errors)] == [False, True, False]
    assert [r is None for r in request_latencies(without)] == [False, False, True]
    assert latency_samples(with_errors)["ttft"] == [0.1, 0.3] and latency_samples(without)["ttft"] == [0.1, 0.2]
