"""Older records read as the current schema version (quantverdict.results.migrate)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantverdict.results import migrate
from quantverdict.results.record import load

pytestmark = pytest.mark.unit


def v2_record() -> dict:
    """A version 2 record as older code wrote it: no valid/saturated on its points, null for a closed loop's
    offered rate, no speed.dtype (only the configured bench.server.dtype)."""
    return {
        "schema_version": 2,
        "tool": {"name": "quantverdict", "version": "0.1.0"},
        "config": {"model": {"dtype": "bfloat16"}, "bench": {"server": {"dtype": "auto"}}},
        "speed": {
            "points": [
                # closed loop at concurrency 4: 40 of 40 requested output tokens -> valid, never saturated
                {
                    "point": "c4_r0",
                    "concurrency": 4,
                    "offered_rate_rps": None,
                    "completed": 5,
                    "output_tokens_requested": 40,
                    "output_tokens_total": 40,
                },
                # open loop at 4 req/s, no per-request times: completion pace estimated as (9 - 1) / (5 s - 1 s)
                # = 2 req/s, 0.5 x the offered 4 < 0.9 -> saturated; 35 of 40 tokens (87.5% < 90%) -> invalid
                {
                    "point": "rate-4_r0",
                    "offered_rate_rps": 4.0,
                    "achieved_rps": 1.8,
                    "completed": 9,
                    "duration_s": 5.0,
                    "e2e_ms_p50": 1000.0,
                    "output_tokens_requested": 40,
                    "output_tokens_total": 35,
                },
                # open loop at 2 req/s: no request completed -> invalid, saturation not measurable
                {"point": "rate-2_r0", "offered_rate_rps": 2.0, "achieved_rps": 1.9, "completed": 0},
                # decided on the whole run (0.8 achieved of 1 offered: "saturated"); the pace rule says
                # (9 - 1) / (9 s - 1 s) = 1 req/s, 1.0 x the offered rate -> not saturated
                {
                    "point": "rate-1_r0",
                    "offered_rate_rps": 1.0,
                    "achieved_rps": 0.8,
                    "completed": 9,
                    "duration_s": 9.0,
                    "e2e_ms_p50": 1000.0,
                    "valid": True,
                    "saturated": True,
                    "saturation_ratio": 0.8,
                    "saturation_basis": "whole_run",
                },
            ],
            "summary": [{"concurrency": 4, "offered_rate_rps": None}],
        },
    }


def test_a_version_2_record_states_what_it_left_to_the_reader() -> None:
    old = v2_record()
    new = migrate.upgrade(old)
    assert (new["schema_version"], new["migrated_from"]) == (3, 2)
    c4, r4, r2, r1 = new["speed"]["points"]
    assert (c4["offered_rate_rps"], c4["valid"], c4["saturated"]) == ("inf", True, None)
    assert c4["saturation_basis"] == "closed_loop"
    assert (r4["offered_rate_rps"], r4["valid"], r4["saturated"]) == (4.0, False, True)
    assert (r4["saturation_ratio"], r4["saturation_basis"]) == (0.5, "estimated_pace")
    assert (r2["valid"], r2["saturated"], r2["saturation_basis"]) == (False, None, "too_few_requests")
    assert (r1["saturated"], r1["saturation_ratio"], r1["saturation_basis"]) == (False, 1.0, "estimated_pace")
    assert new["speed"]["summary"][0]["offered_rate_rps"] == "inf"
    # bench.server.dtype auto: vLLM serves the checkpoint's dtype, config.model.dtype
    assert new["speed"]["dtype"] == {"value": "bfloat16", "chosen_by": "checkpoint", "why": "vLLM's auto"}
    assert old == v2_record()  # the dict given is left as read
    assert migrate.upgrade(new) is new  # the current version is returned as read


def test_a_configured_dtype_is_kept_and_recorded_keys_win() -> None:
    old = v2_record()
    old["config"]["bench"]["server"]["dtype"] = "float32"
    old["speed"]["points"][0]["valid"] = False  # recorded: kept, not recomputed
    new = migrate.upgrade(old)
    assert new["speed"]["dtype"]["value"] == "float32" and new["speed"]["dtype"]["chosen_by"] == "config"
    assert new["speed"]["points"][0]["valid"] is False


def test_load_migrates_and_refuses_a_newer_record(tmp_path: Path) -> None:
    (tmp_path / "record.json").write_text(json.dumps(v2_record()))
    assert load(tmp_path)["schema_version"] == 3
    (tmp_path / "record.json").write_text(json.dumps({**v2_record(), "schema_version": 7}))
    with pytest.raises(ValueError, match=r"record.json has schema_version 7; this code reads 1, 2, 3"):
        load(tmp_path)
    (tmp_path / "record.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="is not a quantverdict record"):
        load(tmp_path)
