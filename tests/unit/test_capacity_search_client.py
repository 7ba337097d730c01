"""The sweep client's capacity search against a stand-in for vLLM's benchmark module (no server): the points it
makes as the search goes, their names, seeds, warm-ups and ``search`` blocks, and ``search.json``; the
orchestrator's reading of the points it announced.

The stand-in's server (a closed loop of C in flight): every request's TTFT is 0.1 s x C, so the SLO
TTFT <= 1,300 ms holds for every request up to C = 13 and for none above.
"""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest

from quantverdict.children import sweep_client
from quantverdict.serving import capacity as capacity_search
from test_sweep_client_logic import CALLS, _spec, fake_vllm

__all__ = ["fake_vllm"]  # the stand-in's fixture, used by name


async def ttft_grows_with_concurrency(args: Any) -> dict[str, Any]:
    n, c = int(args.num_prompts), int(args.max_concurrency)
    CALLS["runs"].append((args.seed, n, c, args.request_rate))
    ttft = 0.1 * c
    res = {
        "duration": 20.0,  # every window long enough: one attempt per point
        "completed": n,
        "num_prompts": n,
        "start_times": [0.0] * n,
        "ttfts": [ttft] * n,
        "itls": [[0.01, 0.01, 0.01]] * n,
        "output_lens": [4] * n,
        "errors": [""] * n,
    }
    if args.save_result:
        (Path(args.result_dir) / args.result_filename).write_text(json.dumps(res))
    return res


def search_spec(tmp_path: Path, repeats: int = 1) -> dict[str, Any]:
    spec = _spec(tmp_path)
    spec["points"] = []
    spec["search"] = {
        "mode": "concurrency", "ttft_ms": 1300.0, "tpot_ms": None, "e2e_ms": None, "attainment_pct": 99.0,
        "start": 1, "max_load": 64, "tolerance_pct": 10.0, "repeats": repeats, "num_prompts": 8,
        "prompts_per_concurrency": None, "seed": 100,
    }  # fmt: skip
    return spec


def test_the_client_searches_and_records_each_step(
    fake_vllm: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fake_vllm, "main_async", ttft_grows_with_concurrency)
    out = sweep_client.run(search_spec(tmp_path))
    # 1, 2, 4, 8 pass; 16 fails; 12 passes; 14 fails; 13 passes; 14 - 13 = 1 <= max(1, 1.3): done
    names = ["conc-1_r0", "conc-2_r0", "conc-4_r0", "conc-8_r0", "conc-16_r0", "conc-12_r0", "conc-14_r0", "conc-13_r0"]
    assert [p["name"] for p in out["points"]] == names
    side = [json.loads((tmp_path / f"{n}.qv.json").read_text()) for n in names]
    # seeds on the running index: bench.seed + 1 + index
    assert [s["seed"] for s in side] == [101 + i for i in range(8)]
    assert [s["search"]["passed"] for s in side] == [True, True, True, True, False, True, False, True]
    # every load is a first repeat: a warm-up wave of C before each
    assert [s["warmup"]["requests"] for s in side] == [1, 2, 4, 8, 16, 12, 14, 13]
    found = json.loads((tmp_path / "search.json").read_text())
    assert (found["capacity"], found["bracket"], found["stop_reason"]) == (13, [13, 14], "tolerance")
    assert [st["load"] for st in found["steps"]] == [1, 2, 4, 8, 16, 12, 14, 13]
    # the orchestrator reads the points in the order the client announced them
    assert [p.name for p in capacity_search.announced_points(tmp_path)] == names


def test_repeats_run_at_each_load_and_only_the_first_warms_up(
    fake_vllm: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fake_vllm, "main_async", ttft_grows_with_concurrency)
    spec = search_spec(tmp_path, repeats=2)
    spec["search"] |= {"start": 8, "max_load": 16}
    out = sweep_client.run(spec)
    # 8 passes, 16 (the cap) fails, 12 passes, 14 fails, 13 passes: two repeats each
    assert [p["name"] for p in out["points"]][:4] == ["conc-8_r0", "conc-8_r1", "conc-16_r0", "conc-16_r1"]
    assert len(out["points"]) == 10
    r1 = json.loads((tmp_path / "conc-8_r1.qv.json").read_text())
    assert r1["warmup"]["requests"] == 0 and r1["search"]["step"] == 1
    found = json.loads((tmp_path / "search.json").read_text())
    assert found["capacity"] == 13 and found["steps"][0]["points"] == ["conc-8_r0", "conc-8_r1"]
