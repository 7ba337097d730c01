"""One saturation decision per sweep point, read by the live log, the record, the grid table and the review; and
a ceiling never under a rate the scheme achieved, nor under its goodput.

Each point is built as ``vllm bench serve --save-detailed`` writes it: 8 requests of 4 output tokens (3 ITL gaps of
0.25 s), request i sent at ``starts[i]`` and finishing ``e2e[i]`` seconds later. The rule
(:func:`quantverdict.measure.validity.saturation`): completion pace = (completions - 1) / (last finish - first
finish) over arrival pace = (requests - 1) / (last sent - first sent), saturated under 0.9.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from quantverdict.config.schema import ReviewConfig
from quantverdict.measure import bench_result
from quantverdict.measure.points import as_point
from quantverdict.measure.sweep_plan import INF, SweepPoint
from quantverdict.measure.validity import point_saturation
from quantverdict.results.record import JobRecord, Speed
from quantverdict.results.table import format_table
from quantverdict.review import build_review
from quantverdict.review.speed import raw_points, speed_summary
from quantverdict.serving.speed import speed_validity
from review_records import record

pytestmark = pytest.mark.unit

# load 0.5 req/s -> the 1 req/s point stands for it; every request of it meets these objectives
RC = ReviewConfig(log_to_mlflow=False, load_rps=0.5, ttft_ms_p99=10_000, itl_ms_p99=1_000, e2e_ms=None)


def result(starts: list[float], e2e: list[float]) -> dict[str, Any]:
    """A --save-detailed result: 4 tokens a request, TTFT = E2E - 0.75 s; duration first sent to last finish."""
    n = len(starts)
    duration = max(s + e for s, e in zip(starts, e2e)) - min(starts)
    return {
        "completed": n,
        "failed": 0,
        "duration": duration,
        "request_throughput": n / duration,
        "output_throughput": 4 * n / duration,
        "total_output_tokens": 4 * n,
        "start_times": starts,
        "ttfts": [e - 0.75 for e in e2e],
        "itls": [[0.25, 0.25, 0.25] for _ in range(n)],
        "latencies": list(e2e),
        "output_lens": [4] * n,
        "errors": [""] * n,
    }


def measured(tmp: Path, runs: list[tuple[float | str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The points as the sweep records them (serving.benchmark.parse_point): parsed, with request times and the
    result file (the review's goodput reads it)."""
    out = []
    for rate, res in runs:
        p = bench_result.parse_result(res, SweepPoint(rate, None, 0), num_prompts=8, output_len=4)
        path = tmp / f"rate-{rate}.json"
        path.write_text(json.dumps(res))
        p.request_times, p.result_file = bench_result.request_times(res), str(path)
        out.append(p.to_dict())
    return out


def surfaces(points: list[dict[str, Any]]) -> dict[str, Any]:
    """What each reader says of every point: the live log's tag, the record's per-load summary, the grid table's
    validity cell and the review's point; and the ceiling the record and the review report."""
    logs = [bench_result.summary_line(as_point(p), i + 1, len(points)) for i, p in enumerate(points)]
    typed = Speed.model_validate({"mode": "rate", "points": points})
    speed_validity(typed, "W4A16", None, False)  # what the job writes into its record
    speed = typed.to_dict()
    rec = record("gptq", sp=speed)
    table = format_table([rec]).split("### Speed", 1)[1].split("\n### ", 1)[0]
    cells = [row.rsplit("|", 2)[1].strip() for row in table.splitlines() if row.startswith("| m / gptq")]
    review, _, _ = speed_summary(JobRecord.view(rec), RC)
    return {
        "log": ["SATURATED" in line for line in logs],
        "log_lines": logs,
        "record": [lv["saturated"] for lv in speed["summary"]],
        "table": [c.startswith("saturated") for c in cells],
        "review": [p.saturated for p in review.points],
        "ceiling": speed["sustained_ceiling"],
        "speed": review,
        "rec": rec,
    }


def test_the_issue_sweep_one_decision_and_a_ceiling_over_the_goodput(tmp_path: Path) -> None:
    # 1 req/s: sent 0, 1, ..., 7, each 3 s: done 3, 4, ..., 10. Paces 7 / 7 s and 7 / 7 s: ratio 1.0, kept up.
    # (The whole run, 8 / 10 s = 0.80 req/s against 1 offered, would read saturated.)
    one = result([float(i) for i in range(8)], [3.0] * 8)
    # 4 req/s: sent 0, .25, ..., 1.75 (7 / 1.75 s = 4 req/s), done 3, 4.5, ..., 13.5 (7 / 10.5 s = 0.667 req/s):
    # ratio 1/6 = 0.167, saturated; whole run 8 / 13.5 s = 0.593 req/s
    four = result([0.25 * i for i in range(8)], [3.0 + 1.25 * i for i in range(8)])
    pts = measured(tmp_path, [(1.0, one), (4.0, four)])
    assert [p["achieved_rps"] for p in pts] == [pytest.approx(0.8), pytest.approx(8 / 13.5)]
    s = surfaces(pts)
    # the same decision on every surface: 1 req/s kept up, 4 req/s saturated
    for where in ("log", "record", "table", "review"):
        assert s[where] == [False, True], where
    # the ceiling: the highest achieved rate over the valid loads, 0.80 req/s at 1 req/s (not the 0.593 of the
    # saturated 4 req/s); its output tok/s the same level's whole run, 32 tokens / 10 s
    c = s["ceiling"]
    assert c["kind"] == "saturated" and c["offered_rate_rps"] == 1.0
    assert c["rps"] == pytest.approx(0.8) and c["output_tok_s"] == pytest.approx(3.2)
    sp = s["speed"]
    assert sp.ceiling.rps == pytest.approx(0.8) and sp.ceiling.label == "1 req/s"
    # goodput at the load: all 8 requests of the 1 req/s point met the SLO over its 10 s: 0.80 req/s, not over
    # the ceiling; and no load's achieved rate is over it either
    assert sp.goodput_rps == pytest.approx(0.8)
    assert sp.ceiling.rps >= sp.goodput_rps
    assert all(sp.ceiling.rps >= (p.achieved_rps or 0) for p in sp.points)
    review = build_review([record("bf16"), s["rec"]], RC, "t")
    text = review.scheme("m", "gptq").checks.latency.text
    assert "goodput 0.80 req/s; ceiling 0.80 req/s" in text
    # what the decisions rest on, stored in each point and shown by the log
    assert [p["saturation_ratio"] for p in pts] == [pytest.approx(1.0), pytest.approx(1 / 6)]
    assert [p["saturation_basis"] for p in pts] == ["arrival_pace", "arrival_pace"]
    assert "SATURATED (completions at 0.17x the arrival pace)" in s["log_lines"][1]


def test_a_short_run_at_a_rate_the_server_keeps_up_with_is_not_saturated_anywhere(tmp_path: Path) -> None:
    # 1 req/s: sent 0, 1, ..., 7, each 5 s: done 5, 6, ..., 12: ratio 1.0. Its steady window (5, 7] holds 2
    # completions (too few for a rate) and its whole run 8 / 12 s = 0.67 req/s; beside it the burst: 8 requests
    # sent at once, all done at 4 s: 2.0 req/s
    slow = result([float(i) for i in range(8)], [5.0] * 8)
    burst = result([0.0] * 8, [4.0] * 8)
    pts = measured(tmp_path, [(1.0, slow), (INF, burst)])
    assert pts[0]["steady_rps"] is None and pts[0]["achieved_rps"] == pytest.approx(8 / 12)
    s = surfaces(pts)
    for where in ("log", "table"):
        assert s[where] == [False, False], where
    for where in ("record", "review"):
        assert s[where] == [False, None], where  # the burst: never judged
    c = s["ceiling"]
    assert c["kind"] == "saturated" and c["offered_rate_rps"] == INF and c["rps"] == pytest.approx(2.0)
    review = build_review([record("bf16"), s["rec"]], RC, "t")
    line = next(v for v in review.validity if v.startswith("gptq"))
    assert "no point saturated" in line and "shortfall" not in line


def test_an_older_record_gets_the_decision_from_the_one_derivation(tmp_path: Path) -> None:
    # the same 1 req/s point recorded before the rule: its stored decision (whole run, 0.67 < 0.9) is of another
    # basis and is derived again from the request times the record kept: ratio 1.0 on every surface
    slow = result([float(i) for i in range(8)], [5.0] * 8)
    (p,) = measured(tmp_path, [(1.0, slow)])
    p.update(saturated=True, saturation_ratio=8 / 12, saturation_basis="whole_run")
    s = surfaces([p])
    for where in ("log", "record", "table", "review"):
        assert s[where] == [False], where
    derived = point_saturation(raw_points(JobRecord.view(s["rec"]))[1][0])  # the decision the review's point holds
    assert derived["saturation_basis"] == "arrival_pace" and derived["saturation_ratio"] == pytest.approx(1.0)
    assert s["ceiling"]["kind"] == "lower_bound" and s["ceiling"]["rps"] == pytest.approx(8 / 12)


def test_a_rate_the_server_kept_pace_with_passes_the_load_check_whatever_its_whole_run_rate(tmp_path: Path) -> None:
    # 8 requests sent 1 s apart, each answered in 3 s: completions at the arrival pace (ratio 1.0, not saturated),
    # but the whole run (8 completions over 10 s) reads 0.80 req/s; 4 req/s saturates. At load_rps = 1 the ceiling
    # (0.80 req/s, the highest whole-run rate) is under the load, yet the level at the load kept up with it: the
    # latency check must pass, not fail on "ceiling below the load".
    one = result([float(i) for i in range(8)], [3.0] * 8)
    four = result([0.25 * i for i in range(8)], [3.0 + 1.25 * i for i in range(8)])
    s = surfaces(measured(tmp_path, [(1.0, one), (4.0, four)]))
    assert s["record"] == [False, True] and s["ceiling"]["rps"] == pytest.approx(0.8)
    rc = ReviewConfig(log_to_mlflow=False, load_rps=1.0, ttft_ms_p99=10_000, itl_ms_p99=1_000, e2e_ms=None)
    check = build_review([record("bf16"), s["rec"]], rc, "t").scheme("m", "gptq").checks.latency
    assert check.outcome == "pass" and "ceiling 0.80 req/s" in check.text and not check.shortfall
