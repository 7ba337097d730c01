"""Intervals and paired tests against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from quantverdict.measure import stats

# ten items; the scheme (x) and the baseline (y) disagree on items 0, 1 (scheme right) and 9 (baseline right)
X = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
Y = [0, 0, 1, 1, 0, 0, 0, 0, 0, 1]


def test_z_value() -> None:
    assert stats.z_value(0.95) == pytest.approx(1.959964, abs=1e-6)
    assert stats.z_value(0.90) == pytest.approx(1.644854, abs=1e-6)
    with pytest.raises(ValueError):
        stats.z_value(1.0)


def test_paired_normal_interval_by_hand() -> None:
    # d = x - y = [1, 1, 0, 0, 0, 0, 0, 0, 0, -1]; mean = 0.1
    # sum of squared deviations = 2 * 0.9^2 + 7 * 0.1^2 + 1.1^2 = 1.62 + 0.07 + 1.21 = 2.9
    # sd = sqrt(2.9 / 9) = 0.567646; se = 0.567646 / sqrt(10) = 0.179505
    # half width = 1.959964 * 0.179505 = 0.351824 -> [-0.251824, 0.451824]
    iv = stats.paired_normal_interval(X, Y)
    assert iv.estimate == pytest.approx(0.1)
    assert iv.low == pytest.approx(-0.251824, abs=1e-5)
    assert iv.high == pytest.approx(0.451824, abs=1e-5)
    assert not iv.excludes_zero()  # not significant


def test_ratio_normal_interval_by_hand() -> None:
    # recovery R = mean(x) / mean(y) = 0.4 / 0.3 = 1.333333
    # u_i = x_i - R y_i = [1, 1, -1/3, -1/3, 0, 0, 0, 0, 0, -4/3] (mean 0)
    # sum u^2 = 1 + 1 + 1/9 + 1/9 + 16/9 = 4.0; sd = sqrt(4 / 9) = 0.666667
    # se = 0.666667 / (sqrt(10) * 0.3) = 0.702728; half = 1.959964 * 0.702728 = 1.377321
    iv = stats.ratio_normal_interval(X, Y)
    assert iv.estimate == pytest.approx(4 / 3)
    assert iv.low == pytest.approx(4 / 3 - 1.377321, abs=1e-5)
    assert iv.high == pytest.approx(4 / 3 + 1.377321, abs=1e-5)
    with pytest.raises(ValueError):
        stats.ratio_normal_interval([1, 0], [0, 0])


def test_log_ratio_interval_for_perplexity_by_hand() -> None:
    # two documents: baseline minus scheme log-likelihood num = [1, 3] nats over den = [50, 100] words
    # L = 4 / 150 = 0.0266667; u = num - L den = [-1/3, 1/3]; sd = sqrt(2/9 / 1) = 0.471405
    # se = 0.471405 / (sqrt(2) * 75) = 0.00444444; half = 1.959964 * 0.00444444 = 0.00871095
    iv = stats.log_ratio_normal_interval([1, 3], [50, 100])
    assert iv.estimate == pytest.approx(0.0266667, abs=1e-6)
    assert iv.low == pytest.approx(0.0266667 - 0.00871095, abs=1e-6)
    assert iv.high == pytest.approx(0.0266667 + 0.00871095, abs=1e-6)
    # both documents lose exactly 0.02 nats/word: zero-width interval at exp(0.02) - 1 = +2.0201%
    flat = stats.log_ratio_normal_interval([1, 2], [50, 100])
    assert flat.low == pytest.approx(0.02) and flat.high == pytest.approx(0.02)
    assert 100 * math.expm1(flat.estimate) == pytest.approx(2.0201, abs=1e-4)


def test_mcnemar_exact_by_hand() -> None:
    # X vs Y: b = 2 (items 0, 1), c = 1 (item 9); P(X <= 1 | n=3) = (1 + 3) / 8 = 0.5 -> p = min(1, 1.0) = 1
    assert stats.mcnemar_exact(X, Y) == (2, 1, pytest.approx(1.0))
    # b = 1, c = 9: P(X <= 1 | n=10) = (1 + 10) / 1024 -> p = 22 / 1024 = 0.021484375
    x = [1] + [0] * 9 + [1] * 5
    y = [0] + [1] * 9 + [1] * 5
    assert stats.mcnemar_exact(x, y) == (1, 9, pytest.approx(22 / 1024))
    # b = 5, c = 0: p = 2 * (1/2)^5 = 0.0625 (five discordant items in one direction are not enough)
    assert stats.mcnemar_exact([1] * 5, [0] * 5)[2] == pytest.approx(0.0625)
    # b = c = 2: P(X <= 2 | n=4) = (1 + 4 + 6) / 16 = 11/16 -> p = min(1, 22/16) = 1
    assert stats.mcnemar_exact([1, 1, 0, 0], [0, 0, 1, 1]) == (2, 2, pytest.approx(1.0))
    # no discordant pair: p = 1
    assert stats.mcnemar_exact([1, 0], [1, 0]) == (0, 0, 1.0)
    with pytest.raises(ValueError, match="0/1 outcomes"):  # two items: the n check passes, the 0/1 check refuses
        stats.mcnemar_exact([0.5, 1], [1, 1])


def test_unpaired_intervals_by_hand() -> None:
    # delta = 0.45 - 0.50 = -0.05; se = sqrt(0.05^2 + 0.05^2) = 0.0707107; half = 0.138590
    iv = stats.unpaired_interval(0.45, 0.05, 0.50, 0.05)
    assert iv.estimate == pytest.approx(-0.05)
    assert (iv.low, iv.high) == (pytest.approx(-0.188590, abs=1e-5), pytest.approx(0.088590, abs=1e-5))
    # R = 0.9; se = 0.9 * sqrt((0.05/0.45)^2 + (0.05/0.5)^2) = 0.9 * 0.149484 = 0.134536; half = 0.263685
    r = stats.unpaired_ratio_interval(0.45, 0.05, 0.50, 0.05)
    assert (r.low, r.high) == (pytest.approx(0.636315, abs=1e-5), pytest.approx(1.163685, abs=1e-5))


def test_bootstrap_degenerate_and_deterministic() -> None:
    # every item: scheme right, baseline wrong -> every resample has mean difference exactly 1
    iv = stats.bootstrap_mean_diff([1] * 20, [0] * 20, samples=500)
    assert (iv.estimate, iv.low, iv.high) == (1.0, 1.0, 1.0)
    a = stats.bootstrap_mean_diff(X, Y, samples=2000, seed=7)
    b = stats.bootstrap_mean_diff(X, Y, samples=2000, seed=7)
    assert a == b  # fixed seed: the same interval every time
    assert a.estimate == pytest.approx(0.1)


def test_bootstrap_agrees_with_normal_for_large_n() -> None:
    # 400 items: 60 scheme-only right, 40 baseline-only right, 150 both, 150 neither
    x = [1] * 60 + [0] * 40 + [1] * 150 + [0] * 150
    y = [0] * 60 + [1] * 40 + [1] * 150 + [0] * 150
    normal = stats.paired_normal_interval(x, y)
    boot = stats.bootstrap_mean_diff(x, y, samples=20000, seed=0)
    assert boot.estimate == pytest.approx(0.05)  # (60 - 40) / 400
    assert boot.low == pytest.approx(normal.low, abs=0.006)
    assert boot.high == pytest.approx(normal.high, abs=0.006)
    ratio_n = stats.ratio_normal_interval(x, y)
    ratio_b = stats.bootstrap_ratio(x, y, samples=20000, seed=0)
    assert ratio_b.estimate == pytest.approx(210 / 190)
    assert ratio_b.low == pytest.approx(ratio_n.low, abs=0.015)
    assert ratio_b.high == pytest.approx(ratio_n.high, abs=0.015)


def test_bootstrap_continuous_rows() -> None:
    # continuous per-document values take the every-row path (each row distinct)
    num = [0.5 + 0.01 * i for i in range(50)]
    den = [20 + i for i in range(50)]
    iv = stats.bootstrap_ratio(num, den, samples=3000, seed=1)
    assert iv.estimate == pytest.approx(sum(num) / sum(den))
    assert iv.low < iv.estimate < iv.high


def test_pairs_must_match() -> None:
    with pytest.raises(ValueError):
        stats.paired_normal_interval([1, 0], [1])
    with pytest.raises(ValueError):
        stats.paired_normal_interval([], [])


# --- never an interval from fewer than 2 items; every interval states n ---------------------------------


def test_one_item_gives_no_interval_and_no_test() -> None:
    # one document (the CPU review's wikitext): a paired bootstrap over it "resamples" the same row every time
    # and returned [+0.88, +0.88] "significant"; now every interval and test refuses, saying n
    for fn in (stats.paired_normal_interval, stats.ratio_normal_interval, stats.bootstrap_mean_diff):
        with pytest.raises(stats.TooFewItems, match="n=1"):
            fn([1.0], [0.5])
    with pytest.raises(stats.TooFewItems, match="n=1 document: no interval"):
        stats.bootstrap_ratio([1.0], [50.0], unit="document")
    with pytest.raises(stats.TooFewItems, match="n=1"):
        stats.mcnemar_exact([1], [0])
    assert stats.too_few(1, "document") == (
        "n=1 document: no interval and no significance test (they need at least 2 independent documents)"
    )
    assert stats.too_few(2) is None
    assert stats.significant(None) is None


def test_every_interval_states_n() -> None:
    iv = stats.paired_normal_interval(X, Y)
    assert iv.n == 10 and iv.describe() == "paired normal, n=10"
    assert stats.bootstrap_mean_diff(X, Y, samples=200).n == 10
    assert stats.log_ratio_normal_interval([1, 3], [50, 100]).n == 2
    assert stats.unpaired_interval(0.5, 0.05, 0.5, 0.05, n=100).describe() == "unpaired normal (stderrs), n=100"
    assert stats.mcnemar_exact(X, Y) == (2, 1, pytest.approx(1.0))


def test_window_log_ratio_by_hand() -> None:
    # per-window summed NLL (nats): baseline [100, 200], scheme [101, 203] over [50, 100] scored tokens
    # -> the same numbers as test_log_ratio_interval_for_perplexity_by_hand: L = 4 / 150, half 0.00871095;
    # perplexity ratio exp(L) = 1.027025 (+2.70%), interval exp(L -+ half) = [1.018118, 1.036011]
    iv = stats.window_log_ratio_interval([101.0, 203.0], [100.0, 200.0], [50, 100], method="normal")
    assert iv.estimate == pytest.approx(4 / 150)
    assert math.exp(iv.low) == pytest.approx(1.018118, abs=1e-6)
    assert math.exp(iv.high) == pytest.approx(1.036011, abs=1e-6)
    assert iv.n == 2 and "2 windows" in iv.describe()
    with pytest.raises(stats.TooFewItems, match="n=1 window"):
        stats.window_log_ratio_interval([101.0], [100.0], [50])


# --- 100 items by hand: McNemar, the normal interval and the bootstrap ----------------------------------------

# 100 items: 60 both right, 20 both wrong, 15 baseline-only right, 5 scheme-only right
# scheme accuracy 0.65, baseline 0.75 -> difference -0.10
# exact McNemar: b = 5, c = 15, n = 20; p = 2 * P(Bin(20, 1/2) <= 5) = 2 * (1 + 20 + 190 + 1140 + 4845 + 15504)
# / 2^20 = 2 * 21700 / 1048576 = 0.041389
SCHEME_100 = [1] * 60 + [0] * 20 + [0] * 15 + [1] * 5
BASE_100 = [1] * 60 + [0] * 20 + [1] * 15 + [0] * 5


def test_mcnemar_and_bootstrap_by_hand_on_100_items() -> None:
    b, c, p = stats.mcnemar_exact(SCHEME_100, BASE_100)
    assert (b, c) == (5, 15)
    assert p == pytest.approx(0.041389, abs=1e-6)
    # the normal interval by hand: d has 5 (+1), 15 (-1), 80 (0); mean -0.1;
    # sum (d - mean)^2 = 5 * 1.21 + 15 * 0.81 + 80 * 0.01 = 6.05 + 12.15 + 0.8 = 19.0; sd = sqrt(19 / 99)
    # = 0.438086; se = 0.0438086; half = 1.959964 * 0.0438086 = 0.085863 -> [-0.185863, -0.014137]
    nv = stats.paired_normal_interval(SCHEME_100, BASE_100)
    assert nv.low == pytest.approx(-0.185863, abs=1e-5) and nv.high == pytest.approx(-0.014137, abs=1e-5)
    # the percentile bootstrap estimates the same quantiles: within 0.02 of the normal interval, holding the
    # difference -0.10 and excluding 0 (as McNemar's p < 0.05 says)
    boot = stats.bootstrap_mean_diff(SCHEME_100, BASE_100, samples=20_000, seed=0)
    assert boot.estimate == pytest.approx(-0.10) and boot.n == 100
    assert boot.low == pytest.approx(nv.low, abs=0.02) and boot.high == pytest.approx(nv.high, abs=0.02)
    assert boot.contains(-0.10) and boot.excludes_zero()
    # X vs Y (b = 2, c = 1 of 10): the bootstrap interval holds 0, as McNemar's p = 1 says
    assert stats.bootstrap_mean_diff(X, Y, samples=5000, seed=0).contains(0.0)


def test_bootstrap_ratio_leaves_out_resamples_with_zero_denominator() -> None:
    # x = ten 1s, y = one 1 (item 0) and nine 0s: a resample draws item 0 k ~ Binomial(10, 0.1) times and its
    # ratio is 10 / k; k = 0 (probability 0.3487) is no ratio (10 / 0) and is left out. Given k >= 1:
    # P(k = 1) = 0.3874 / 0.6513 = 0.595 > 2.5%, so the upper bound is 10 / 1 = 10;
    # P(k >= 4) = 0.0128 / 0.6513 = 0.0197 < 2.5% <= P(k >= 3) = 0.1082, so the lower bound is 10 / 3
    iv = stats.bootstrap_ratio([1] * 10, [1] + [0] * 9, samples=10_000, seed=0)
    assert iv.estimate == pytest.approx(10.0)
    assert iv.low == pytest.approx(10 / 3) and iv.high == pytest.approx(10.0)
    with pytest.raises(ValueError, match="denominators is 0"):
        stats.bootstrap_ratio([1, 1], [0, 0])


# --- Student's t ----------------------------------------------------------------------------------------------


def test_t_interval_by_hand() -> None:
    # values 1 and 3: mean 2, s = sqrt(2), se = s / sqrt(2) = 1; t_{0.975, 1} = 12.706205 -> [-10.706205, 14.706205]
    iv = stats.t_interval([1.0, 3.0])
    assert iv.estimate == pytest.approx(2.0) and iv.n == 2
    assert iv.low == pytest.approx(-10.706205, abs=1e-6) and iv.high == pytest.approx(14.706205, abs=1e-6)
    # 90%: t_{0.95, 1} = 6.313752
    assert stats.t_interval([1.0, 3.0], 0.90).high == pytest.approx(2 + 6.313752, abs=1e-6)
    # 32 values alternating 0 and 1: mean 0.5, s^2 = 32 * 0.25 / 31 = 0.258065, s = 0.508001, se = 0.0898027;
    # t_{0.975, 31} = 2.039513 (not the normal 1.96): half = 0.183154
    iv32 = stats.t_interval([0.0, 1.0] * 16)
    assert iv32.high - iv32.estimate == pytest.approx(0.183154, abs=1e-6)
    # zero spread: the interval collapses to the mean
    flat = stats.t_interval([0.5, 0.5, 0.5])
    assert (flat.low, flat.high) == (0.5, 0.5)
    with pytest.raises(stats.TooFewItems, match="n=1"):
        stats.t_interval([1.0])


# --- ratio to the baseline paired by repeat ----------------------------------------------------------------


def _pts(values: list[float], conc: int = 256) -> list[dict]:
    return [{"concurrency": conc, "repeat": r, "output_tok_s": v, "valid": True} for r, v in enumerate(values)]


def test_paired_ratio_interval_by_hand() -> None:
    # ratios 1.20, 1.25, 1.22: logs 0.18232, 0.22314, 0.19885; mean 0.20144, sd 0.020533;
    # half-width t_{0.975, 2} 4.302653 x 0.020533 / sqrt(3) = 0.05101 -> exp(0.15043) = 1.1623, exp(0.25245) = 1.2872
    (row,) = stats.paired_ratio(_pts([120, 125, 122]), _pts([100, 100, 100]))
    assert row["pairs"] == 3 and row["ratios"] == [1.2, 1.25, 1.22]
    assert row["low"] == pytest.approx(1.1623, abs=1e-4) and row["high"] == pytest.approx(1.2872, abs=1e-4)
    assert row["ratio"] == pytest.approx(math.exp(0.20144), abs=1e-4) and row["verdict"] == "faster"


def test_paired_ratio_no_difference_and_slower() -> None:
    (row,) = stats.paired_ratio(_pts([95, 105, 100]), _pts([100, 100, 100]))
    assert row["low"] < 1 < row["high"] and row["verdict"] == "no difference established"
    (slow,) = stats.paired_ratio(_pts([80, 82, 81]), _pts([100, 100, 100]))
    assert slow["verdict"] == "slower"
    # a latency: lower is better, a ratio under 1 is faster
    (lat,) = stats.paired_ratio(_pts([80, 82, 81]), _pts([100, 100, 100]), higher_is_better=False)
    assert lat["verdict"] == "faster"
    # zero spread (0.8 in every repeat): the interval collapses to the ratio
    (same,) = stats.paired_ratio(_pts([80, 80, 80]), _pts([100, 100, 100]), higher_is_better=False)
    assert same["low"] == pytest.approx(0.8) and same["high"] == pytest.approx(0.8) and same["verdict"] == "faster"


def test_paired_ratio_pairs_by_repeat_and_skips_invalid() -> None:
    mine = _pts([120, 125, 122])
    mine[1]["valid"] = False  # a point with prefix-cache hits: not paired
    (row,) = stats.paired_ratio(mine, _pts([100, 110, 100]))
    assert row["pairs"] == 2 and row["ratios"] == [1.2, 1.22]
    (one,) = stats.paired_ratio(_pts([120]), _pts([100]))
    assert one["ratio"] == pytest.approx(1.2) and one["low"] is None and one["verdict"] == "no difference established"


def test_paired_ratio_pairs_server_starts_not_repeats() -> None:
    # three server starts of three repeats each (repeat numbered (start - 1) x 3 + r, as the extra starts record
    # them): the scheme at 106, 108, 110 +- 0.5 per start, the baseline at 100 throughout. By start: means 106, 108,
    # 110 -> logs 0.058269, 0.076961, 0.095310; mean 0.076847, sd 0.018521; half-width t_{0.975, 2} 4.302653 x
    # 0.018521 / sqrt(3) = 0.046008 -> [exp(0.030839), exp(0.122855)] = [1.03132, 1.13073]. Pooling the nine
    # repeats as pairs would give about [1.066, 1.094]: too narrow, the repeats of one start share its effect.
    def started(means: list[float], spread: float) -> list[dict]:
        return [
            {"concurrency": 256, "repeat": 3 * s + r, "server_start": s + 1, "output_tok_s": m + d, "valid": True}
            for s, m in enumerate(means)
            for r, d in enumerate((-spread, 0.0, spread))
        ]

    (row,) = stats.paired_ratio(started([106, 108, 110], 0.5), started([100, 100, 100], 0.0))
    assert row["pairs"] == 3 and row["ratios"] == pytest.approx([1.06, 1.08, 1.10])
    assert row["low"] == pytest.approx(1.03132, abs=1e-4) and row["high"] == pytest.approx(1.13073, abs=1e-4)
