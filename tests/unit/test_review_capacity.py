"""The review's capacity at the SLO, re-derived from hand-built records of capacity searches (closed loop, SLO
TTFT <= 1,000 ms for 90% of requests, tolerance 10%) and their per-request files; the speed read at it; the
sentence when no scheme meets the SLO.

bf16, start 1: c = 1, 2 pass (10/10), 4 fails (8/10 = 80%), 3 passes (9/10 = 90%): capacity 3, bracket (3, 4).
bf16, start 2: c = 1, 2, 4 pass, 8 fails (0/10), 6 fails (5/10), 5 passes (10/10): capacity 5, bracket (5, 6).
gptq, one start: c = 1 fails (0/10): no capacity.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from quantverdict.config.schema import ReviewConfig
from quantverdict.review import build_review, plots
from quantverdict.review.render import markdown
from review_records import conc_point, record

RC = ReviewConfig(log_to_mlflow=False, bootstrap_samples=200)
SLO = {"ttft_ms": 1000.0, "tpot_ms": None, "e2e_ms": None}


def _point(tmp: Path, job: str, c: int, start: int, good: int, sent: int = 10) -> dict[str, Any]:
    """A recorded point at concurrency ``c`` whose result file holds ``good`` requests at TTFT 0.2 s and the rest at
    1.5 s (over the 1,000 ms objective)."""
    name = f"conc-{c}_r0" + (f"_s{start}" if start > 1 else "")
    path = tmp / f"{job}-{name}.json"
    ttfts = [0.2] * good + [1.5] * (sent - good)
    detailed = {"duration": 10.0, "start_times": [0.0] * sent, "ttfts": ttfts, "itls": [[0.01]] * sent}
    path.write_text(json.dumps(detailed | {"output_lens": [2] * sent, "errors": [""] * sent}))
    return conc_point(c, 40.0, 200.0) | {
        "point": name, "repeat": start - 1, "server_start": start, "result_file": str(path),
    }  # fmt: skip


def _search(start: int, steps: list[tuple[int, bool]], capacity: int | None, bracket: list[Any]) -> dict[str, Any]:
    return {
        "server_start": start, "mode": "concurrency", "slo": SLO, "attainment_pct": 90.0, "start": 1,
        "max_load": 8, "tolerance_pct": 10.0, "repeats": 1, "capacity": capacity, "bracket": bracket,
        "stop_reason": "tolerance" if capacity else "start_failed",
        "steps": [{"step": i + 1, "load": c, "passed": ok} for i, (c, ok) in enumerate(steps)],
    }  # fmt: skip


def _speed(points: list[dict[str, Any]], searches: list[dict[str, Any]]) -> dict[str, Any]:
    return {"mode": "concurrency", "server_start_s": 30.0, "points": points, "searches": searches}


def _bf16(tmp: Path) -> dict[str, Any]:
    pts = [_point(tmp, "bf16", c, 1, g) for c, g in ((1, 10), (2, 10), (4, 8), (3, 9))]
    pts += [_point(tmp, "bf16", c, 2, g) for c, g in ((1, 10), (2, 10), (4, 10), (8, 0), (6, 5), (5, 10))]
    s1 = _search(1, [(1, True), (2, True), (4, False), (3, True)], 3, [3, 4])
    s2 = _search(2, [(1, True), (2, True), (4, True), (8, False), (6, False), (5, True)], 5, [5, 6])
    rec = record("bf16", sp=_speed(pts, [s1, s2]))
    rec["config"]["bench"]["mode"] = "concurrency"
    return rec


def _gptq(tmp: Path) -> dict[str, Any]:
    rec = record("gptq", sp=_speed([_point(tmp, "gptq", 1, 1, 0)], [_search(1, [(1, False)], None, [None, 1])]))
    rec["config"]["bench"]["mode"] = "concurrency"
    return rec


def test_capacity_per_start_and_over_starts(tmp_path: Path) -> None:
    review = build_review([_bf16(tmp_path), _gptq(tmp_path)], RC, "t")
    bf16 = next(sc for sc in review.scorecards if sc.scheme == "bf16")
    cap = bf16.speed.capacity
    assert cap is not None
    assert [(s.capacity, s.low, s.high, s.agrees_with_search) for s in cap.starts] == [
        (3, 3, 4, True),
        (5, 5, 6, True),
    ]
    # the lower middle of (3, 5) is 3; Student t (1 df, t = 12.706) on ln 3 = 1.0986, ln 5 = 1.6094: mean 1.3540,
    # s = 0.5108 / sqrt 2 = 0.3612, half-width 12.706 x 0.3612 / sqrt 2 = 3.2452: exp(-1.8912) = 0.1509,
    # exp(4.5992) = 99.41
    assert cap.capacity == 3 and cap.interval is not None
    assert (cap.interval.low, cap.interval.high) == (pytest.approx(0.1509, rel=1e-3), pytest.approx(99.41, rel=1e-3))
    assert cap.interval.method == "student_t_log_95" and cap.interval.n == 2
    # start 1 at c = 4: 8 of 10 good
    four = next(lv for lv in cap.levels if lv.server_start == 1 and lv.load == 4)
    assert (four.good, four.sent, four.attainment_pct, four.passed) == (8, 10, 80.0, False)
    # the speed is read at the capacity: concurrency 3's point, 3 x 1000 / (200 + 127 x 40) = 0.5682 req/s x 128
    assert bf16.speed.at_load is not None and bf16.speed.at_load.label == "concurrency 3"
    assert cap.output_tok_s == pytest.approx(3 * 1000 / (200 + 127 * 40) * 128)
    assert bf16.speed.load_how is not None and bf16.speed.load_how.startswith("capacity at the SLO")
    gptq = next(sc for sc in review.scorecards if sc.scheme == "gptq")
    assert gptq.speed.capacity is not None and gptq.speed.capacity.capacity is None
    assert gptq.speed.at_load is None
    md = markdown(review)
    assert "**Capacity at the SLO**" in md and "No scheme meets the SLO" not in md
    assert "Most load within the SLO" not in md  # one scheme with a capacity: nothing to rank
    assert "attainment" in plots.make_plots(review)  # SLO attainment against the load, every scheme


def test_no_scheme_meets_the_slo(tmp_path: Path) -> None:
    bf16 = _gptq(tmp_path)
    bf16["job"] |= {"scheme": "bf16", "id": "m_bf16_x", "scheme_label": "BF16"}
    bf16["config"]["scheme"] |= {"name": "bf16", "label": "BF16", "weight_bits": 16, "activation_bits": 16}
    review = build_review([bf16, _gptq(tmp_path)], RC, "t")
    assert all(sc.speed.capacity and sc.speed.capacity.capacity is None for sc in review.scorecards)
    assert "No scheme meets the SLO (TTFT <= 1,000 ms for 90% of requests) at the lowest load searched" in markdown(
        review
    )
