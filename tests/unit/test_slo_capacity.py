"""Capacity at the SLO: the double-then-bisect search and the pass rule, on sequences worked out by hand."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from quantverdict.measure.slo_capacity import CapacitySearch, capacity_from_points, pooled, tolerance


def run_search(search: CapacitySearch, passes: Callable[[float], bool], sent: int = 100) -> list[float]:
    """Drive ``search`` against a server where ``passes(load)`` says whether a load meets the SLO (all ``sent``
    requests good, or none); the loads it measured, in order."""
    loads = []
    while (load := search.next_load()) is not None:
        loads.append(load)
        search.add(load, sent if passes(load) else 0, sent)
        assert len(loads) < 50
    return loads


def test_doubling_then_bisecting_finds_capacity_13() -> None:
    # passes up to 13 in flight; start 1, tolerance 10%:
    # 1, 2, 4, 8 pass; 16 fails; mid (8+16)/2 = 12 passes (16-8 = 8 > max(1, 0.8));
    # 16-12 = 4 > 1.2: mid 14 fails; 14-12 = 2 > 1.2: mid 13 passes; 14-13 = 1 <= max(1, 1.3): done
    s = CapacitySearch(start=1, max_load=256, tolerance_pct=10, attainment_pct=99)
    assert run_search(s, lambda c: c <= 13) == [1, 2, 4, 8, 16, 12, 14, 13]
    f = s.finding()
    assert (f.capacity, f.low, f.high) == (13, 13, 14)
    assert s.stop_reason == "tolerance"


def test_rate_mode_bisects_in_req_per_s() -> None:
    # passes up to 5 req/s; start 0.5, tolerance 10%: 0.5, 1, 2, 4 pass, 8 fails;
    # mid 6 fails (8-4 = 4 > 0.4); mid 5 passes (6-4 = 2 > 0.4); mid 5.5 fails (6-5 = 1 > 0.5);
    # 5.5-5 = 0.5 <= 10% of 5: done
    s = CapacitySearch(start=0.5, max_load=64, tolerance_pct=10, attainment_pct=99, mode="rate")
    assert run_search(s, lambda r: r <= 5) == [0.5, 1, 2, 4, 8, 6, 5, 5.5]
    f = s.finding()
    assert (f.capacity, f.high) == (5, 5.5)  # 5.5 - 5 = 0.5 = 10% of 5
    assert f.high - f.capacity <= tolerance(5, 10, "rate")


def test_start_failing_gives_no_capacity() -> None:
    s = CapacitySearch(start=8, max_load=512, tolerance_pct=10, attainment_pct=99)
    assert run_search(s, lambda c: False) == [8]
    assert s.finding().capacity is None and s.finding().high == 8
    assert s.stop_reason == "start_failed"


def test_max_load_is_tried_once_and_passing_ends_the_search() -> None:
    # start 8, cap 40: 8, 16, 32 pass, then min(64, 40) = 40 passes: capacity "at least 40"
    s = CapacitySearch(start=8, max_load=40, tolerance_pct=10, attainment_pct=99)
    assert run_search(s, lambda c: True) == [8, 16, 32, 40]
    assert s.finding().capacity == 40 and s.finding().high is None
    assert s.stop_reason == "max_load_passed"


def test_max_load_failing_is_bisected_below_it() -> None:
    # start 8, cap 40, passes up to 35: 8, 16, 32 pass, 40 fails; 40-32 = 8 > 3.2: mid 36 fails;
    # 36-32 = 4 > 3.2: mid 34 passes; 36-34 = 2 <= 3.4: done
    s = CapacitySearch(start=8, max_load=40, tolerance_pct=10, attainment_pct=99)
    assert run_search(s, lambda c: c <= 35) == [8, 16, 32, 40, 36, 34]
    assert (s.finding().capacity, s.finding().high) == (34, 36)


def test_repeats_are_pooled_over_requests() -> None:
    # load 4: 99 + 90 good of 100 + 100 sent = 94.5% (one repeat alone passes 95%, pooled it fails);
    # load 2: 100 + 91 of 100 + 100 = 95.5% passes
    runs = [(2, 100, 100), (2, 91, 100), (4, 99, 100), (4, 90, 100), (8, 10, 10)]
    f = capacity_from_points(runs, 95.0)
    assert [(lo.load, lo.good, lo.sent, lo.passed) for lo in f.loads] == [
        (2, 191, 200, True),
        (4, 189, 200, False),
        (8, 10, 10, True),
    ]
    # 8 passes but 4, below it, fails: the capacity is 2, bracket (2, 4)
    assert (f.capacity, f.low, f.high) == (2, 2, 4)
    assert pooled([(1, 0, 0)], 99.0)[0].attainment_pct == 0.0  # nothing sent: fails


def test_a_repeat_counts_by_its_requests() -> None:
    # 10 of 10 and 80 of 100: (10 + 80) / 110 = 81.8%, not the mean of 100% and 80% (90%)
    (lo,) = pooled([(1, 10, 10), (1, 80, 100)], 85.0)
    assert lo.attainment_pct == pytest.approx(100 * 90 / 110) and not lo.passed


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"start": 0}, "start=0 must be a finite load > 0"),
        ({"start": float("inf")}, "start=inf must be a finite load > 0"),
        ({"start": 16, "max_load": 8}, "max_load=8 must be finite and >= start=16"),
        ({"tolerance_pct": 0}, "tolerance_pct=0 must be > 0"),
    ],
)
def test_bad_settings_are_refused(kw: dict[str, float], message: str) -> None:
    args = {"start": 1.0, "max_load": 8.0, "tolerance_pct": 10.0} | kw
    with pytest.raises(ValueError) as err:
        CapacitySearch(args["start"], args["max_load"], args["tolerance_pct"], attainment_pct=99.0)
    assert message in str(err.value)
