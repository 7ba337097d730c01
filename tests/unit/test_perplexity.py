"""Window plans and perplexity arithmetic, checked against values worked out by hand."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from quantverdict.perplexity import perplexities, window_plan


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
