"""The decode-heavy shape on the H200 (128 in / 1,024 out, concurrency 16, 64 and 256,
three repeats, bf16 and W4A16 (GPTQ, Machete) on one GPU): W4A16 pays at low load and stops paying at
concurrency 256, and at 256 the review reads the whole run, not a steady window shorter than two request
lifetimes. Expected values worked out from the per-run output tok/s in
``docs/results/gpu-cache-free/decode-gptq-grid/gpu-llama3.1-8b-shape.md`` and the records' ``steady_window_s`` /
``e2e_ms_p50``.
"""

from __future__ import annotations

from typing import Any

import pytest

from committed_reviews import build, paired


@pytest.fixture(scope="module")
def review() -> Any:
    return build("decode-gptq")


def test_w4a16_pays_at_low_load_only(review: Any) -> None:
    # c=16 output tok/s by repeat: 3,501.9 / 2,804.0, 3,525.0 / 2,805.9, 3,525.6 / 2,803.3 = 1.2489, 1.2563,
    # 1.2577: geometric mean 1.2543
    low = paired(review, "gptq", "output_tok_s", 16)
    assert low.speedup == pytest.approx(1.2543, abs=2e-4) and low.verdict == "faster"
    # c=256: 12,346.1 / 13,540.0, 11,460.3 / 14,758.1, 12,105.4 / 14,061.6 = 0.9118, 0.7765, 0.8609: 0.848, but
    # three pairs this far apart (t with 2 degrees of freedom) leave 1 inside the interval
    sat = paired(review, "gptq", "output_tok_s", 256)
    assert sat.speedup == pytest.approx(0.848, abs=1e-3) and sat.verdict == "no difference established"


def test_the_ceiling_is_the_whole_run_where_the_window_is_a_wave(review: Any) -> None:
    cards = {c.scheme: c for c in review.scorecards}
    # bf16 at c=256: steady windows of 0.73-1.18 s against an E2E p50 of 16.8-18.9 s (two waves of 256); the whole
    # runs made 13,540.0, 14,758.1 and 14,061.6 tok/s: median 14,061.6, where the windows read 10,166-15,613
    assert cards["bf16"].speed.ceiling.output_tok_s == pytest.approx(14061.6, abs=0.1)
    assert cards["gptq"].speed.ceiling.output_tok_s == pytest.approx(12105.4, abs=0.1)
    lines = [v for v in review.validity if "whole run's" in v]
    assert len(lines) == 2 and lines[0].startswith("bf16 (BF16): throughput at concurrency 256 (3 of its points)")
    assert "steady window (0.729-1.18 s) was shorter than 2 request lifetimes (E2E p50 16.8-18.9 s)" in lines[0]
