"""Window plans and perplexity arithmetic, checked against values worked out by hand."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from quantverdict.measure.perplexity import family_check, perplexities, scored_slices, window_plan


def _scored(plan: list[tuple[int, int, int]]) -> Counter[int]:
    """How often each token index is scored: a window scores the last n_scored of [begin, end)."""
    return Counter(t for begin, end, n in plan for t in range(end - n, end))


def test_non_overlapping_windows_hand_worked() -> None:
    # n=10, L=4, stride=4: windows [0,4) [4,8) [8,10); the first token of each is context only,
    # so they score 3, 3 and 1 tokens: 1,2,3 | 5,6,7 | 9  -> 7 targets.
    plan = window_plan(10, 4, 4)
    assert plan == [(0, 4, 3), (4, 8, 3), (8, 10, 1)]
    assert sorted(_scored(plan)) == [1, 2, 3, 5, 6, 7, 9]
    assert max(_scored(plan).values()) == 1


def test_sliding_windows_score_every_target_once() -> None:
    # n=10, L=4, stride=2: windows start at 0,2,4,6; ends 4,6,8,10.
    # scored: 4-1=3 (tokens 1..3), then end - previous end = 2 each (4,5 | 6,7 | 8,9) -> 9 = n-1 targets.
    plan = window_plan(10, 4, 2)
    assert plan == [(0, 4, 3), (2, 6, 2), (4, 8, 2), (6, 10, 2)]
    counts = _scored(plan)
    assert sorted(counts) == list(range(1, 10))
    assert set(counts.values()) == {1}


@pytest.mark.parametrize("n,seq_len,stride", [(2, 2, 1), (7, 3, 1), (100, 16, 5), (1000, 64, 63), (33, 8, 3)])
def test_sliding_windows_property(n: int, seq_len: int, stride: int) -> None:
    plan = window_plan(n, seq_len, stride)
    counts = _scored(plan)
    assert sorted(counts) == list(range(1, n)) and set(counts.values()) == {1}
    for begin, end, n_scored in plan:
        assert 0 <= begin < end <= n and end - begin <= seq_len
        # after the first window, every scored token sees at least seq_len - stride tokens of context
        if begin > 0:
            assert (end - n_scored) - begin >= seq_len - stride


def test_short_text_and_exact_multiple() -> None:
    # n=3 < L=4: one window [0,3) scoring tokens 1,2.
    assert window_plan(3, 4, 4) == [(0, 3, 2)]
    # n=8, L=4, stride=4: [0,4) [4,8), 3 targets each; no empty tail window.
    assert window_plan(8, 4, 4) == [(0, 4, 3), (4, 8, 3)]
    # n=9: the tail window [8,9) holds one token and scores nothing, so it is left out.
    assert window_plan(9, 4, 4) == [(0, 4, 3), (4, 8, 3)]


@pytest.mark.parametrize("args", [(1, 4, 4), (10, 1, 1), (10, 4, 0), (10, 4, 5)])
def test_bad_arguments(args: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError):
        window_plan(*args)


def test_perplexities_from_one_sum() -> None:
    # nll = 10 ln 2 nats. token: exp(10 ln2 / 10) = 2; word: exp(10 ln2 / 5) = 2^2 = 4;
    # byte: exp(10 ln2 / 20) = 2^0.5 = 1.41421...; bits/byte = 10 ln2 / (20 ln2) = 0.5.
    out = perplexities(10 * math.log(2), n_tokens=10, n_words=5, n_bytes=20)
    assert out["token_perplexity"] == pytest.approx(2.0)
    assert out["word_perplexity"] == pytest.approx(4.0)
    assert out["byte_perplexity"] == pytest.approx(math.sqrt(2))
    assert out["bits_per_byte"] == pytest.approx(0.5)
    # consistency: bits_per_byte = log2(byte_perplexity)
    assert out["bits_per_byte"] == pytest.approx(math.log2(out["byte_perplexity"]))


def test_perplexities_partial_units_and_errors() -> None:
    # only tokens given: nll = 3 * ln 5 over 3 tokens -> 5
    assert perplexities(3 * math.log(5), n_tokens=3) == {"token_perplexity": pytest.approx(5.0)}
    # zero loss -> perplexity 1, 0 bits per byte
    assert perplexities(0.0, n_bytes=7) == {"byte_perplexity": 1.0, "bits_per_byte": 0.0}
    with pytest.raises(ValueError):
        perplexities(1.0, n_words=0)


def test_scored_slices_align_logits_with_targets() -> None:
    # window [4, 8) of w=4 tokens scoring its last 3: targets at window positions 1, 2, 3 (tokens 5, 6, 7),
    # predicted by the logits at positions 0, 1, 2 (tokens 4, 5, 6): logits at t-1 score token t
    logits, targets = scored_slices(4, 8, 3)
    assert (logits, targets) == (slice(0, 3), slice(1, 4))
    # sliding window (2, 6, 2): w=4, targets positions 2, 3 (tokens 4, 5), logits 1, 2
    assert scored_slices(2, 6, 2) == (slice(1, 3), slice(2, 4))
    with pytest.raises(ValueError):
        scored_slices(0, 4, 4)  # the window's first token has no logits before it


@pytest.mark.parametrize("n,seq_len,stride", [(10, 4, 4), (10, 4, 2), (100, 16, 5), (1000, 64, 64), (33, 8, 3)])
def test_every_target_is_scored_exactly_once_in_text_coordinates(n: int, seq_len: int, stride: int) -> None:
    # map each window's target slice back to text positions; a window plan that re-scored the overlap
    # (n_scored = end - begin - 1 for every window) would count tokens twice here
    seen: Counter[int] = Counter()
    for begin, end, n_scored in window_plan(n, seq_len, stride):
        logits, targets = scored_slices(begin, end, n_scored)
        seen.update(range(begin + targets.start, begin + targets.stop))
        target_tokens = list(range(begin + targets.start, begin + targets.stop))
        assert [begin + i + 1 for i in range(logits.start, logits.stop)] == target_tokens
    assert set(seen.values()) == {1}
    scored = sum(seen.values())
    if stride == seq_len:
        # non-overlapping: tokens 0, L, 2L, ... are context only; n_tokens counts the others: n - ceil(n / L)
        assert scored == n - math.ceil(n / seq_len)
        assert not any(t % seq_len == 0 for t in seen)
    else:
        assert scored == n - 1  # every token but the first


def test_naive_sliding_windows_would_score_tokens_twice() -> None:
    # the faulty plan a sliding window invites: score every token of every window after its first
    naive = [(b, min(b + 4, 10), min(b + 4, 10) - b - 1) for b in range(0, 10, 2) if min(b + 4, 10) - b > 1]
    counts = _scored(naive)
    assert max(counts.values()) == 2  # e.g. token 3 in [0,4) and [2,6)
    assert max(_scored(window_plan(10, 4, 2)).values()) == 1  # the real plan: once


def test_word_byte_token_perplexity_are_named_apart_from_one_sum() -> None:
    # one document set: loglikelihood -20 ln 2 nats, 10 words, 40 bytes.
    # word: exp(20 ln2 / 10) = 4; byte: exp(20 ln2 / 40) = sqrt 2; bits/byte: 20 ln2 / (40 ln2) = 0.5
    ll = -20 * math.log(2)
    ok = family_check(ll, 10, 40, {"word_perplexity": 4.0, "byte_perplexity": math.sqrt(2), "bits_per_byte": 0.5})
    assert ok["ok"] is True and ok["max_rel_diff"] == pytest.approx(0.0, abs=1e-12)
    assert set(ok["recomputed"]) == {"word_perplexity", "byte_perplexity", "bits_per_byte"}  # no token_perplexity
    # a word perplexity divided by the token count (say 16 tokens: exp(20 ln2 / 16) = 2^1.25) is caught
    bad = family_check(ll, 10, 40, {"word_perplexity": 2**1.25, "byte_perplexity": math.sqrt(2)})
    assert bad["ok"] is False and bad["max_rel_diff"] == pytest.approx(1 - 2**1.25 / 4)
    assert family_check(ll, 10, 40, {})["ok"] is None
