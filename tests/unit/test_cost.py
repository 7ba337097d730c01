"""Dollars per million output tokens, checked against values worked out by hand."""

from __future__ import annotations

import pytest

from quantverdict.measure.cost import usd_per_mtok, usd_per_mtok_or_none


def test_hand_examples() -> None:
    # $3.60/GPU-h * 2 GPUs = $7.20/h; 1000 tok/s * 3600 s = 3.6e6 tok/h -> 7.20 / 3.6 = $2.00 per 1e6 tokens
    assert usd_per_mtok(3.60, 2, 1000.0) == pytest.approx(2.0)
    # $2.49/h, 1 GPU, 2500 tok/s = 9.0e6 tok/h -> 2.49 / 9 = $0.276667 per 1e6 tokens
    assert usd_per_mtok(2.49, 1, 2500.0) == pytest.approx(0.2766667, abs=1e-7)
    # 4 GPUs at $1/h with 100 tok/s: $4/h over 0.36e6 tok/h -> $11.1111 per 1e6 tokens
    assert usd_per_mtok(1, 4, 100) == pytest.approx(11.111111, abs=1e-6)


@pytest.mark.parametrize(
    "price,n_gpus,tok_s",
    [(0.0, 1, 100.0), (-1.0, 1, 100.0), (1.0, 0, 100.0), (1.0, 1, 0.0), (1.0, 1, -5.0), (1.0, 1.5, 100.0),
     (float("nan"), 1, 100.0), (1.0, 1, float("inf")), (1.0, True, 100.0)],
)  # fmt: skip
def test_non_positive_or_bad_inputs(price: float, n_gpus: int, tok_s: float) -> None:
    with pytest.raises(ValueError):
        usd_per_mtok(price, n_gpus, tok_s)


def test_none_safe() -> None:
    assert usd_per_mtok_or_none(None, 1, 1000.0) is None
    assert usd_per_mtok_or_none(3.60, 1, None) is None
    assert usd_per_mtok_or_none(3.60, 2, 1000.0) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        usd_per_mtok_or_none(0.0, 1, 1000.0)
