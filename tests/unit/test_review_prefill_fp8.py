"""The prefill-heavy shape on the H200 (eighth lease, 2026-12-02, 2,048 in / 128 out, concurrency 1, 16, 64 and
256, three repeats, bf16 and FP8_DYNAMIC on one GPU): FP8 pays at every load, and at concurrency 256 the two
ceilings rest on different windows, which the speed table says (issue #16). Expected values worked out from the
records' per-run ``output_tok_s``, ``steady_output_tok_s``, ``steady_window_s`` and ``e2e_ms_p50``
(``docs/results/gpu-cache-free/prefill-fp8-grid/records``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from quantverdict.config.schema import ReviewConfig
from quantverdict.measure.sweep import basis_of
from quantverdict.review import build_review
from quantverdict.review.render import blocks, to_markdown
from quantverdict.review.sources import load_dir

GRIDS = Path(__file__).resolve().parents[2] / "docs" / "results" / "gpu-cache-free"


@pytest.fixture(scope="module")
def review() -> Any:
    records, _ = load_dir(GRIDS / "prefill-fp8-grid" / "records")
    return build_review(records, ReviewConfig(log_to_mlflow=False, bootstrap_samples=200), "t")


def test_fp8_pays_at_saturation_paired_by_repeat(review: Any) -> None:
    row = next(r for r in next(iter(review.regime.values())) if r["scheme"] == "fp8")
    sat = next(p for p in row["paired"] if p["metric"] == "output_tok_s" and p["load"] == 256)
    # c=256 output tok/s by repeat: 3,002.08 / 2,098.08, 2,967.67 / 2,094.28, 2,965.17 / 2,090.60 = 1.43087,
    # 1.41704, 1.41833; logs 0.35829, 0.34855, 0.34946, mean 0.35210 -> 1.4221; sd 0.005381, se 0.003107,
    # t(2) 4.303: exp(0.35210 -+ 0.01337) = [1.4032, 1.4412]
    assert sat["speedup"] == pytest.approx(1.4221, abs=2e-4) and sat["verdict"] == "faster"
    assert sat["speedup_low"] == pytest.approx(1.4032, abs=5e-4)
    assert sat["speedup_high"] == pytest.approx(1.4412, abs=5e-4)


def test_the_ceilings_name_their_windows_when_they_differ(review: Any) -> None:
    cards = {c.scheme: c for c in review.cards}
    # bf16 at c=256: steady windows 29.3-29.6 s against 2 x E2E p50 (15.5-16.5 s) = 31.0-32.9 s: too short, so the
    # whole runs stand, 2,098.08 / 2,094.28 / 2,090.60 -> median 2,094.28
    bf16, fp8 = cards["bf16"].speed, cards["fp8"].speed
    assert bf16["ceiling_basis"] == "whole_run" and bf16["ceiling_tok_s"] == pytest.approx(2094.28, abs=0.01)
    # FP8 at c=256: windows 31.4-31.7 s against 2 x 10.8-11.1 s: steady, 2,912.61 / 2,953.15 / 2,837.97 -> 2,912.61
    assert fp8["ceiling_basis"] == "steady_window" and fp8["ceiling_tok_s"] == pytest.approx(2912.61, abs=0.01)
    md = to_markdown(blocks(review, {}))
    assert "2094.3 [2090.6-2098.1] (whole run) |" in md
    assert "2912.6 [2838.0-2953.2] (steady window) |" in md
    assert "The ceilings below rest on different windows" in md


def test_one_window_for_all_ceilings_is_not_named() -> None:
    # the decode pair (seventh lease): both ceilings at c=256 are whole runs (windows under two lifetimes)
    records, _ = load_dir(GRIDS / "decode-gptq-grid" / "records")
    md = to_markdown(blocks(build_review(records, ReviewConfig(log_to_mlflow=False, bootstrap_samples=200), "t"), {}))
    assert "(whole run) |" not in md and "different windows" not in md


def test_basis_of_repeats() -> None:
    steady, whole = {"throughput_basis": "steady_window"}, {"throughput_basis": "whole_run"}
    assert basis_of([whole, whole, whole]) == "whole_run"
    assert basis_of([steady, whole, steady]) == "mixed"
    assert basis_of([steady]) == "steady_window"
    assert basis_of([{}, {"throughput_basis": None}]) is None
