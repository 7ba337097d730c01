"""The record a job writes is built from JobRecord's section models; readers outside the review read typed fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantverdict.results.baseline import baseline_candidates, find_baseline, no_baseline_reason
from quantverdict.results.record import (
    Accuracy,
    JobInfo,
    JobRecord,
    Record,
    ServerMemory,
    Speed,
    StageInfo,
    SweepPoint,
    read,
    stopped_stage,
)
from quantverdict.serving.speed import speed_validity
from review_records import stamp

pytestmark = pytest.mark.unit


def test_a_record_built_from_section_models_writes_the_keys_it_was_given(tmp_path: Path) -> None:
    rec = Record(job=JobInfo(id="m_gptq_x", model="m", scheme="gptq", finished_at=None), config={"seed": 0})
    rec.stages["benchmark"] = StageInfo(status="ok", wall_s=12.5)
    rec.memory.server = ServerMemory(kv_cache_tokens=4096, weights_gib=0.25)
    rec.speed = Speed(mode="rate", points=[SweepPoint(point="rate-4_r0", offered_rate_rps=4.0, completed=3)])
    rec.speed.sweep_wall_s = 30.0
    data = json.loads(rec.save(tmp_path).read_text())
    # what was set, and nothing else: finished_at set to None stays, the unset keys of a section are not written
    assert data["job"] == {"id": "m_gptq_x", "model": "m", "scheme": "gptq", "finished_at": None}
    assert data["memory"] == {"server": {"kv_cache_tokens": 4096, "weights_gib": 0.25}}
    assert data["speed"] == {
        "mode": "rate",
        "points": [{"point": "rate-4_r0", "offered_rate_rps": 4.0, "completed": 3}],
        "sweep_wall_s": 30.0,
    }
    assert data["accuracy"] == {} and data["checkpoint"] == {}
    assert data["stages"] == {"benchmark": {"status": "ok", "wall_s": 12.5, "detail": ""}}
    back = read(tmp_path)
    assert back.speed.points[0].completed == 3 and back.server.kv_cache_tokens == 4096
    assert back.to_dict() == data


def test_a_dict_given_for_a_section_is_validated_into_its_model() -> None:
    rec = Record(job={"id": "j", "model": "m", "scheme": "bf16"}, config={}, accuracy={"not_applicable": "why"})
    assert isinstance(rec.job, JobInfo) and rec.job.scheme == "bf16"
    assert isinstance(rec.accuracy, Accuracy) and rec.accuracy.not_applicable == "why"
    with pytest.raises(ValueError, match="schem"):
        Record(job={"id": "j", "schem": "bf16"}, config={})


def test_speed_validity_fills_the_typed_section() -> None:
    # two repeats of 1 req/s, each 8 requests sent 1 s apart and done 3 s later (pace ratio 1.0: kept up), 4 tokens
    # each: 8 requests / 10 s = 0.8 req/s, 32 tokens / 10 s = 3.2 tok/s
    times = {"start_s": [float(i) for i in range(8)], "end_s": [i + 3.0 for i in range(8)]}
    points = [
        SweepPoint(point=f"rate-1_r{r}", offered_rate_rps=1.0, repeat=r, completed=8, output_tokens_total=32,
                   output_tokens_requested=32, achieved_rps=0.8, output_tok_s=3.2, duration_s=10.0, request_times=times)
        for r in (0, 1)
    ]  # fmt: skip
    speed = Speed(mode="rate", points=points)
    speed_validity(speed, "W4A16", None, False)
    (level,) = speed.summary
    assert level.offered_rate_rps == 1.0 and level.repeats == 2 and level.valid_repeats == 2
    assert level.saturated is False and level.saturated_repeats == 0
    ceiling = speed.sustained_ceiling or {}
    assert (ceiling["kind"], ceiling["rps"], ceiling["output_tok_s"], ceiling["repeats"]) == (
        "lower_bound",
        0.8,
        3.2,
        2,
    )
    assert (speed.kernel_check or {})["effective_label"] == "W4A16"


def record(scheme: str, status: str, finished: str, tasks: dict | None = None) -> dict:
    return {
        "job": {"id": f"m_{scheme}_{finished}", "model": "m", "scheme": scheme, "finished_at": finished},
        "status": status,
        "stages": {
            "evaluate": {"status": "ok" if tasks else "skipped", "detail": "" if tasks else "eval.enabled=false"}
        },
        "accuracy": {"tasks": tasks} if tasks else {},
    }


def test_the_baseline_is_found_among_typed_records_and_among_dicts_alike() -> None:
    scheme = record("gptq", "ok", stamp(days=2))
    old = record("bf16", "ok", stamp(), {"arc_easy": {"acc": 0.5}})
    newer_without_results = record("bf16", "ok", stamp(days=1))
    dicts = [scheme, old, newer_without_results]
    # the newest first among the candidates; the baseline is the newest one with accuracy results
    assert baseline_candidates(scheme, dicts) == [newer_without_results, old]
    assert find_baseline(scheme, dicts) is old
    typed = [JobRecord.view(r) for r in dicts]
    assert find_baseline(typed[0], typed) is typed[1]
    assert no_baseline_reason(scheme, [scheme, newer_without_results]) == (
        f"no bf16 record of m holds accuracy results; candidates: m_bf16_{stamp(days=1)} (ok, finished "
        f"{stamp(days=1)}): "
        "no accuracy results, evaluate skipped (eval.enabled=false)"
    )


def test_where_an_unfinished_record_stopped() -> None:
    stages = {"quantize": {"status": "ok"}, "benchmark": {"status": "running"}}
    assert stopped_stage({"status": "running", "stages": stages}) == "benchmark"
    assert stopped_stage(JobRecord.view({"stages": {"quantize": {"status": "ok"}}})) == "after quantize"
    assert stopped_stage({"failed_stage": "evaluate", "stages": stages}) == "evaluate"
