"""Repeats across server starts: the run order of a grid's starts, the ratio to the baseline with a t interval over
starts, the spread between and within starts, and the stopping rule. Values worked out by hand in the comments."""

from __future__ import annotations

import math
from typing import Any

import pytest

from quantverdict.config.compose import compose
from quantverdict.config.schema import ConfigError
from quantverdict.measure import starts
from quantverdict.results.record import SweepPoint
from quantverdict.review.speed import point_label
from quantverdict.review.verdict import PAYS


def _pt(conc: int, start: int | None, value: float, repeat: int = 0) -> dict[str, Any]:
    p: dict[str, Any] = {
        "concurrency": conc,
        "offered_rate_rps": "inf",
        "repeat": repeat,
        "valid": True,
        "output_tok_s": value,
    }
    if start is not None:
        p["server_start"] = start
    return p


# --- the order of starts ------------------------------------------------------------------------------------


def test_interleaved_rounds_put_every_scheme_in_every_round_in_grid_order() -> None:
    plan = starts.plan_order(["bf16", "gptq", "fp8"], [2, 3])
    assert plan == [(2, "bf16"), (2, "gptq"), (2, "fp8"), (3, "bf16"), (3, "gptq"), (3, "fp8")]


def test_random_rounds_are_a_seeded_shuffle_per_round() -> None:
    jobs = ["bf16", "gptq", "fp8", "awq"]
    a = starts.plan_order(jobs, [2, 3, 4], "random", seed=7)
    b = starts.plan_order(jobs, [2, 3, 4], "random", seed=7)
    assert a == b  # the same seed: the same order, so the record's plan can be rerun
    for s in (2, 3, 4):  # each round holds every job once
        assert sorted(j for r, j in a if r == s) == sorted(jobs)
    rounds = {tuple(j for r, j in a if r == s) for s in (2, 3, 4)}
    other = starts.plan_order(jobs, [2, 3, 4], "random", seed=8)
    # 4! = 24 orders: three rounds of one seed all equal, or another seed giving the same three, would be chance
    assert len(rounds) > 1 or a != other
    with pytest.raises(ValueError, match="allowed: interleaved, random"):
        starts.round_order(jobs, 2, "shuffled", 0)  # type: ignore[arg-type]


# --- start means, ratio and interval ------------------------------------------------------------------------


def test_points_without_a_start_index_read_as_start_one() -> None:
    means = starts.start_means([_pt(1, None, 100.0), _pt(1, None, 110.0, repeat=1)], "output_tok_s", "concurrency")
    assert list(means[1.0]) == [1]
    assert means[1.0][1].mean == 105.0 and means[1.0][1].n == 2


def test_invalid_points_and_missing_metrics_are_left_out_of_a_start_mean() -> None:
    bad = {**_pt(1, 1, 999.0), "valid": False}
    missing = {**_pt(1, 1, 0.0), "output_tok_s": None}
    means = starts.start_means([_pt(1, 1, 100.0), bad, missing], "output_tok_s", "concurrency")
    assert means[1.0][1].values == (100.0,)


def test_start_ratio_interval_by_hand() -> None:
    # per-start ratios 1.10, 1.00, 1.05 at c=64 (baseline 100 every start)
    # logs: 0.0953102, 0, 0.0487902; mean m = 0.1441004 / 3 = 0.0480335
    # deviations 0.0472767, -0.0480334, 0.0007567; squares sum 0.0045429; s = sqrt(0.0045429 / 2) = 0.0476596
    # t_{0.975, 2} = 4.3026527; half = 4.3026527 x 0.0476596 / sqrt(3) = 0.1183930
    # interval exp(0.0480334 -+ 0.1183930) = exp(-0.0703596) .. exp(0.1664264) = 0.932059 .. 1.181077
    # ratio exp(0.0480334) = 1.049206
    base = [_pt(64, s, 100.0) for s in (1, 2, 3)]
    mine = [_pt(64, 1, 110.0), _pt(64, 2, 100.0), _pt(64, 3, 105.0)]
    (r,) = starts.start_ratios(mine, base, "output_tok_s", "concurrency", 0.95)
    assert r.starts == (1, 2, 3) and r.n == 3
    assert r.ratio == pytest.approx(1.049206, abs=1e-6)
    assert r.low == pytest.approx(0.932059, abs=1e-6)
    assert r.high == pytest.approx(1.181077, abs=1e-6)
    assert r.sd_log == pytest.approx(0.0476596, abs=1e-7)


def test_start_ratio_uses_start_means_not_repeats() -> None:
    # start 1: scheme repeats 90, 110 (mean 100) vs baseline 100, 100 -> ratio 1.0
    # start 2: scheme 120, 120 (mean 120) vs baseline 100, 100 -> ratio 1.2
    # two starts: logs 0, 0.1823216; m = 0.0911608; s = 0.1823216 / sqrt(2) = 0.1289208
    # t_{0.975, 1} = 12.7062047; half = 12.7062047 x 0.1289208 / sqrt(2) = 1.1583075
    # interval exp(-1.0671467) .. exp(1.2494683) = 0.343989 .. 3.488488 (four repeats as pairs would say far less)
    base = [_pt(16, s, 100.0, r) for s in (1, 2) for r in (0, 1)]
    mine = [_pt(16, 1, 90.0, 0), _pt(16, 1, 110.0, 1), _pt(16, 2, 120.0, 0), _pt(16, 2, 120.0, 1)]
    (r,) = starts.start_ratios(mine, base, "output_tok_s", "concurrency", 0.95)
    assert r.ratio == pytest.approx(math.sqrt(1.2), rel=1e-9)
    assert r.low == pytest.approx(0.343989, abs=1e-6)
    assert r.high == pytest.approx(3.488488, abs=1e-6)


def test_only_starts_both_have_are_paired_and_one_start_gives_no_interval() -> None:
    base = [_pt(1, 1, 100.0), _pt(1, 2, 100.0)]
    mine = [_pt(1, 1, 120.0)]
    (r,) = starts.start_ratios(mine, base)
    assert r.starts == (1,) and r.ratio == pytest.approx(1.2) and r.low is None and r.high is None


# --- spread between and within starts -----------------------------------------------------------------------


def test_between_and_within_start_spread_by_hand() -> None:
    # start 1: 100, 102 (mean 101); start 2: 110, 108 (mean 109); grand mean 105
    # between-start SD = sqrt(((101 - 105)^2 + (109 - 105)^2) / 1) = sqrt(32) = 5.656854
    # within: squares 1, 1, 1, 1 over 4 - 2 = 2 df: MSW = 2, SD = 1.414214
    # MSB = (2 x 16 + 2 x 16) / 1 = 64; n0 = (4 - 8 / 4) / 1 = 2; between variance (64 - 2) / 2 = 31
    # CV = 100 x 5.656854 / 105 = 5.387480 %
    ps = [_pt(64, 1, 100.0, 0), _pt(64, 1, 102.0, 1), _pt(64, 2, 110.0, 0), _pt(64, 2, 108.0, 1)]
    (sp,) = starts.start_spread(ps)
    assert sp.starts == (1, 2) and sp.means == (101.0, 109.0) and sp.grand_mean == 105.0
    assert sp.between_start_sd == pytest.approx(5.656854, abs=1e-6)
    assert sp.within_start_sd == pytest.approx(1.414214, abs=1e-6)
    assert sp.between_start_var == pytest.approx(31.0)
    assert sp.between_start_cv_pct == pytest.approx(5.387480, abs=1e-6)


def test_between_start_variance_is_zero_when_starts_agree_more_than_repeats() -> None:
    # start 1: 90, 110; start 2: 95, 105 -> means 100, 100: MSB = 0, MSW = (100 + 100 + 25 + 25) / 2 = 125
    # (0 - 125) / 2 < 0 -> 0; between SD 0; within SD sqrt(125) = 11.180340
    ps = [_pt(1, 1, 90.0), _pt(1, 1, 110.0, 1), _pt(1, 2, 95.0), _pt(1, 2, 105.0, 1)]
    (sp,) = starts.start_spread(ps)
    assert sp.between_start_var == 0.0 and sp.between_start_sd == 0.0
    assert sp.within_start_sd == pytest.approx(11.180340, abs=1e-6)


def test_one_repeat_per_start_has_no_within_spread() -> None:
    (sp,) = starts.start_spread([_pt(1, 1, 100.0), _pt(1, 2, 104.0)])
    assert sp.within_start_sd is None and sp.between_start_var is None
    assert sp.between_start_sd == pytest.approx(math.sqrt(8))  # (2^2 + 2^2) / 1


# --- the stopping rule --------------------------------------------------------------------------------------


def test_decision_band_is_the_reviews() -> None:
    assert starts.DECISION_BAND == PAYS


def test_look_confidence_is_bonferroni_over_the_looks() -> None:
    assert starts.look_confidence(0.95, 3, 6) == pytest.approx(1 - 0.05 / 4)  # looks at 3, 4, 5, 6 starts
    assert starts.look_confidence(0.95, 3, 3) == pytest.approx(0.95)  # a fixed count: one look
    with pytest.raises(ValueError, match="max_starts=2 < min_starts=3"):
        starts.look_confidence(0.95, 3, 2)


@pytest.mark.parametrize(
    ("low", "high", "n", "expected"),
    [
        (1.06, 1.20, 3, "settled_above"),  # wholly >= 1.05: pays
        (1.05, 1.20, 3, "settled_above"),  # the line itself counts, as in the review (>= 1.05)
        (0.80, 0.95, 3, "settled_below"),  # wholly <= 1 / 1.05 = 0.952381: costs
        (0.97, 1.03, 3, "settled_inside"),  # inside (0.952381, 1.05): no change
        (0.94, 1.03, 3, "continue"),  # straddles the lower line
        (0.94, 1.03, 6, "max_reached"),
        (1.06, 1.20, 2, "continue"),  # below min_starts=3 nothing settles
        (None, None, 3, "continue"),  # no interval (one pair)
    ],
)
def test_settle(low: float | None, high: float | None, n: int, expected: str) -> None:
    assert starts.settle(low, high, n, min_starts=3, max_starts=6) == expected


def test_decide_levels_settles_a_clear_level_and_keeps_an_unclear_one_going() -> None:
    # c=1: ratios 1.30, 1.31, 1.29 over three starts: tight, far above 1.05 -> settled_above
    # c=64: ratios 1.10, 1.00, 1.05: interval 0.93-1.18 at 95% (wider at the look level): continue
    base = [_pt(c, s, 100.0) for c in (1, 64) for s in (1, 2, 3)]
    mine = [_pt(1, 1, 130.0), _pt(1, 2, 131.0), _pt(1, 3, 129.0)]
    mine += [_pt(64, 1, 110.0), _pt(64, 2, 100.0), _pt(64, 3, 105.0)]
    d1, d64 = starts.decide_levels(mine, base, min_starts=3, max_starts=6, confidence=0.95)
    assert (d1.load, d1.ended_by, d1.starts) == (1.0, "settled_above", 3)
    assert d1.confidence == pytest.approx(0.9875)
    assert (d64.load, d64.ended_by) == (64.0, "continue")
    (d64_last,) = [d for d in starts.decide_levels(mine, base, 3, 3, 0.95) if d.load == 64.0]
    assert d64_last.ended_by == "max_reached"  # the fixed count: the last look ends it


def test_gpu_time_saved() -> None:
    assert starts.gpu_time_saved_s([100.0, 120.0], 2, 5) == pytest.approx(330.0)  # 3 x 110
    assert starts.gpu_time_saved_s([100.0], 5, 5) == 0.0


# --- the config keys ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["bench.server_starts=0"], "bench.server_starts=0 must be >= 1"),
        (["bench.server_starts=3", "bench.max_server_starts=2"], "bench.max_server_starts=2 must be null"),
        (["bench.start_confidence=1.0"], r"bench.start_confidence=1.0 must be in \(0, 1\)"),
        (["bench.gpu_sample_interval_ms=5"], r"bench.gpu_sample_interval_ms=5 must be 0 \(not sampled\) or >= 10"),
        (["bench.start_order=shuffled"], "bench.start_order.*interleaved.*random"),
    ],
)
def test_bad_start_settings_are_refused_naming_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        compose(overrides)


def test_cpu_profiles_run_one_start_and_gpu_profiles_three() -> None:
    assert compose([]).bench.server_starts == 1  # cpu: the job's own start only
    for bench in ("gpu", "gpu-concurrency", "gpu-concurrency-decode", "gpu-concurrency-prefill", "gpu-long-context"):
        cfg = compose(["env=gpu", f"bench={bench}"])
        assert (cfg.bench.server_starts, cfg.bench.max_server_starts, str(cfg.bench.start_order)) == (
            3,
            None,
            "interleaved",
        ), bench


def test_a_points_label_counts_its_repeat_inside_its_start() -> None:
    # two repeats per start: start 2's points are recorded as repeats 2 and 3 ((2 - 1) x 2 + r), labelled as that
    # start's repeats 0 (not named) and 1; with one repeat per start, start 3's point is repeat 2 and has no repeat
    # of its own to name
    def at(repeat: int, start: int | None) -> SweepPoint:
        return SweepPoint.model_validate({"concurrency": 256, "repeat": repeat, "server_start": start})

    assert point_label(at(2, 2), "concurrency", 2) == "concurrency 256 (start 2)"
    assert point_label(at(3, 2), "concurrency", 2) == "concurrency 256 (start 2, repeat 1)"
    assert point_label(at(2, 3), "concurrency", 1) == "concurrency 256 (start 3)"
    assert point_label(at(1, None), "concurrency", 3) == "concurrency 256 (repeat 1)"
