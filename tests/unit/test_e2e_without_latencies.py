"""vLLM 0.26's ``--save-detailed`` result has ``ttfts`` and ``itls`` but no ``latencies``: E2E = TTFT + sum(ITL).

Found on the H200: every per-request figure of the one-process sweep (goodput, steady-state window,
request times) was missing for vLLM 0.26 results, because they all required the ``latencies`` list.
"""

from __future__ import annotations

import pytest

from quantverdict.measure.bench_result import e2e_s, has_detailed, latency_samples, request_times
from quantverdict.measure.goodput import Slo, goodput

# two requests sent 0.5 s apart: TTFT 100 ms then gaps 10 + 20 ms (3 tokens); TTFT 200 ms then one gap of 30 ms
# (2 tokens); E2E by hand: 0.13 s and 0.23 s; TPOT = (E2E - TTFT) / (n - 1) = 15 ms and 30 ms
RESULT = {
    "start_times": [100.0, 100.5],
    "ttfts": [0.1, 0.2],
    "itls": [[0.01, 0.02], [0.03]],
    "output_lens": [3, 2],
    "errors": ["", ""],
    "duration": 1.0,
    "completed": 2,
}


def test_e2e_is_ttft_plus_the_itl_gaps() -> None:
    assert has_detailed(RESULT)
    assert e2e_s(RESULT) == pytest.approx([0.13, 0.23])
    lat = latency_samples(RESULT)
    assert lat["tpot"] == pytest.approx([0.015, 0.03])
    assert lat["e2e"] == pytest.approx([0.13, 0.23])
    times = request_times(RESULT)
    assert times is not None and times["end_s"] == pytest.approx([0.13, 0.73])


def test_saved_latencies_win_and_must_match_in_length() -> None:
    assert e2e_s({**RESULT, "latencies": [0.5, 0.6]}) == [0.5, 0.6]
    assert not has_detailed({**RESULT, "latencies": [0.5]})


def test_goodput_counts_per_request_without_latencies() -> None:
    # TPOT objective 20 ms: the first request (15 ms) meets it, the second (30 ms) does not -> 1 of 2
    g = goodput(RESULT, Slo(ttft_ms=1000.0, tpot_ms=20.0)).to_dict()
    assert (g["good_requests"], g["slo_requests"]) == (1, 2)
    assert g["slo_attainment_pct"] == pytest.approx(50.0)
