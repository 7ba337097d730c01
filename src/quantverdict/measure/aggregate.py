"""Repeat aggregation: sweep points grouped by load level, and the median of a level over its valid repeats.

The one implementation behind the record's per-load summary (:func:`quantverdict.measure.sweep.summarize`) and
the review's speed points (:func:`quantverdict.review.speed.speed_points`). What makes a point valid, saturated or
part of a load level is passed in (:mod:`quantverdict.measure.sweep` defines it).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeGuard

from typing_extensions import TypeVar

from quantverdict.measure.points import SweepPoint

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


def medians(valid: Sequence[SweepPoint], keys: Iterable[str]) -> dict[str, float | None]:
    """Per key, the median over the valid repeats where it is a number in **every** repeat (the mean of the middle
    two for an even count), else the first repeat's value (None where that is not a number).

    Raises:
        IndexError: ``valid`` is empty.
    """
    out: dict[str, float | None] = {}
    for k in keys:
        nums = [x for p in valid if (x := p.number(k)) is not None]
        out[k] = statistics.median(nums) if len(nums) == len(valid) else valid[0].number(k)
    return out


def ranges(valid: Sequence[SweepPoint], keys: Iterable[str]) -> dict[str, tuple[float, float]]:
    """``{key: (min, max)}`` over the valid repeats, for each of ``keys`` that is a number in every repeat."""
    out = {}
    for k in keys:
        nums = [x for p in valid if (x := p.number(k)) is not None]
        if nums and len(nums) == len(valid):
            out[k] = (min(nums), max(nums))
    return out
