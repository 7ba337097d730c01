"""KL divergence to the baseline, top-1 agreement and Δp, checked against values worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from quantverdict.measure.kld import (
    TokenStats,
    TopK,
    concat_token_stats,
    scheme_at_ids,
    summarize,
    token_stats,
    topk_from_full,
    topk_kld_bounds,
    topk_token_stats,
)


def _log(rows: list[list[float]]) -> np.ndarray:
    return np.log(np.array(rows, dtype=np.float64))


# Three scored tokens over a vocabulary of 3 (rows sum to 1), targets [0, 2, 2].
BASE3 = [[0.7, 0.2, 0.1], [0.2, 0.5, 0.3], [0.1, 0.1, 0.8]]
SCHEME3 = [[0.6, 0.3, 0.1], [0.2, 0.3, 0.5], [0.3, 0.3, 0.4]]
TARGETS3 = np.array([0, 2, 2])
# KL per token, by hand:
#   t0: 0.7 ln(0.7/0.6) + 0.2 ln(0.2/0.3) + 0.1 ln 1 = 0.7*0.1541507 - 0.2*0.4054651 = 0.1079055 - 0.0810930 = 0.0268125
#   t1: 0.2 ln 1 + 0.5 ln(5/3) + 0.3 ln(3/5) = (0.5 - 0.3)*0.5108256 = 0.1021651
#   t2: 2 * 0.1 ln(1/3) + 0.8 ln(0.8/0.4) = -0.2*1.0986123 + 0.8*0.6931472 = -0.2197225 + 0.5545177 = 0.3347953
KLD3 = [0.0268125, 0.1021651, 0.3347953]


def test_kl_of_two_hand_made_distributions() -> None:
    # P=[0.5,0.5], Q=[0.9,0.1]: 0.5 ln(0.5/0.9) + 0.5 ln(0.5/0.1) = 0.5*(-0.5877867) + 0.5*1.6094379 = 0.5108256
    # the other direction would be 0.9 ln(0.9/0.5) + 0.1 ln(0.1/0.5) = 0.5290080 - 0.1609438 = 0.3680642
    st = token_stats(_log([[0.5, 0.5]]), _log([[0.9, 0.1]]), np.array([1]))
    assert st.kld[0] == pytest.approx(0.5108256, abs=1e-7)
    assert st.kld_exact and st.top_k is None
    # identical distributions: KL 0
    same = token_stats(_log([[0.2, 0.8]]), _log([[0.2, 0.8]]), np.array([0]))
    assert same.kld[0] == pytest.approx(0.0, abs=1e-12)


def test_three_token_example_kld_top1_and_delta_p() -> None:
    st = token_stats(_log(BASE3), _log(SCHEME3), TARGETS3)
    assert st.kld == pytest.approx(KLD3, abs=1e-7)
    # argmax: t0 base 0 / scheme 0 (same); t1 base 1 / scheme 2 (differs); t2 base 2 / scheme 2 (same)
    assert st.top1_agree.tolist() == [True, False, True]
    # p(correct): base 0.7, 0.3, 0.8; scheme 0.6, 0.5, 0.4 -> Δp = scheme - base = -0.1, +0.2, -0.4
    assert st.p_base_correct == pytest.approx([0.7, 0.3, 0.8])
    assert st.p_scheme_correct == pytest.approx([0.6, 0.5, 0.4])
    assert st.delta_p == pytest.approx([-0.1, 0.2, -0.4])


def test_summary_one_window_hand_worked_and_no_interval() -> None:
    s = summarize([token_stats(_log(BASE3), _log(SCHEME3), TARGETS3)])
    # mean = (0.0268125 + 0.1021651 + 0.3347953) / 3 = 0.4637729 / 3 = 0.1545910
    assert s.mean_kld == pytest.approx(0.1545910, abs=1e-7)
    assert s.median_kld == pytest.approx(0.1021651, abs=1e-7)
    # p99, linear: position 0.99 * (3 - 1) = 1.98 -> 0.1021651 + 0.98 * (0.3347953 - 0.1021651) = 0.3301427
    assert s.p99_kld == pytest.approx(0.3301427, abs=1e-7)
    assert s.max_kld == pytest.approx(0.3347953, abs=1e-7)
    # 2 of 3 tokens agree -> 66.667 %
    assert s.top1_agreement_pct == pytest.approx(200.0 / 3.0)
    # RMS Δp = sqrt((0.01 + 0.04 + 0.16) / 3) = sqrt(0.07) = 0.2645751 -> 26.45751 %; mean Δp = -0.3/3 -> -10 %
    assert s.rms_delta_p_pct == pytest.approx(26.45751, abs=1e-5)
    assert s.mean_delta_p_pct == pytest.approx(-10.0)
    assert (s.n_tokens, s.n_windows) == (3, 1)
    # one window: no interval, and the result says why
    d = s.to_dict()
    for key in ("mean_kld_ci_low", "mean_kld_ci_high", "top1_agreement_pct_ci_low", "top1_agreement_pct_ci_high"):
        assert d[key] is None
    assert d["interval_method"] is None
    assert "no interval" in str(d["interval_note"])
    assert {"mean_kld", "median_kld", "p99_kld", "max_kld", "top1_agreement_pct", "rms_delta_p_pct"} <= set(d)


def test_summary_interval_over_windows() -> None:
    # the same three tokens as three windows of one token each: the pooled point values do not change
    full = token_stats(_log(BASE3), _log(SCHEME3), TARGETS3)
    wins = [
        TokenStats(full.kld[i : i + 1], full.top1_agree[i : i + 1], full.p_base_correct[i : i + 1],
                   full.p_scheme_correct[i : i + 1])
        for i in range(3)
    ]  # fmt: skip
    s = summarize(wins, samples=2000, seed=1)
    assert s.mean_kld == pytest.approx(0.1545910, abs=1e-7)
    assert s.n_windows == 3 and s.interval_note is None and s.interval_method is not None
    assert s.mean_kld_ci_low is not None and s.mean_kld_ci_high is not None
    # a resample's mean lies between the smallest and the largest window mean
    assert 0.0268125 - 1e-7 <= s.mean_kld_ci_low < s.mean_kld < s.mean_kld_ci_high <= 0.3347953 + 1e-7
    assert s.top1_agreement_pct_ci_low is not None and s.top1_agreement_pct_ci_high is not None
    assert 0.0 <= s.top1_agreement_pct_ci_low < 200.0 / 3.0 < s.top1_agreement_pct_ci_high <= 100.0
    # fixed seed: the same interval again
    again = summarize(wins, samples=2000, seed=1)
    assert (again.mean_kld_ci_low, again.mean_kld_ci_high) == (s.mean_kld_ci_low, s.mean_kld_ci_high)


def test_topk_lower_bound_with_known_tail() -> None:
    # vocab 4, P = [0.6, 0.2, 0.15, 0.05], Q = [0.5, 0.2, 0.1, 0.2]; the baseline keeps k = 2 (ids 0, 1):
    # tail masses P_rest = 0.2, Q_rest = 0.3.
    # lumped KL = 0.6 ln(1.2) + 0.2 ln(1) + 0.2 ln(0.2/0.3) = 0.1093929 - 0.0810930 = 0.0282999
    # true KL   = 0.1093929 + 0.15 ln(1.5) + 0.05 ln(0.25) = 0.1093929 + 0.0608198 - 0.0693147 = 0.1008980
    # gap = P_rest * KL([0.75, 0.25] || [1/3, 2/3]) = 0.2 * (0.75 ln 2.25 + 0.25 ln 0.375) = 0.2 * 0.3629904 = 0.0725981
    p = _log([[0.6, 0.2, 0.15, 0.05]])
    q = _log([[0.5, 0.2, 0.1, 0.2]])
    tgt = np.array([2])
    exact = token_stats(p, q, tgt).kld[0]
    assert exact == pytest.approx(0.1008980, abs=1e-7)
    base = topk_from_full(p, 2, tgt)
    assert base.ids.tolist() == [[0, 1]]
    assert math.exp(base.rest_logprob[0]) == pytest.approx(0.2)  # type: ignore[index]
    scheme = scheme_at_ids(q, base.ids, tgt)
    # columns: base ids 0, 1, then the scheme's best other token: id 3 (0.2 > 0.1); rest = id 2 alone
    assert scheme.ids.tolist() == [[0, 1, 3]]
    assert math.exp(scheme.rest_logprob[0]) == pytest.approx(0.1)  # type: ignore[index]
    st = topk_token_stats(base, scheme)
    assert st.kld[0] == pytest.approx(0.0282999, abs=1e-7)
    assert st.kld[0] <= exact
    assert not st.kld_exact and st.top_k == 2
    assert exact - st.kld[0] == pytest.approx(0.0725981, abs=1e-7)
    # upper: every tail P <= 0.2 (smallest kept), a_v <= min(1, 0.2/0.2) = 1; q_min = 0.1, Q_rest = 0.3:
    # gap <= 0.2 ln(0.3/0.1) = 0.2 * 1.0986123 = 0.2197225 -> upper = 0.0282999 + 0.2197225 = 0.2480224
    lo, hi = topk_kld_bounds(base, scheme, q.min(axis=1))
    assert lo[0] == pytest.approx(0.0282999, abs=1e-7)
    assert hi[0] == pytest.approx(0.2480224, abs=1e-7)
    assert lo[0] <= exact <= hi[0]
    # no q_min (server backend): the gap is unbounded
    assert topk_kld_bounds(base, scheme)[1][0] == math.inf
    # top-1 (id 0 on both sides) and p(correct) (target id 2: 0.15 and 0.1) are exact
    assert st.top1_agree.tolist() == [True]
    assert st.delta_p == pytest.approx([0.1 - 0.15])


def test_topk_tail_spread_like_baseline_is_exact() -> None:
    # P = [0.5, 0.3, 0.1, 0.1], Q = [0.4, 0.4, 0.1, 0.1]: the tails are proportional, so lumping loses nothing:
    # 0.5 ln(1.25) + 0.3 ln(0.75) + 0.2 ln(0.2/0.2) = 0.1115718 - 0.0863046 = 0.0252672
    p = _log([[0.5, 0.3, 0.1, 0.1]])
    q = _log([[0.4, 0.4, 0.1, 0.1]])
    tgt = np.array([0])
    base = topk_from_full(p, 2, tgt)
    st = topk_token_stats(base, scheme_at_ids(q, base.ids, tgt))
    assert st.kld[0] == pytest.approx(0.0252672, abs=1e-7)
    assert token_stats(p, q, tgt).kld[0] == pytest.approx(0.0252672, abs=1e-7)


def test_topk_server_form_own_topk_no_rest() -> None:
    # server backend: each side sends only its own top-2, no rest mass (derived as 1 - sum).
    # P top-2: id 0 (0.6), id 1 (0.2); Q top-2: id 0 (0.5), id 3 (0.2). Known on both sides: S = {0}.
    # P_rest = 1 - 0.6 = 0.4, Q_rest = 1 - 0.5 = 0.5:
    # KL_S = 0.6 ln(1.2) + 0.4 ln(0.8) = 0.1093929 - 0.0892574 = 0.0201355 (<= 0.1008980, the true KL)
    base = TopK(ids=np.array([[0, 1]]), logprobs=_log([[0.6, 0.2]]), target_logprob=np.log([0.15]))
    scheme = TopK(ids=np.array([[0, 3]]), logprobs=_log([[0.5, 0.2]]), target_logprob=np.log([0.1]))
    st = topk_token_stats(base, scheme)
    assert st.kld[0] == pytest.approx(0.0201355, abs=1e-7)
    assert st.top1_agree.tolist() == [True]
    # the scheme's top-1 differs from the baseline's: id 3 first
    other = TopK(ids=np.array([[0, 3]]), logprobs=_log([[0.2, 0.5]]), target_logprob=np.log([0.1]))
    assert topk_token_stats(base, other).top1_agree.tolist() == [False]


def test_topk_with_all_but_one_token_equals_full() -> None:
    # k = vocab - 1 leaves one token in the rest bucket on each side: the lumped KL is the exact KL
    p = _log(BASE3)
    q = _log(SCHEME3)
    base = topk_from_full(p, 2, TARGETS3)
    st = topk_token_stats(base, scheme_at_ids(q, base.ids, TARGETS3))
    assert st.kld == pytest.approx(KLD3, abs=1e-7)
    assert st.top1_agree.tolist() == [True, False, True]
    assert st.delta_p == pytest.approx([-0.1, 0.2, -0.4])


def test_errors() -> None:
    logits = np.array([[2.0, 1.0]])  # not log-probabilities: ln(e^2 + e^1) != 0
    with pytest.raises(ValueError, match="log_softmax"):
        token_stats(logits, logits, np.array([0]))
    with pytest.raises(ValueError, match="shape"):
        token_stats(_log([[0.5, 0.5]]), _log([[0.2, 0.3, 0.5]]), np.array([0]))
    with pytest.raises(ValueError, match="target_ids"):
        token_stats(_log([[0.5, 0.5]]), _log([[0.5, 0.5]]), np.array([2]))
    with pytest.raises(ValueError, match="repeats"):
        TopK(ids=np.array([[1, 1]]), logprobs=_log([[0.5, 0.5]]), target_logprob=np.log([0.5]))
    with pytest.raises(ValueError, match="no scored tokens"):
        summarize([])
    inf_kld = TokenStats(np.array([np.inf]), np.array([True]), np.array([0.5]), np.array([0.5]))
    with pytest.raises(ValueError, match="not finite"):
        summarize([inf_kld])


def test_summary_pools_tokens_over_unequal_windows() -> None:
    # window A = tokens t0, t1 (KLD 0.0268125, 0.1021651; top-1 agree, differ); window B = t2 (0.3347953; agrees).
    # pooled mean = 0.4637729 / 3 = 0.1545910, not the mean of window means (0.0644888 + 0.3347953) / 2 = 0.1996421
    full = token_stats(_log(BASE3), _log(SCHEME3), TARGETS3)

    def part(sl: slice) -> TokenStats:
        return TokenStats(full.kld[sl], full.top1_agree[sl], full.p_base_correct[sl], full.p_scheme_correct[sl])

    s = summarize([part(slice(0, 2)), part(slice(2, 3))], samples=2000, seed=0)
    assert s.mean_kld == pytest.approx(0.1545910, abs=1e-7)
    assert s.top1_agreement_pct == pytest.approx(200.0 / 3.0)
    # two windows: a resample is (A, A) w.p. 1/4, (A, B) 1/2, (B, B) 1/4, so its token-weighted mean is
    # 0.0644888 (A only), 0.1545910 or 0.3347953 (B only); the 2.5 % and 97.5 % quantiles of 2000 resamples
    # fall inside the first and the last block: the interval is [0.0644888, 0.3347953]; top-1: [50 %, 100 %]
    assert s.mean_kld_ci_low == pytest.approx(0.0644888, abs=1e-7)
    assert s.mean_kld_ci_high == pytest.approx(0.3347953, abs=1e-7)
    assert (s.top1_agreement_pct_ci_low, s.top1_agreement_pct_ci_high) == (pytest.approx(50.0), pytest.approx(100.0))
    # confidence 0.2: the 40 % and 60 % quantiles fall in the middle block (A, B), whose statistic is the
    # token-weighted 0.4637729 / 3 = 0.1545910 (not the unweighted (0.0644888 + 0.3347953) / 2 = 0.1996421)
    mid = summarize([part(slice(0, 2)), part(slice(2, 3))], samples=2000, seed=0, confidence=0.2)
    assert mid.mean_kld_ci_low == pytest.approx(0.1545910, abs=1e-7)
    assert mid.mean_kld_ci_high == pytest.approx(0.1545910, abs=1e-7)


def test_topk_bounds_hold_on_random_distributions() -> None:
    # property, not a hand value: lower <= exact KL <= upper for every token, for the hf form (scheme_at_ids,
    # q_min known) and the server form (both sides' own top-k, no rest mass: lower bound only)
    rng = np.random.Generator(np.random.PCG64(7))
    n, vocab, k = 200, 50, 5
    logits_p = rng.normal(0.0, 3.0, size=(n, vocab))
    logits_q = logits_p + rng.normal(0.0, 0.5, size=(n, vocab))
    p = logits_p - np.log(np.exp(logits_p).sum(axis=1, keepdims=True))
    q = logits_q - np.log(np.exp(logits_q).sum(axis=1, keepdims=True))
    tgt = rng.integers(0, vocab, size=n)
    exact = token_stats(p, q, tgt)
    base = topk_from_full(p, k, tgt)
    lo, hi = topk_kld_bounds(base, scheme_at_ids(q, base.ids, tgt), q.min(axis=1))
    assert np.all(lo <= exact.kld + 1e-12) and np.all(exact.kld <= hi + 1e-12)
    assert np.all(lo >= -1e-12)
    own_q = topk_from_full(q, k, tgt)
    server_base = TopK(base.ids, base.logprobs, base.target_logprob)  # rest mass not sent
    server_scheme = TopK(own_q.ids, own_q.logprobs, own_q.target_logprob)
    st = topk_token_stats(server_base, server_scheme)
    assert np.all(st.kld <= exact.kld + 1e-9)
    assert np.array_equal(st.top1_agree, exact.top1_agree)
    assert st.delta_p == pytest.approx(exact.delta_p)


def test_renormalize_a_float16_cache() -> None:
    # float16 rounding leaves rows un-normalized; renormalize=True shifts them back: KL of a row with itself is 0
    p = np.log(np.full((1, 1000), 1e-3, dtype=np.float64)).astype(np.float16) + np.float16(0.01)
    with pytest.raises(ValueError, match="log_softmax"):
        token_stats(p, p, np.array([0]))
    st = token_stats(p, p, np.array([0]), renormalize=True)
    assert st.kld[0] == pytest.approx(0.0, abs=1e-12)
    assert st.p_base_correct[0] == pytest.approx(1e-3)


def test_concat_row_chunks_equals_whole() -> None:
    whole = token_stats(_log(BASE3), _log(SCHEME3), TARGETS3)
    a = token_stats(_log(BASE3[:1]), _log(SCHEME3[:1]), TARGETS3[:1])
    b = token_stats(_log(BASE3[1:]), _log(SCHEME3[1:]), TARGETS3[1:])
    joined = concat_token_stats([a, b])
    assert joined.kld == pytest.approx(KLD3, abs=1e-7)
    assert joined.top1_agree.tolist() == whole.top1_agree.tolist()
    assert joined.delta_p == pytest.approx([-0.1, 0.2, -0.4])
    topk = topk_token_stats(topk_from_full(_log(BASE3[:1]), 2, TARGETS3[:1]),
                            scheme_at_ids(_log(SCHEME3[:1]), np.array([[0, 1]]), TARGETS3[:1]))  # fmt: skip
    with pytest.raises(ValueError, match="mix forms"):
        concat_token_stats([a, topk])
