"""The typed record (quantverdict.results.record.JobRecord): older versions read migrated, the dict given back."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from quantverdict import RECORD_SCHEMA_VERSION
from quantverdict.results.migrate import READABLE_VERSIONS
from quantverdict.results.record import (
    RECORD_SCHEMA_PATH,
    JobRecord,
    Record,
    RecordInvalid,
    StageInfo,
    read,
    record_schema_text,
)
from tests.review_records import record, synthetic_record

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_schema_version_is_3() -> None:
    assert RECORD_SCHEMA_VERSION == 3 and READABLE_VERSIONS == (1, 2, 3)


def test_typed_fields_of_a_committed_gpu_record() -> None:
    rec = read(FIXTURES / "gpu-records" / "qwen3.5-9b-shape" / "bf16")  # a copy of a committed H200 record
    assert rec.job is not None and rec.job.model == "qwen3.5-9b-shape" and rec.job.scheme == "bf16"
    assert rec.server.kv_cache_tokens == 2_800_370  # "GPU KV cache size: 2,800,370 tokens" in its log line
    assert rec.server.kv_cache_gib == 107.84
    assert rec.speed is not None and rec.speed.points is not None and rec.speed.summary is not None
    first = rec.speed.points[0]
    assert (first.concurrency, first.repeat, first.offered_rate_rps) == (1, 0, "inf")
    assert first.vllm_ttft_ms_p99 is not None and abs(first.vllm_ttft_ms_p99 / first.ttft_ms_p99 - 1) < 0.01
    assert rec.speed.summary[0].valid_repeats == 1
    assert rec.stages is not None and rec.stages["quantize"].status == "skipped"
    assert rec.accuracy is not None and rec.accuracy.not_applicable is not None


def test_task_metrics_and_missing_sections() -> None:
    data = record("gptq", acc_norm=0.42)
    rec = JobRecord.from_dict(data)
    assert rec.accuracy is not None and rec.accuracy.tasks is not None
    assert rec.accuracy.tasks["arc_easy"].metric("acc_norm") == 0.42
    assert rec.accuracy.tasks["arc_easy"].n == 100
    assert rec.to_dict() == data
    bare = JobRecord.from_dict({"schema_version": 3, "tool": {"name": "quantverdict"}})
    assert bare.server.kv_cache_tokens is None and bare.checkpoint_memory.weights_gib is None
    assert bare.to_dict() == {"schema_version": 3, "tool": {"name": "quantverdict"}}


def test_version_1_and_2_read_alike() -> None:
    data = synthetic_record("w8a8")
    v1, v2 = dict(data, schema_version=1), dict(data, schema_version=2)
    one, two = JobRecord.from_dict(v1).to_dict(), JobRecord.from_dict(v2).to_dict()
    assert (one.pop("migrated_from"), two.pop("migrated_from")) == (1, 2)
    assert one == two and one["schema_version"] == 3
    assert v2["schema_version"] == 2 and "migrated_from" not in v2  # the dict given is left as read


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"schema_version": 4, "tool": {"name": "quantverdict"}}, "schema_version 4; this code reads 1, 2, 3 .*newer"),
        ({"schema_version": 1}, "not a quantverdict record"),
        ({"tool": {"name": "quantverdict"}}, "not a quantverdict record"),
    ],
)
def test_unreadable_records_are_refused(bad: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        JobRecord.from_dict(bad)


def test_writer_writes_version_3_in_the_v1_layout(tmp_path: Path) -> None:
    rec = Record(job={"id": "j", "model": "m", "scheme": "bf16"}, config={"seed": 0})
    rec.stages["setup"] = StageInfo(status="ok", wall_s=0.5)
    path = rec.save(tmp_path)
    data = json.loads(path.read_text())
    assert data["schema_version"] == 3
    v1_keys = ["job", "config", "schema_version", "tool", "environment", "status", "failed_stage", "error"]
    v1_keys += ["traceback", "stages", "model", "checkpoint", "memory", "accuracy", "speed", "notes"]
    assert list(data) == v1_keys
    assert data["stages"] == {"setup": {"status": "ok", "wall_s": 0.5, "detail": ""}}
    typed = read(tmp_path)
    assert typed.schema_version == 3 and typed.stages is not None and typed.stages["setup"].wall_s == 0.5
    assert typed.to_dict() == data


def test_null_sections_read_as_empty_and_malformed_ones_are_refused() -> None:
    data = {"schema_version": 3, "tool": {"name": "quantverdict"}, "memory": None, "accuracy": {}}
    rec = JobRecord.from_dict(data)
    assert rec.server.kv_cache_tokens is None and rec.stages == {}  # empty sections to read from
    assert rec.memory.is_empty() and rec.accuracy.is_empty()
    with pytest.raises(ValueError, match="stages\n  Input should be a valid dictionary"):
        JobRecord.from_dict({**data, "stages": []})


@pytest.mark.parametrize(
    ("section", "says"),
    [
        ({"speed": {"points": [{"ttft_ms_p99": 5.0, "ttft_p99_ms": 5.0}]}}, "speed.points.0.ttft_p99_ms: Extra"),
        ({"memory": {"server": {"kv_cache_gb": 1.0}}}, "memory.server.kv_cache_gb: Extra inputs"),
        ({"job": {"model": "m", "scheme": "awq", "schem": "awq"}}, "job.schem: Extra inputs"),
        ({"speed": {"points": [{"concurrency": "many"}]}}, "speed.points.0.concurrency: Input should be a valid"),
    ],
)
def test_a_key_a_section_does_not_name_is_refused_on_read_and_on_write(
    tmp_path: Path, section: dict, says: str
) -> None:
    good = {"schema_version": 3, "tool": {"name": "quantverdict"}}
    (tmp_path / "record.json").write_text(json.dumps({**good, **section}))
    with pytest.raises(ValueError, match=says):
        read(tmp_path)
    rec = Record(job={"id": "j", "model": "m", "scheme": "bf16"}, config={})
    rec.save(tmp_path / "out")  # a valid record is written
    for name, value in section.items():
        setattr(rec, name, value)
    with pytest.raises(ValueError, match=says):
        rec.save(tmp_path / "out")
    assert read(tmp_path / "out").job.scheme == "bf16"  # the record saved before stays


def test_the_committed_record_schema_is_the_generated_one_and_a_written_record_meets_it(tmp_path: Path) -> None:
    # `make schema` rewrites it from JobRecord; a model change without it fails here
    assert RECORD_SCHEMA_PATH.read_text() == record_schema_text()
    rec = Record(job={"id": "j", "model": "m", "scheme": "bf16"}, config={"seed": 0})
    rec.stages["setup"] = StageInfo(status="ok", wall_s=0.5)
    rec.speed = {"points": [{"point": "c1_r0", "concurrency": 1, "offered_rate_rps": "inf", "ttft_ms_p99": 12.5}]}
    data = json.loads(rec.save(tmp_path).read_text())
    validator = jsonschema.Draft202012Validator(json.loads(RECORD_SCHEMA_PATH.read_text()))
    validator.validate(data)  # by jsonschema, not by the model that wrote it
    data["speed"]["points"][0]["ttft_p99_ms"] = 12.5
    with pytest.raises(jsonschema.ValidationError, match="ttft_p99_ms"):
        validator.validate(data)


def test_a_point_with_failed_requests_is_saved_and_read_back(tmp_path: Path) -> None:
    # vLLM's result for 4 requests, one refused: the point keeps up to three error samples, and the failed request's
    # finish time is None in request_times
    point = {
        "point": "rate-4_r0",
        "offered_rate_rps": 4.0,
        "completed": 3,
        "failed": 1,
        "error_samples": ["ClientConnectorError: refused"],
        "request_times": {"start_s": [0.0, 0.5, 1.0, 1.5], "end_s": [0.4, 0.9, 1.4, None]},
    }
    rec = Record(job={"id": "j", "model": "m", "scheme": "bf16"}, config={})
    rec.speed = {"points": [point]}
    got = read(rec.save(tmp_path)).speed.points[0]
    assert got.error_samples == ["ClientConnectorError: refused"] and got.request_times is not None
    assert got.request_times["end_s"] == [0.4, 0.9, 1.4, None]


def test_a_failure_is_written_even_when_the_record_is_what_failed(tmp_path: Path) -> None:
    rec = Record(job={"id": "j", "model": "m", "scheme": "bf16"}, config={})
    rec.speed = {"points": [{"point": "c1_r0", "ttft_p99_ms": 5.0}]}
    with pytest.raises(RecordInvalid, match="speed.points.0.ttft_p99_ms: Extra inputs are not permitted"):
        rec.save(tmp_path)
    assert not (tmp_path / "record.json").exists()
    rec.status, rec.error = "failed", "RecordInvalid: ..."
    written = json.loads(rec.save(tmp_path, validate=False).read_text())  # the path a failing job takes
    assert written["status"] == "failed" and written["speed"]["points"][0]["ttft_p99_ms"] == 5.0
    with pytest.raises(ValueError, match="record.json: the record does not match its model: speed.points.0"):
        read(tmp_path)
