"""The decode-heavy shape on the H200 for FP8_DYNAMIC (128 in / 1,024 out,
concurrency 16, 64 and 256, three repeats, bf16 and FP8_DYNAMIC on one GPU, the JIT caches carried): FP8 pays at
16 and 64 concurrent requests and establishes no difference at 256, where the review reads whole runs; and the
benchmark split shows both jobs over server start + windows + 10% (the stage, not only the client's overhead).
Expected values worked out from the per-run output tok/s in
``docs/results/gpu-cache-free/decode-fp8-grid/gpu-llama3.1-8b-shape.md`` and the records' ``speed.time_split``
and ``stages.benchmark.wall_s``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from committed_reviews import build, paired, records_dir
from quantverdict.results.table import benchmark_split_table

RECORDS = records_dir("decode-fp8")


@pytest.fixture(scope="module")
def review() -> Any:
    return build("decode-fp8")


def test_fp8_pays_at_16_and_64_and_no_difference_is_established_at_256(review: Any) -> None:
    # c=16 output tok/s by repeat: 4,044.6 / 2,957.9, 4,013.0 / 2,954.8, 4,058.1 / 2,963.1 = 1.3674, 1.3581, 1.3695:
    # geometric mean 1.3650, interval 1.350-1.380 (t = 4.303 with 2 degrees of freedom)
    low = paired(review, "fp8", "output_tok_s", 16)
    assert low.speedup == pytest.approx(1.3650, abs=2e-4) and low.verdict == "faster"
    # c=64: 11,545.6 / 8,928.1, 11,629.2 / 8,933.4, 11,634.7 / 8,933.4 = 1.2932, 1.3018, 1.3024: 1.2991
    mid = paired(review, "fp8", "output_tok_s", 64)
    assert mid.speedup == pytest.approx(1.2991, abs=2e-4) and mid.verdict == "faster"
    # c=256: 13,738.1 / 12,506.6, 12,678.0 / 13,927.0, 13,927.3 / 13,441.8 = 1.0985, 0.9103, 1.0361: 1.0119, and the
    # interval 0.797-1.285 holds 1
    sat = paired(review, "fp8", "output_tok_s", 256)
    assert sat.speedup == pytest.approx(1.0119, abs=2e-4) and sat.verdict == "no difference established"
    assert (sat.speedup_low, sat.speedup_high) == pytest.approx((0.797, 1.285), abs=1e-3)


def test_the_ceilings_are_whole_runs(review: Any) -> None:
    cards = {c.scheme: c for c in review.scorecards}
    # c=256 steady windows (bf16 16.9-24.1 s, FP8 0.88-1.51 s) are under two request lifetimes (E2E p50 17.4-20.2 s):
    # the whole runs stand, medians 13,441.8 (of 12,506.6 / 13,927.0 / 13,441.8) and 13,738.1 (of 13,738.1 /
    # 12,678.0 / 13,927.3)
    assert cards["bf16"].speed.ceiling.output_tok_s == pytest.approx(13441.8, abs=0.1)
    assert cards["fp8"].speed.ceiling.output_tok_s == pytest.approx(13738.1, abs=0.1)


def test_both_jobs_take_more_than_start_plus_windows_plus_ten_percent() -> None:
    records = [json.loads((RECORDS / "llama3.1-8b-shape" / s / "record.json").read_text()) for s in ("bf16", "fp8")]
    text = benchmark_split_table(records)
    # bf16: stage 536.3 s over start 75.1 + windows 404.2 = 479.3 s: 11.9%; the client's overhead 50.6 s is 10.6%,
    # 31.7 s of it the warm-up waves; the rest 536.3 - 479.3 - 50.6 = 6.4 s (HBM probe, server stop)
    bf16 = (
        "| 75 | 6 / 4 / 0 (cache hit) | 404 (9 points) | 51 (warm-up waves 32) | 6 | 0 | 536 | 10.6% | 11.9% **> 10%**"
    )
    assert bf16 in text
    # FP8: 532.1 over 131.1 + 345.3 = 476.4: 11.7%; the rest 532.1 - 476.4 - 49.9 = 5.7 s
    fp8 = "| 131 | 50 / 5 / 0 (cache miss) | 345 (9 points) | 50 (warm-up waves 32) | 6 | 0 | 532 | 10.5% | 11.7% **>"
    assert fp8 in text
