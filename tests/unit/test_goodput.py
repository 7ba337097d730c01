"""Per-request goodput (measure/goodput.py) against values worked out by hand."""

from __future__ import annotations

import pytest

from per_item_records import bench_result
from quantverdict.measure.goodput import Slo, goodput, request_latencies

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
