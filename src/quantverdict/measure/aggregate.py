"""Repeat aggregation: sweep points grouped by load level, and the median of a level over its valid repeats.

The one implementation behind the record's per-load summary (:func:`quantverdict.measure.sweep.summarize`) and
the review's speed points (:func:`quantverdict.review.speed.speed_points`). Standard library only; what makes a
point valid, saturated or part of a load level is passed in (:mod:`quantverdict.measure.sweep` defines it).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeGuard

from typing_extensions import TypeVar

# a point of a level: a typed sweep point (quantverdict.measure.points.SweepPoint) or, by default, a point as the
# record's JSON holds it
P = TypeVar("P", default=dict[str, Any])


def is_number(x: Any) -> TypeGuard[int | float]:
    """True for an int or float that is not a bool (a JSON number)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@dataclass
class Level(Generic[P]):
    """One load level of a sweep: every repeat measured at it, and those that are valid.

    Attributes:
        load: offered req/s (``inf`` for an unlimited rate) or concurrency.
        points: every repeat at this load, in the order given.
        valid: the repeats that passed the validity check, in the same order.
    """

    load: float
    points: list[P]
    valid: list[P]


def levels(points: Iterable[P], load_of: Callable[[P], float], valid: Callable[[P], bool]) -> list[Level[P]]:
    """The points grouped by ``load_of(point)``, sorted by load, each group's valid repeats picked by ``valid``."""
    groups: dict[float, list[P]] = {}
    for p in points:
        groups.setdefault(load_of(p), []).append(p)
    return [Level(load, ps, [p for p in ps if valid(p)]) for load, ps in sorted(groups.items())]


def majority(votes: Iterable[bool | None]) -> bool | None:
    """True when most of the known (non-None) votes are True; None when no vote is known.

    A level is ``saturated`` when most of its valid repeats are (a tie is not saturated).
    """
    known = [v for v in votes if v is not None]
    return (2 * sum(1 for v in known if v) > len(known)) if known else None


def median_point(valid: list[dict[str, Any]]) -> dict[str, Any]:
    """The first valid repeat with every key that is a number in **every** repeat replaced by the median
    over the repeats (float; the mean of the middle two for an even count). Other keys keep the first
    repeat's value.

    Raises:
        IndexError: ``valid`` is empty.
    """
    agg: dict[str, Any] = dict(valid[0])
    for k in valid[0]:
        nums = [x for x in (q.get(k) for q in valid) if is_number(x)]
        if len(nums) == len(valid):
            agg[k] = statistics.median(float(x) for x in nums)
    return agg


def ranges(valid: list[dict[str, Any]], keys: Iterable[str]) -> dict[str, list[float]]:
    """``{key: [min, max]}`` over the valid repeats, for each of ``keys`` that is a number in every repeat."""
    return {
        k: [min(float(q[k]) for q in valid), max(float(q[k]) for q in valid)]
        for k in keys
        if all(is_number(q.get(k)) for q in valid)
    }
