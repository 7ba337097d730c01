"""A sweep that stopped before its planned top loads (a job interrupted mid-benchmark, a level whose every repeat
was invalid) has no saturation number: its best level is a floor under the server's capacity, so the review marks
its ceiling as a lower bound, makes the cost at that ceiling an upper bound, flags the missing levels, and makes
no speedup claim at saturation; nor does it when two sweeps share one load level only: a claim at saturation needs
both sweeps' top loads.

The first test reads the records of an interrupted H200 grid (tests/fixtures/decode-interrupted-grid, decode shape
128 in / 1,024 out): bf16 measured concurrency 16, 64 and 256, three repeats each; the machine was lost while W4A16
(GPTQ, Machete) ran, after its three repeats at concurrency 16.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from quantverdict.config.schema import ReviewConfig
from quantverdict.review import build_review
from quantverdict.review.document import Regime, RegimeReading
from quantverdict.review.render import markdown
from quantverdict.review.sources import load_dir
from review_records import SYN_CONCURRENCIES, record, speed, synthetic_grid

ROOT = Path(__file__).resolve().parents[2]
DECODE = ROOT / "tests" / "fixtures" / "decode-interrupted-grid" / "records"
RC = ReviewConfig(log_to_mlflow=False, bootstrap_samples=200)
STOPPED = "gptq's sweep has no valid point at concurrency 64, concurrency 256"


def _row(review: Any, scheme: str) -> Regime:
    model = next(iter(review.regime))
    return next(r for r in review.regime[model] if r.scheme == scheme)


def _card(review: Any, scheme: str) -> Any:
    return next(c for c in review.scorecards if c.scheme == scheme)


def test_the_interrupted_decode_grid_claims_low_load_only() -> None:
    records, _ = load_dir(DECODE)
    review = build_review(
        records, ReviewConfig(log_to_mlflow=False, bootstrap_samples=200, gpu_price_per_hour={"H200": 3.5}), "t"
    )
    gptq, bf16 = _card(review, "gptq"), _card(review, "bf16")
    assert gptq.speed.stopped_before == ["concurrency 64", "concurrency 256"]
    assert gptq.speed.ceiling.kind == "lower_bound"  # its best level (16) is a floor
    assert bf16.speed.stopped_before == [] and bf16.speed.ceiling.kind == "closed_loop_max"
    row = _row(review, "gptq")
    assert row.saturation_not_compared == STOPPED
    assert row.saturation_speedup is None and row.saturation_claim is None and row.saturation_range is None
    # the low-load claim stands: ITL p50 at concurrency 16, three repeats paired on one GPU
    assert row.low_load_claim.rule == "paired t" and row.low_load_claim.class_ == "pays"
    assert row.reading == RegimeReading.SATURATION_NOT_MEASURED
    # output tok/s at concurrency 16, gptq / bf16 by repeat: 3,574.1 / 2,823.2, 3,579.1 / 2,824.1, 3,582.7 /
    # 2,819.3 = 1.2660, 1.2673, 1.2708; geometric mean 1.2680
    tok = next(p for p in row.paired if p.metric == "output_tok_s")
    assert (tok.load, tok.pairs, tok.verdict) == (16, 3, "faster")
    assert tok.speedup == pytest.approx(1.2680, abs=2e-4)
    flagged = [f.message for f in review.flags if f.code == "sweep_incomplete"]
    assert flagged == [
        "gptq (W4A16): speed: no valid point at concurrency 64, concurrency 256 of the planned sweep (concurrency 16, "
        "concurrency 64, concurrency 256) (job interrupted in stage benchmark): its ceiling is a lower bound, and no "
        "speedup at saturation is claimed against it or from it"
    ]
    # $3.5 per GPU-hour / (3,825.3 tok/s x 3,600 s) x 1e6 = $0.254 per million tokens: at most that
    bf16, gptq = review.cost.schemes  # type: ignore[union-attr]
    assert gptq.ceiling_lower_bound and round(gptq.ceiling_tok_s or 0.0) == 3825
    assert gptq.usd_per_mtok_ceiling == pytest.approx(3.5 / (gptq.ceiling_tok_s * 3600) * 1e6)  # type: ignore[operator]
    assert round(gptq.usd_per_mtok_ceiling or 0.0, 3) == 0.254
    # bf16's sweep is complete; its c=256 steady windows (15.9-16.1 s) are shorter than two lifetimes (E2E p50
    # 15.2-15.3 s), so its ceiling is the whole run's median, 15,662 tok/s: $3.5 / (15,662 x 3,600) x 1e6 = $0.062
    assert not bf16.ceiling_lower_bound and round(bf16.ceiling_tok_s or 0.0) == 15662
    assert round(bf16.usd_per_mtok_ceiling or 0.0, 3) == 0.062


def _planned(rec: dict[str, Any], concurrencies: tuple[int, ...] = SYN_CONCURRENCIES) -> dict[str, Any]:
    bench = rec.setdefault("config", {}).setdefault("bench", {})
    bench.update({"mode": "concurrency", "concurrencies": list(concurrencies), "rates": [1.0]})
    return rec


def test_a_stopped_sweep_against_a_complete_one() -> None:
    recs = [_planned(r) for r in synthetic_grid()]
    gptq = next(r for r in recs if r["job"]["scheme"] == "gptq")
    gptq["speed"]["points"] = gptq["speed"]["points"][:2]  # concurrency 1 and 16 of 1, 16, 64, 256
    gptq["status"], gptq["failed_stage"] = "interrupted", "benchmark"
    review = build_review(recs, RC, "t")
    row = _row(review, "gptq")
    assert row.saturation_not_compared == STOPPED and row.saturation_claim is None
    assert _card(review, "gptq").speed.ceiling.kind == "lower_bound"
    # the complete sweeps keep their saturation claims (at concurrency 256)
    for scheme in ("fp8", "w8a8"):
        r = _row(review, scheme)
        assert r.saturation_not_compared is None and r.saturation_claim is not None
        assert _card(review, scheme).speed.ceiling.kind == "closed_loop_max"


def test_a_stopped_baseline_stops_every_saturation_claim() -> None:
    recs = [_planned(r) for r in synthetic_grid()]
    base = next(r for r in recs if r["job"]["scheme"] == "bf16")
    base["speed"]["points"] = base["speed"]["points"][:3]  # no concurrency 256
    review = build_review(recs, RC, "t")
    for scheme in ("fp8", "gptq", "w8a8"):
        assert (
            _row(review, scheme).saturation_not_compared == "the baseline's sweep has no valid point at concurrency 256"
        )
    # a job that finished but lost its top level to invalid points: flagged without "(job ...)"
    assert [f.message for f in review.flags if f.code == "sweep_incomplete"] == [
        "bf16 (BF16): speed: no valid point at concurrency 256 of the planned sweep (concurrency 1, concurrency 16, "
        "concurrency 64, concurrency 256): its ceiling is a lower bound, and no speedup at saturation is claimed "
        "against it or from it"
    ]


def test_sweeps_that_end_apart_without_a_plan() -> None:
    # records without config.bench (older, hand-made): nothing is called missing, but the tops still differ
    recs = synthetic_grid()
    fp8 = next(r for r in recs if r["job"]["scheme"] == "fp8")
    fp8["speed"]["points"] = fp8["speed"]["points"][:3]
    review = build_review(recs, RC, "t")
    assert _card(review, "fp8").speed.ceiling.kind == "closed_loop_max"  # no plan: no lower bound
    assert _row(review, "fp8").saturation_not_compared == (
        "the sweeps end at different loads (concurrency 64; the baseline's concurrency 256)"
    )
    assert not [f for f in review.flags if f.code == "sweep_incomplete"]


def test_one_common_level_is_not_a_saturation_claim() -> None:
    recs = [_planned(r, (1,)) for r in synthetic_grid()]
    for r in recs:
        r["speed"]["points"] = r["speed"]["points"][:1]  # concurrency 1 only, as planned
    review = build_review(recs, RC, "t")
    row = _row(review, "gptq")
    assert (
        row.saturation_not_compared
        == "one load level measured by both (concurrency 1): its speedup is the low-load claim"
    )
    assert row.reading == RegimeReading.SATURATION_NOT_MEASURED and row.saturation_claim is None
    assert not [f for f in review.flags if f.code == "sweep_incomplete"]  # nothing planned is missing


# --- the low-load claim at the lowest load both measured; bounds carried; excluded schemes; open loop ------------
# Synthetic ITL p50 (= TPOT p50, review_records.SYN) at concurrency 1 / 16 / 64 / 256: bf16 5 / 6 / 9 / 20 ms,
# gptq 2.5 / 4 / 10 / 30 ms.


def test_low_load_is_the_lowest_load_both_measured() -> None:
    recs = [_planned(r) for r in synthetic_grid()]
    gptq = next(r for r in recs if r["job"]["scheme"] == "gptq")
    gptq["speed"]["points"][0]["valid"] = False  # its concurrency-1 point invalid: its lowest valid load is 16
    row = _row(build_review(recs, RC, "t"), "gptq")
    assert row.low_load_speedup == pytest.approx(6.0 / 4.0)  # bf16's 6 ms over gptq's 4 ms at 16, not 5 ms (c=1) over 4
    assert row.saturation_not_compared is None  # both reached 256


def test_sweeps_sharing_only_their_top_compare_there() -> None:
    recs = synthetic_grid()
    base = recs[0]
    base["speed"]["points"] = [base["speed"]["points"][1], base["speed"]["points"][3]]  # bf16 at 16 and 256
    gptq = next(r for r in recs if r["job"]["scheme"] == "gptq")
    gptq["speed"]["points"] = [gptq["speed"]["points"][0], gptq["speed"]["points"][3]]  # gptq at 1 and 256
    row = _row(build_review(recs, RC, "t"), "gptq")
    assert row.low_load_speedup == pytest.approx(20.0 / 30.0)  # at 256, the one load both measured: slower
    assert (
        row.saturation_not_compared
        == "one load level measured by both (concurrency 256): its speedup is the low-load claim"
    )
    assert row.reading == RegimeReading.SATURATION_NOT_MEASURED and row.low_load_claim.class_ == "costs"


def test_a_scheme_excluded_from_speed_has_no_saturation_gap() -> None:
    recs = [_planned(r) for r in synthetic_grid()]
    gptq = next(r for r in recs if r["job"]["scheme"] == "gptq")
    gptq["memory"]["server"]["fallback"] = True  # a weight-only fallback kernel: not compared for speed
    gptq["speed"]["points"] = gptq["speed"]["points"][:2]
    row = _row(build_review(recs, RC, "t"), "gptq")
    assert row.saturation_not_compared is None and row.reading == RegimeReading.EXCLUDED


def test_the_lower_bound_reaches_the_gpu_lines_and_the_cost_json() -> None:
    recs = [_planned(r) for r in synthetic_grid()]
    base = next(r for r in recs if r["job"]["scheme"] == "bf16")
    base["speed"]["points"][3]["valid"] = False  # bf16 finished, its concurrency-256 point invalid
    for r in recs:
        r["environment"]["device"] = "cuda"
    rc = ReviewConfig(log_to_mlflow=False, bootstrap_samples=200, gpu_price_per_hour={"H200": 3.5})
    review = build_review(recs, rc, "t")
    (v,) = review.verdicts
    assert v.gpus is not None and {r.scheme: r.lower_bound for r in v.gpus.speeds}["bf16"]
    line = next(e for e in markdown(review).splitlines() if e.startswith("- Throughput per GPU"))
    assert "bf16 >= " in line and "fp8 >= " not in line
    cost = review.cost
    assert cost is not None
    bounds = {c.scheme: c.ceiling_lower_bound for c in cost.schemes}
    assert bounds == {"bf16": True, "fp8": False, "gptq": False, "w8a8": False}


def test_an_open_loop_sweep_that_saturated_before_it_stopped() -> None:
    # rates 1, 4 and unlimited planned; gptq stopped after 4 req/s, where it fell behind (2 of 4 req/s achieved):
    # its ceiling is the saturated 4 req/s level, a real one, so the flag does not call it a lower bound
    def sweep(itl: float, tok: float) -> dict[str, Any]:
        sp = speed(itl, tok)
        sat = {**sp["points"][1], "offered_rate_rps": 4.0, "achieved_rps": 2.0, "point": "rate-4_r0"}
        sp["points"].insert(1, sat)
        return sp

    recs = [record("bf16", sp=sweep(40.0, 300.0)), record("gptq", sp=sweep(25.0, 270.0))]
    for r in recs:
        r["config"]["bench"] = {"mode": "rate", "rates": [1.0, 4.0, "inf"], "concurrencies": [1]}
    recs[1]["speed"]["points"] = recs[1]["speed"]["points"][:2]
    recs[1]["status"], recs[1]["failed_stage"] = "interrupted", "benchmark"
    review = build_review(recs, RC, "t")
    assert _card(review, "gptq").speed.ceiling.kind == "saturated"
    assert [f.message for f in review.flags if f.code == "sweep_incomplete"] == [
        "gptq (W4A16): speed: no valid point at unlimited rate of the planned sweep (1 req/s, 4 req/s, unlimited "
        "rate) (job interrupted in stage benchmark): no speedup at saturation is claimed against it or from it"
    ]
    assert _row(review, "gptq").saturation_not_compared == "gptq's sweep has no valid point at unlimited rate"


def test_a_record_without_speed_mode_reads_the_config_mode() -> None:
    recs = [_planned(r) for r in synthetic_grid()]
    for r in recs:
        del r["speed"]["mode"]  # older records: the mode only in config.bench
    review = build_review(recs, RC, "t")
    assert not [f for f in review.flags if f.code == "sweep_incomplete"]
    assert _card(review, "bf16").speed.ceiling.kind == "closed_loop_max"
