"""The decode-heavy shape on the H200 for W8A8 (128 in / 1,024 out, concurrency 16,
64 and 256, three repeats, bf16 and W8A8 int8 on one GPU, the JIT caches carried): W8A8 pays at 16 and 64
concurrent requests and establishes no difference at 256, where the review reads whole runs; and the benchmark
split shows both jobs over server start + windows + 10%. Expected values worked out from the per-run output tok/s in
``docs/results/gpu-cache-free/decode-w8a8-grid/gpu-llama3.1-8b-shape.md`` and the records' ``speed.time_split``
and ``stages.benchmark.wall_s``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from committed_reviews import build, paired, records_dir
from quantverdict.results.table import benchmark_split_table

RECORDS = records_dir("decode-w8a8")


@pytest.fixture(scope="module")
def review() -> Any:
    return build("decode-w8a8")


def test_w8a8_pays_at_16_and_64_and_no_difference_is_established_at_256(review: Any) -> None:
    # c=16 output tok/s by repeat: 3,703.6 / 2,969.9, 3,675.5 / 2,975.7, 3,677.5 / 2,966.1 = 1.2470, 1.2352, 1.2399:
    # geometric mean 1.2407, interval 1.226-1.256 (t = 4.303 with 2 degrees of freedom)
    low = paired(review, "w8a8", "output_tok_s", 16)
    assert low.speedup == pytest.approx(1.2407, abs=2e-4) and low.verdict == "faster"
    assert (low.speedup_low, low.speedup_high) == pytest.approx((1.226, 1.256), abs=1e-3)
    # c=64: 11,079.2 / 9,067.7, 10,327.2 / 9,079.9, 11,379.6 / 9,095.5 = 1.2218, 1.1374, 1.2511: 1.2025; W8A8's r1 dip
    # widens the interval to 1.063-1.360, which still excludes 1
    mid = paired(review, "w8a8", "output_tok_s", 64)
    assert mid.speedup == pytest.approx(1.2025, abs=2e-4) and mid.verdict == "faster"
    assert (mid.speedup_low, mid.speedup_high) == pytest.approx((1.063, 1.360), abs=1e-3)
    # c=256: 14,714.0 / 15,142.3, 15,773.5 / 13,557.9, 14,825.4 / 12,590.5 = 0.9717, 1.1634, 1.1775: 1.1001, and the
    # interval 0.842-1.437 holds 1 (bf16's runs fell one after another, W8A8's did not)
    sat = paired(review, "w8a8", "output_tok_s", 256)
    assert sat.speedup == pytest.approx(1.1001, abs=2e-4) and sat.verdict == "no difference established"
    assert (sat.speedup_low, sat.speedup_high) == pytest.approx((0.842, 1.437), abs=1e-3)


def test_the_ceilings_are_whole_runs(review: Any) -> None:
    cards = {c.scheme: c for c in review.scorecards}
    # c=256 steady windows (bf16 17.3-22.3 s, W8A8 1.0-1.6 s) are under two request lifetimes (E2E p50 16.0-21.2 s):
    # the whole runs stand, medians 13,557.9 (of 15,142.3 / 13,557.9 / 12,590.5) and 14,825.4 (of 14,714.0 /
    # 15,773.5 / 14,825.4)
    assert cards["bf16"].speed.ceiling.output_tok_s == pytest.approx(13557.9, abs=0.1)
    assert cards["w8a8"].speed.ceiling.output_tok_s == pytest.approx(14825.4, abs=0.1)


def test_both_jobs_take_more_than_start_plus_windows_plus_ten_percent() -> None:
    records = [json.loads((RECORDS / "llama3.1-8b-shape" / s / "record.json").read_text()) for s in ("bf16", "w8a8")]
    text = benchmark_split_table(records)
    # bf16: stage 531.6 s over start 80.1 + windows 396.5 = 476.6 s: 11.5%; the client's overhead 49.1 s is 10.3%,
    # 30.9 s of it the warm-up waves; the rest 531.6 - 476.6 - 49.1 = 5.9 s (HBM probe, server stop)
    bf16 = (
        "| 80 | 6 / 5 / 1 (cache hit) | 396 (9 points) | 49 (warm-up waves 31) | 6 | 0 | 532 | 10.3% | 11.5% **> 10%**"
    )
    assert bf16 in text
    # W8A8: 516.8 over 109.1 + 350.4 = 459.5: 12.5%; overhead 51.0 s (11.1%); the rest 516.8 - 459.5 - 51.0 = 6.2 s;
    # torch.compile missed the carried cache (no 8B W8A8 graph in it): 32.6 s
    w8a8 = "| 109 | 33 / 4 / 0 (cache miss) | 350 (9 points) | 51 (warm-up waves 34) | 6 | 0 | 517 | 11.1% | 12.5% **>"
    assert w8a8 in text
