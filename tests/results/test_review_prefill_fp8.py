"""The prefill-heavy shape on the H200 (two machines, 2,048 in / 128 out, concurrency 1, 16,
64 and 256, three repeats, bf16 beside FP8_DYNAMIC, then beside W8A8, each pair on one GPU): both 8-bit W8A8 schemes
pay at every load, and at concurrency 256 the two ceilings rest on different windows, which the speed table says
Expected values worked out from the records' per-run ``output_tok_s``, ``steady_output_tok_s``,
``steady_window_s`` and ``e2e_ms_p50`` (``docs/results/gpu-cache-free/prefill-fp8-grid/records`` and
``prefill-w8a8-grid/records``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from quantverdict.config.schema import ReviewConfig
from quantverdict.measure.sweep import basis_of
from quantverdict.review import build_review
from quantverdict.review.render import markdown
from quantverdict.review.sources import load_dir

GRIDS = Path(__file__).resolve().parents[2] / "docs" / "results" / "gpu-cache-free"


@pytest.fixture(scope="module")
def review() -> Any:
    records, _ = load_dir(GRIDS / "prefill-fp8-grid" / "records")
    return build_review(records, ReviewConfig(log_to_mlflow=False, bootstrap_samples=200), "t")


def test_fp8_pays_at_saturation_paired_by_repeat(review: Any) -> None:
    row = next(r for r in next(iter(review.regime.values())) if r.scheme == "fp8")
    sat = next(p for p in row.paired if p.metric == "output_tok_s" and p.load == 256)
    # c=256 output tok/s by repeat: 3,002.08 / 2,098.08, 2,967.67 / 2,094.28, 2,965.17 / 2,090.60 = 1.43087,
    # 1.41704, 1.41833; logs 0.35829, 0.34855, 0.34946, mean 0.35210 -> 1.4221; sd 0.005381, se 0.003107,
    # t(2) 4.303: exp(0.35210 -+ 0.01337) = [1.4032, 1.4412]
    assert sat.speedup == pytest.approx(1.4221, abs=2e-4) and sat.verdict == "faster"
    assert sat.speedup_low == pytest.approx(1.4032, abs=5e-4)
    assert sat.speedup_high == pytest.approx(1.4412, abs=5e-4)


def test_the_ceilings_name_their_windows_when_they_differ(review: Any) -> None:
    cards = {c.scheme: c for c in review.scorecards}
    # bf16 at c=256: steady windows 29.3-29.6 s against 2 x E2E p50 (15.5-16.5 s) = 31.0-32.9 s: too short, so the
    # whole runs stand, 2,098.08 / 2,094.28 / 2,090.60 -> median 2,094.28
    bf16, fp8 = cards["bf16"].speed, cards["fp8"].speed
    assert bf16.ceiling.basis == "whole_run" and bf16.ceiling.output_tok_s == pytest.approx(2094.28, abs=0.01)
    # FP8 at c=256: windows 31.4-31.7 s against 2 x 10.8-11.1 s: steady, 2,912.61 / 2,953.15 / 2,837.97 -> 2,912.61
    assert fp8.ceiling.basis == "steady_window" and fp8.ceiling.output_tok_s == pytest.approx(2912.61, abs=0.01)
    assert review.verdicts[0].ceilings_differ_in_basis  # the page names each ceiling's window
    c16, c8 = (
        review.scheme(bf16_model := cards["bf16"].model, "bf16").speed.ceiling,
        review.scheme(bf16_model, "fp8").speed.ceiling,
    )
    assert c16 is not None and c16.basis == "whole_run" and c16.output_tok_s_range is not None
    assert (round(c16.output_tok_s_range.min, 1), round(c16.output_tok_s_range.max, 1)) == (2090.6, 2098.1)
    assert c8 is not None and c8.basis == "steady_window" and c8.output_tok_s_range is not None
    assert (round(c8.output_tok_s_range.min, 1), round(c8.output_tok_s_range.max, 1)) == (2838.0, 2953.2)
    md = markdown(review)  # one rendered check: the window named in the cell
    assert "2094.3 [2090.6-2098.1] (whole run) |" in md and "2912.6 [2838.0-2953.2] (steady window) |" in md


def test_one_window_for_all_ceilings_is_not_named() -> None:
    # the decode pair (bf16 and W4A16): both ceilings at c=256 are whole runs (windows under two lifetimes)
    records, _ = load_dir(GRIDS / "decode-gptq-grid" / "records")
    doc = build_review(records, ReviewConfig(log_to_mlflow=False, bootstrap_samples=200), "t")
    assert not doc.verdicts[0].ceilings_differ_in_basis


def test_basis_of_repeats() -> None:
    steady, whole = {"throughput_basis": "steady_window"}, {"throughput_basis": "whole_run"}
    assert basis_of([whole, whole, whole]) == "whole_run"
    assert basis_of([steady, whole, steady]) == "mixed"
    assert basis_of([steady]) == "steady_window"
    assert basis_of([{}, {"throughput_basis": None}]) is None


def test_w8a8_pays_at_saturation_and_its_ceiling_is_steady() -> None:
    # the second machine: W8A8 beside its own bf16 in the same shape, on another H200
    records, _ = load_dir(GRIDS / "prefill-w8a8-grid" / "records")
    review = build_review(records, ReviewConfig(log_to_mlflow=False, bootstrap_samples=200), "t")
    row = next(r for r in next(iter(review.regime.values())) if r.scheme == "w8a8")
    sat = next(p for p in row.paired if p.metric == "output_tok_s" and p.load == 256)
    # c=256 output tok/s by repeat: 3,008.29 / 2,045.62, 2,981.38 / 2,042.38, 2,991.67 / 2,039.87 = 1.47060,
    # 1.45976, 1.46660; logs 0.38567, 0.37827, 0.38295, mean 0.38230 -> 1.4656; sd 0.003743, se 0.002161,
    # t(2) 4.303: exp(0.38230 -+ 0.00930) = [1.4521, 1.4793]
    assert sat.speedup == pytest.approx(1.4656, abs=2e-4) and sat.verdict == "faster"
    assert sat.speedup_low == pytest.approx(1.4521, abs=5e-4)
    assert sat.speedup_high == pytest.approx(1.4793, abs=5e-4)
    cards = {c.scheme: c for c in review.scorecards}
    # bf16: windows 29.9-30.4 s against 2 x E2E p50 15.9-16.1 s = 31.8-32.2 s: whole runs, median 2,042.38;
    # W8A8: 31.3-31.9 s against 2 x 10.8-10.9 s: steady, 2,875.51 / 2,973.90 / 2,812.47 -> 2,875.51
    assert cards["bf16"].speed.ceiling.basis == "whole_run"
    assert cards["bf16"].speed.ceiling.output_tok_s == pytest.approx(2042.38, abs=0.01)
    assert cards["w8a8"].speed.ceiling.basis == "steady_window"
    assert cards["w8a8"].speed.ceiling.output_tok_s == pytest.approx(2875.51, abs=0.01)


def test_unpaired_ceilings_of_different_windows_are_compared_on_whole_runs() -> None:
    # the first machine's pair, as if FP8 had run on another GPU: no ratio paired by repeat, so the saturation claim
    # rests on the ceilings; bf16's is a whole run (2,094.28), FP8's a steady window (2,912.61), which would give
    # 2,912.61 / 2,094.28 = 1.3907. Both whole runs instead: FP8 3,002.08 / 2,967.67 / 2,965.17 -> 2,967.67 over
    # 2,094.28 = 1.4170; range [2,965.17 / 2,098.08, 3,002.08 / 2,090.60] = [1.4133, 1.4360]
    records, _ = load_dir(GRIDS / "prefill-fp8-grid" / "records")
    for rec in records:
        if rec.job.scheme == "fp8":
            (rec.environment.gpu or [])[0]["uuid"] = "GPU-00000000-1111-2222-3333-444455556666"
    review = build_review(records, ReviewConfig(log_to_mlflow=False, bootstrap_samples=200), "t")
    row = next(r for r in next(iter(review.regime.values())) if r.scheme == "fp8")
    assert row.paired == [] and row.saturation_claim.rule == "min-max range"
    assert row.saturation_speedup == pytest.approx(1.4170, abs=2e-4)
    assert (row.saturation_range.min, row.saturation_range.max) == pytest.approx((1.4133, 1.4360), abs=2e-4)
    assert row.saturation_claim.class_ == "pays"
