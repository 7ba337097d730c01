"""Repeat aggregation (quantverdict.measure.aggregate), the one implementation behind sweep.summarize and the
review's speed points, worked out by hand."""

from __future__ import annotations

import math

import pytest

from quantverdict.measure import aggregate, sweep
from quantverdict.measure.points import Spread, SweepPoint


def test_levels_group_sort_and_pick_valid() -> None:
    pts = [{"r": 2.0, "ok": True, "i": 0}, {"r": 1.0, "ok": False, "i": 1}, {"r": 2.0, "ok": False, "i": 2}]
    pts.append({"r": math.inf, "ok": True, "i": 3})
    lv = aggregate.levels(pts, lambda p: p["r"], lambda p: p["ok"])
    assert [x.load for x in lv] == [1.0, 2.0, math.inf]
    assert [[p["i"] for p in x.points] for x in lv] == [[1], [0, 2], [3]]
    assert [[p["i"] for p in x.valid] for x in lv] == [[], [0], [3]]


@pytest.mark.parametrize(
    ("votes", "want"),
    [([True, True, False], True), ([True, False], False), ([None, None], None), ([None, True], True), ([], None)],
)
def test_majority(votes: list[bool | None], want: bool | None) -> None:
    assert aggregate.majority(votes) is want


def test_medians_and_ranges() -> None:
    reps = [
        SweepPoint(output_tok_s=280.0, completed=10, window_met=True, itl_ms_p50=1.0),
        SweepPoint(output_tok_s=340.0, completed=30, window_met=False),
        SweepPoint(output_tok_s=300.0, completed=20, window_met=True, itl_ms_p50=3.0),
    ]
    keys = ("output_tok_s", "completed", "itl_ms_p50", "window_met")
    assert aggregate.medians(reps, keys) == {
        "output_tok_s": 300.0,  # median of 280/300/340
        "completed": 20.0,  # median of 10/20/30
        "itl_ms_p50": 1.0,  # missing in one repeat: the first repeat's value, not a median
        "window_met": None,  # not a number
    }
    assert aggregate.medians(reps[:2], ("output_tok_s",)) == {"output_tok_s": 310.0}  # even count: (280 + 340) / 2
    assert aggregate.ranges(reps, keys) == {"output_tok_s": (280.0, 340.0), "completed": (10.0, 30.0)}


def test_summarize_uses_the_same_levels() -> None:
    base = {"output_tokens_requested": 100, "output_tokens_total": 100, "completed": 4, "num_prompts": 4}
    base["saturation_basis"] = "arrival_pace"  # each point's decision, stored when it was read
    pts = [
        {**base, "offered_rate_rps": 1.0, "repeat": 0, "output_tok_s": 10.0, "saturated": True},
        {**base, "offered_rate_rps": 1.0, "repeat": 1, "output_tok_s": 14.0, "saturated": False},
        {**base, "offered_rate_rps": 1.0, "repeat": 2, "output_tok_s": 12.0, "saturated": True},
    ]
    (level,) = sweep.summarize(pts, "rate")
    assert level.repeats == 3 and level.valid_repeats == 3
    assert level.saturated_repeats == 2 and level.saturated is True  # 2 of 3
    assert (level.metrics or {})["output_tok_s"] == Spread(median=12.0, min=10.0, max=14.0, n=3)
