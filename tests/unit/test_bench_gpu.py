"""``pipelines.bench_gpu``: the ``--streams`` layout and joining runs (no GPU needed)."""

from __future__ import annotations

import pytest

from pipelines.bench_gpu import parse_streams, supersede


def test_streams_narrow_parts_to_schemes_per_gpu() -> None:
    # two GPUs: the first runs two of the embedded schemes, the second the qwen part and then int8
    assert parse_streams(["embedded:w8a8,awq", "qwen+embedded:int8"]) == [
        [("embedded", "w8a8,awq")],
        [("qwen", None), ("embedded", "int8")],
    ]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("embeded", "unknown part 'embeded'; allowed: embedded, llama, qwen"),
        ("qwen:awq", "part 'qwen' has no scheme awq; allowed: bf16, gptq"),
    ],
)
def test_streams_refuse_unknown_parts_and_schemes(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_streams([spec])


def _rec(scheme: str, status: str, started: str = "2026-11-30T02:00:00+0000") -> dict:
    return {"job": {"model": "m", "scheme": scheme, "started_at": started}, "status": status}


def test_finished_job_supersedes_the_interrupted_one() -> None:
    recs = [
        _rec("w8a8", "interrupted"), _rec("bf16", "ok"), _rec("w8a8", "ok"), _rec("awq", "failed"),
        _rec("int8", "interrupted", "2026-11-30T02:10:00+0000"), _rec("int8", "interrupted", "2026-11-30T05:01:41+0000"),
    ]
    kept = supersede(recs)
    # w8a8 finished in the second run: its interrupted job goes; awq never finished: its failure stays;
    # int8 was cut in both runs: the later one (05:01) stays
    assert [(r["job"]["scheme"], r["status"], r["job"]["started_at"][11:16]) for r in kept] == [
        ("bf16", "ok", "02:00"), ("w8a8", "ok", "02:00"), ("awq", "failed", "02:00"), ("int8", "interrupted", "05:01"),
    ]
