"""The review's regime claims rest on the ratio to the baseline paired by repeat: Student's t on the
per-repeat log ratios at the same load, 95% CI; "faster" / "slower" when the interval excludes 1, "no difference
established" when it holds 1. A single run, or repeats that do not pair, fall back to the 1.05x rule on the median
and its min-max range, and the text says which rule was used.

Every record is a two-point rate sweep (1 req/s and the unlimited rate) of :mod:`review_records`; the low-load claim
is ITL p50 at 1 req/s (baseline / scheme), the saturation claim output tok/s at the unlimited rate (scheme /
baseline). t(0.975) is 4.303 for 2 degrees of freedom (3 pairs) and 12.706 for 1 (2 pairs).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from quantverdict.config.schema import ReviewConfig
from quantverdict.review import build_review, to_json
from quantverdict.review.document import PairedSpeedup, Regime, RegimeReading
from quantverdict.review.render import markdown
from quantverdict.review.words import say
from review_records import point, record

RC = ReviewConfig(log_to_mlflow=False, bootstrap_samples=1000)


def sweep(itl: list[float], tok: list[float], invalid: tuple[int, ...] = ()) -> dict[str, Any]:
    """Repeat ``r`` of both points: ITL p50 ``itl[r]`` ms at 1 req/s, ``tok[r]`` output tok/s at the unlimited
    rate; the unlimited-rate repeats in ``invalid`` are marked invalid (e.g. prefix-cache hits)."""
    pts = []
    for r, (i, t) in enumerate(zip(itl, tok)):
        low = point(1.0, achieved=0.95, tok_s=30.0, ttft99=300, itl50=i, itl99=1.5 * i, e2e50=1400)
        sat = point(None, achieved=t / 32, tok_s=t, ttft99=1500, itl50=3 * i, itl99=6 * i, e2e50=5600)
        pts += [{**low, "repeat": r}, {**sat, "repeat": r, **({"valid": False} if r in invalid else {})}]
    return {"mode": "rate", "server_start_s": 30.0, "points": pts}


def rows(records: list[dict[str, Any]]) -> dict[str, Regime]:
    review = build_review(records, RC, "t")
    return {r.scheme: r for r in review.regime["m"]}


def paired_row(row: Regime, metric: str, load: Any) -> PairedSpeedup:
    return next(p for p in row.paired if p.metric == metric and p.load == load)


def test_three_paired_repeats_faster_slower_and_no_difference() -> None:
    base = record("bf16", sp=sweep([50, 50, 50], [100, 100, 100]))
    # w8a8 output tok/s 120, 125, 122 against 100: ratios 1.20, 1.25, 1.22; logs 0.18232, 0.22314, 0.19885,
    # mean 0.20144 (geometric mean 1.2232), sd 0.020533, half-width 4.303 x 0.020533 / sqrt(3) = 0.05101:
    # 95% CI exp(0.15043) = 1.1623 to exp(0.25245) = 1.2872 -> faster.
    # Its ITL p50 47.5, 52.5, 45 against 50: ratios scheme / baseline 0.95, 1.05, 0.90; logs -0.05129, 0.04879,
    # -0.10536, mean -0.035955, sd 0.078212, half-width 4.303 x 0.078212 / sqrt(3) = 0.19431: ratio CI 0.7943 to
    # 1.1716, as a speedup (baseline / scheme) exp(0.035955) = 1.0366 in [1 / 1.1716, 1 / 0.7943] = [0.8536, 1.2589]
    # -> no difference established.
    w8a8 = record("w8a8", sp=sweep([47.5, 52.5, 45], [120, 125, 122]))
    # gptq ITL p50 40, 41, 39: ratios 0.80, 0.82, 0.78; logs -0.223144, -0.198451, -0.248461, mean -0.223352,
    # sd 0.0250057, half-width 0.0621224: ratio CI 0.75165 to 0.85110, speedup 1.2503 in [1.1750, 1.3304] -> faster.
    # Its tok/s 80, 82, 81: logs -0.223144, -0.198451, -0.210721, mean -0.210772 (0.80998), sd 0.0123466,
    # half-width 0.0306731: CI exp(-0.241445) = 0.78551 to exp(-0.180099) = 0.83519 -> slower.
    gptq = record("gptq", sp=sweep([40, 41, 39], [80, 82, 81]))
    by = rows([base, w8a8, gptq])

    sat = paired_row(by["w8a8"], "output_tok_s", math.inf)
    assert sat.pairs == 3 and sat.label == "unlimited rate" and sat.verdict == "faster"
    assert sat.ratios == pytest.approx([1.20, 1.25, 1.22])
    assert sat.speedup == pytest.approx(1.2232, abs=1e-4)
    assert (sat.speedup_low, sat.speedup_high) == (
        pytest.approx(1.1623, abs=1e-4),
        pytest.approx(1.2872, abs=1e-4),
    )
    low = paired_row(by["w8a8"], "itl_ms_p50", 1.0)
    assert low.ratio == pytest.approx(1 / 1.0366, abs=1e-4) and low.speedup == pytest.approx(1.0366, abs=1e-4)
    assert (low.speedup_low, low.speedup_high) == (
        pytest.approx(0.8536, abs=1e-4),
        pytest.approx(1.2589, abs=1e-4),
    )
    assert low.verdict == "no difference established"
    # the claims rest on those two rows and say so
    w = by["w8a8"]
    assert w.low_load_claim.rule == "paired t" and w.saturation_claim.rule == "paired t"
    lo, sat = w.low_load_claim, w.saturation_claim
    assert (lo.load, lo.metric, lo.verdict, lo.pairs) == (1.0, "itl_ms_p50", "no difference established", 3)
    assert (lo.low, lo.high) == (pytest.approx(0.8536, abs=1e-4), pytest.approx(1.2589, abs=1e-4))
    assert (sat.load, sat.metric, sat.verdict, sat.pairs) == (math.inf, "output_tok_s", "faster", 3)
    assert [round(v, 2) for v in (sat.speedup, sat.low, sat.high)] == [1.22, 1.16, 1.29]
    assert w.reading == RegimeReading.PAYS_AT_SATURATION_ONLY
    # the old rule would have said "pays" at low load on the median (50 / 47.5 = 1.053 >= 1.05) were it a single run
    assert w.low_load_speedup == pytest.approx(50 / 47.5)

    g = by["gptq"]
    assert g.low_load_claim.speedup == pytest.approx(1.2503, abs=1e-4) and g.low_load_claim.verdict == "faster"
    assert (g.low_load_claim.low, g.low_load_claim.high) == (
        pytest.approx(1.1750, abs=1e-4),
        pytest.approx(1.3304, abs=1e-4),
    )
    assert g.saturation_claim.speedup == pytest.approx(0.80998, abs=1e-4) and g.saturation_claim.verdict == "slower"
    assert (g.saturation_claim.low, g.saturation_claim.high) == (
        pytest.approx(0.78551, abs=1e-4),
        pytest.approx(0.83519, abs=1e-4),
    )
    assert g.reading == RegimeReading.PAYS_AT_LOW_LOAD_ONLY


def test_pairing_establishes_what_the_min_max_range_cannot() -> None:
    # run-to-run drift moves both schemes together: bf16 100, 130, 115 tok/s, w8a8 106, 137, 121.
    # min-max range of the medians' ratio: [106 / 130, 137 / 100] = [0.815, 1.370]: the old rule says "no change".
    # Paired: ratios 1.06, 1.053846, 1.052174; logs 0.0582689, 0.0524458, 0.0508583, mean 0.0538577 (1.05533),
    # sd 0.00390183, half-width 4.303 x 0.00390183 / sqrt(3) = 0.00969346: CI 1.04515 to 1.06561 -> faster.
    base = record("bf16", sp=sweep([50, 50, 50], [100, 130, 115]))
    w8a8 = record("w8a8", sp=sweep([40, 40, 40], [106, 137, 121]))
    w = rows([base, w8a8])["w8a8"]
    assert (w.saturation_range.min, w.saturation_range.max) == pytest.approx((106 / 130, 137 / 100))
    sat = w.saturation_claim
    assert sat.rule == "paired t" and sat.verdict == "faster" and sat.class_ == "pays"
    assert sat.speedup == pytest.approx(1.05533, abs=1e-5)
    assert (sat.low, sat.high) == (pytest.approx(1.04515, abs=1e-5), pytest.approx(1.06561, abs=1e-5))
    # ITL 50 / 40 in every repeat: no spread, the interval collapses to 1.25 (faster)
    assert w.low_load_claim.speedup == pytest.approx(1.25) and w.low_load_claim.verdict == "faster"
    assert w.reading == RegimeReading.KEEPS_PAYING


def test_a_single_run_falls_back_to_the_105_rule_and_says_so() -> None:
    # one run each: w8a8 ITL 50 / 47.5 = 1.0526 (>= 1.05: pays), tok/s 103 / 100 = 1.03 (no change)
    base = record("bf16", sp=sweep([50], [100]))
    w8a8 = record("w8a8", sp=sweep([47.5], [103]))
    review = build_review([base, w8a8], RC, "t")
    (w,) = review.regime["m"]
    assert w.low_load_claim.rule == "single run" and w.saturation_claim.rule == "single run"
    assert w.paired and all(p.pairs == 1 and p.low is None for p in w.paired)
    assert (w.low_load_claim.class_, w.saturation_claim.class_) == ("pays", "no change")
    assert w.reading == RegimeReading.PAYS_AT_LOW_LOAD_ONLY
    (d,) = review.regime["m"]
    assert d.low_load_claim is not None and d.saturation_claim is not None
    assert (d.low_load_claim.rule, round(d.low_load_claim.speedup, 2)) == ("single run", 1.05)
    assert (d.saturation_claim.rule, round(d.saturation_claim.speedup, 2)) == ("single run", 1.03)
    assert all(p.pairs < 2 for p in d.paired)  # no paired interval: the page says the 1.05x rule decides


def test_repeats_that_do_not_pair_fall_back_to_the_min_max_range() -> None:
    # bf16's second unlimited-rate repeat is invalid: one pair left at saturation (400 / 300), no interval.
    # The medians: w8a8 (400 + 330) / 2 = 365 over bf16's 300 = 1.2167, min-max range [330 / 300, 400 / 300] =
    # [1.10, 1.33], wholly >= 1.05: pays, by the min-max rule. Low load pairs twice (ITL 40 and 40 against 50).
    base = record("bf16", sp=sweep([50, 50], [300, 310], invalid=(1,)))
    w8a8 = record("w8a8", sp=sweep([40, 40], [400, 330]))
    w = rows([base, w8a8])["w8a8"]
    assert paired_row(w, "output_tok_s", math.inf).pairs == 1
    sat = w.saturation_claim
    assert sat.rule == "min-max range" and sat.class_ == "pays" and sat.speedup == pytest.approx(365 / 300)
    assert (sat.low, sat.high) == (pytest.approx(1.10), pytest.approx(400 / 300))
    assert w.low_load_claim.rule == "paired t" and w.low_load_claim.pairs == 2


def test_paired_rows_in_review_json_and_the_table() -> None:
    base = record("bf16", sp=sweep([50, 50, 50], [100, 100, 100]))
    w8a8 = record("w8a8", sp=sweep([47.5, 52.5, 45], [120, 125, 122]))
    review = build_review([base, w8a8], RC, "t")
    (row,) = to_json(review)["regime"]["m"]
    # per load and metric: output tok/s, ITL p50 and TPOT p50 at 1 req/s and at the unlimited rate
    assert {(p["metric"], p["load"]) for p in row["paired"]} == {
        (m, ld) for m in ("output_tok_s", "itl_ms_p50", "tpot_ms_p50") for ld in (1.0, "inf")
    }
    (d,) = review.regime["m"]
    by = {(p.metric, p.load): p for p in d.paired}
    tok, itl = by[("output_tok_s", math.inf)], by[("itl_ms_p50", 1.0)]
    assert [round(v or 0.0, 3) for v in (tok.speedup, tok.speedup_low, tok.speedup_high)] == [1.223, 1.162, 1.287]
    assert (tok.pairs, tok.verdict) == (3, "faster")
    assert [round(v or 0.0, 3) for v in (itl.speedup, itl.speedup_low, itl.speedup_high)] == [1.037, 0.854, 1.259]
    assert (itl.pairs, itl.verdict) == (3, "no difference established")
    assert d.low_load_claim is not None and d.saturation_claim is not None
    assert (d.low_load_claim.rule, d.low_load_claim.pairs, d.saturation_claim.rule) == ("paired t", 3, "paired t")
    md = markdown(review)  # one rendered row of the paired table
    assert "| w8a8 (W8A8) | unlimited rate | output tok/s | 1.223x | 1.162-1.287 | 3 | faster |" in md


def test_a_fallback_kernel_scheme_gets_no_paired_ratio() -> None:
    base = record("bf16", sp=sweep([50, 50, 50], [100, 100, 100]))
    fp8 = record("fp8", sp=sweep([47.5, 52.5, 45], [120, 125, 122]))
    fp8["memory"]["server"].update(
        fallback=True,
        fallback_lines=["Your GPU does not have native support for FP8 computation"],
        kernels=[{"kernel": "MarlinFP8ScaledMMLinearKernel", "method": "CompressedTensorsW8A8Fp8"}],
    )
    f = rows([base, fp8])["fp8"]
    assert f.paired == [] and f.low_load_claim is None and f.reading == RegimeReading.EXCLUDED


def test_an_established_but_small_speedup_neither_pays_nor_costs() -> None:
    # w8a8 / bf16 = 1.02 in every repeat (102 / 100, 132.6 / 130, 117.3 / 115): sd 0, the interval collapses to
    # 1.02, above 1: "faster" is established, but 1.02x is under the 1.05x that "pays" needs
    base = record("bf16", sp=sweep([50, 50, 50], [100, 130, 115]))
    w8a8 = record("w8a8", sp=sweep([40, 40, 40], [102, 132.6, 117.3]))
    sat = rows([base, w8a8])["w8a8"].saturation_claim
    assert sat.speedup == pytest.approx(1.02) and sat.class_ == "no change"
    assert (sat.rule, sat.verdict, sat.pairs) == ("paired t", "faster", 3)
    assert say("claim_word", "sentences.j2", c=sat) == "faster, under 1.05x"
