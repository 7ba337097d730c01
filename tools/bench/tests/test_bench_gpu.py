"""``tools.bench.bench_gpu``: the report over finished runs, joining runs, re-reading finished records' sweep points
from their files (no GPU needed)."""

from __future__ import annotations

import json
from pathlib import Path

from quantverdict.config.compose import as_dict, compose
from quantverdict.measure import bench_result
from quantverdict.measure.sweep_plan import SweepPoint
from quantverdict.results.record import JobRecord
from tools.bench.bench_gpu import reparse_points, run_settings, supersede


def _rec(scheme: str, status: str, started: str, finished: str | None = None) -> dict:
    return {
        "job": {
            "model": "m",
            "scheme": scheme,
            "id": f"{scheme}-{started}",
            "started_at": started,
            "finished_at": finished,
        },
        "status": status,
    }


def test_finished_job_supersedes_the_interrupted_one() -> None:
    recs = [
        _rec("w8a8", "interrupted", "02:10"),
        _rec("bf16", "ok", "02:03", "02:07"),
        _rec("w8a8", "ok", "05:01", "05:09"),
        _rec("awq", "failed", "02:20", "02:21"),
        _rec("int8", "interrupted", "02:25"),
        _rec("int8", "interrupted", "05:09"),
        _rec("fp8", "ok", "02:07", "02:11"),
        _rec("fp8", "ok", "07:00", "07:04"),
    ]
    kept = supersede(recs)
    # w8a8 finished in the second run: its interrupted job goes; awq never finished: its failure stays;
    # int8 was cut in both runs: the later one (05:09) stays; fp8 finished twice: the newer (07:04) stays.
    # Order: as found.
    assert [(r["job"]["scheme"], r["status"], r["job"]["started_at"]) for r in kept] == [
        ("bf16", "ok", "02:03"),
        ("w8a8", "ok", "05:01"),
        ("awq", "failed", "02:20"),
        ("int8", "interrupted", "05:09"),
        ("fp8", "ok", "07:00"),
    ]


def test_an_unfinished_record_says_where_it_stopped() -> None:
    from quantverdict.results.record import JobRecord, mark_interrupted, stopped_stage

    stages = {"materialize": {"status": "ok"}, "quantize": {"status": "ok"}}
    # cut between two stages: no stage is running
    assert stopped_stage(JobRecord.view({"status": "running", "stages": stages})) == "after quantize"
    rec = mark_interrupted({"status": "running", "stages": {**stages, "benchmark": {"status": "running"}}})
    assert rec["status"] == "interrupted" and rec["failed_stage"] == "benchmark"
    done = mark_interrupted({"status": "ok", "stages": stages})
    assert done["status"] == "ok" and "failed_stage" not in done


def test_results_header_states_the_settings_the_records_ran_with() -> None:
    # a grid of c=256 repeats and a one-server evaluation: both under "make bench-gpu", different settings
    def rec(scheme: str, concurrencies: list[int], repeats: int, eval_name: str, backend: str) -> dict:
        bench = {
            "name": "gpu-concurrency",
            "enabled": True,
            "mode": "concurrency",
            "concurrencies": concurrencies,
            "repeats": repeats,
            "input_len": 256,
            "output_len": 128,
        }
        return {
            "job": {"scheme": scheme},
            "config": {"bench": bench, "eval": {"name": eval_name, "enabled": True, "backend": backend}},
        }

    recs = [
        rec("bf16", [256], 3, "gpu", "vllm"),
        rec("gptq", [256], 3, "gpu", "vllm"),
        rec("bf16", [1, 64], 1, "gpu-server", "server"),
    ]
    assert run_settings(recs) == [
        "bench=gpu-concurrency: concurrency 256, repeats 3, 256 in / 128 out; eval=gpu (vllm backend): bf16, gptq",
        "bench=gpu-concurrency: concurrency 1, 64, repeats 1, 256 in / 128 out; eval=gpu-server (server backend): bf16",
    ]
    # a random-weight model: evaluation enabled in the config (eval=cpu by default), skipped by the job
    synthetic = rec("fp8", [256], 3, "cpu", "hf")
    synthetic["stages"] = {"evaluate": {"status": "not_applicable"}}
    assert run_settings([synthetic]) == [
        "bench=gpu-concurrency: concurrency 256, repeats 3, 256 in / 128 out; eval not applicable (random weights): fp8"
    ]


def test_rederive_fills_the_warmup_after_capture_from_the_server_log(tmp_path) -> None:
    from tools.bench.bench_gpu import rederive

    # a record written before the warm-up was parsed: its split has start 151 s, windows 30 + 30 s, sweep wall 70 s
    split = {"server_start_s": 151.0, "compile_s": 5.0, "graph_capture_s": 3.0, "sweep_wall_s": 70.0}
    rec = {"status": "ok", "config": {"scheme": {"activation_bits": 16}}, "speed": {"time_split": split}}
    (tmp_path / "vllm_server.log").write_text(
        "(EngineCore pid=1) INFO 12-01 16:22:55 [model_runner.py:747] Graph capturing finished in 3 secs\n"
        "(EngineCore pid=1) INFO 12-01 16:24:18 [jit_monitor.py:79] Kernel JIT monitor activated; mode=warn.\n"
    )
    rec["speed"]["points"] = [{"duration_s": 30.0}, {"duration_s": 30.0}]
    out = rederive(rec, tmp_path)["speed"]["time_split"]
    assert out["warmup_after_capture_s"] == 83.0  # 16:22:55 -> 16:24:18
    assert out["graph_capture_s"] == 3.0 and out["windows_s"] == 60.0 and out["overhead_s"] == 10.0
    assert out["overhead_fraction"] == 10.0 / 211.0  # 10 s over 151 + 60


def test_rederive_keeps_the_points_a_killed_job_finished(tmp_path) -> None:
    """A machine given back mid-sweep kills the job with no `finally`: its record says `running` and has no
    points, but `bench/sweep.jsonl` holds one line per finished point, the last maybe cut mid-write."""
    import json

    from tools.bench.bench_gpu import rederive

    stages = {"quantize": {"status": "ok"}, "benchmark": {"status": "running"}}
    rec = {"status": "running", "stages": stages, "config": {"scheme": {"activation_bits": 16}},
           "speed": {"points": []}}  # fmt: skip
    done = [{"point": "conc-1_r0", "output_tok_s": 229.4}, {"point": "conc-1_r1", "output_tok_s": 227.0}]
    (tmp_path / "bench").mkdir()
    lines = [json.dumps(done[0]), '{"point": "conc-1_r', json.dumps(done[1]), '{"point": "conc-1_r2", "output_t']
    (tmp_path / "bench" / "sweep.jsonl").write_text("\n".join(lines))
    out = rederive(rec, tmp_path)
    assert out["status"] == "interrupted" and out["failed_stage"] == "benchmark"
    assert [p["point"] for p in out["speed"]["points"]] == ["conc-1_r0", "conc-1_r1"]
    assert out["speed"]["points"][1]["output_tok_s"] == 227.0
    # a record that has its points keeps them, whatever sweep.jsonl holds
    kept = {"status": "ok", "config": rec["config"], "speed": {"points": [{"point": "conc-16_r0"}]}}
    assert rederive(kept, tmp_path)["speed"]["points"] == [{"point": "conc-16_r0"}]


BEFORE = {
    "vllm:prefix_cache_queries": 0.0,
    "vllm:prefix_cache_hits": 0.0,
    "vllm:prompt_tokens": 0.0,
    "vllm:generation_tokens": 0.0,
    "vllm:num_preemptions": 0.0,
}


def _after(queries: int, hits: int, gen: int) -> dict[str, float]:
    return {**BEFORE, "vllm:prefix_cache_queries": queries, "vllm:prefix_cache_hits": hits,
            "vllm:prompt_tokens": queries, "vllm:generation_tokens": gen}  # fmt: skip


RESULT = {
    "duration": 4.0, "completed": 4, "num_prompts": 4, "total_input_tokens": 1024, "total_output_tokens": 64,
    "request_throughput": 1.0, "output_throughput": 16.0, "total_token_throughput": 272.0,
    "input_lens": [256] * 4, "output_lens": [16] * 4, "ttfts": [0.1] * 4, "itls": [[0.05] * 15] * 4,
    "latencies": [0.85] * 4, "start_times": [0.0, 1.0, 2.0, 3.0], "errors": [""] * 4,
    "mean_ttft_ms": 100.0, "median_ttft_ms": 100.0, "p99_ttft_ms": 100.0,
}  # fmt: skip


def _side(hits: int, repeats: dict | None) -> dict:
    side = {"seed": 3, "wall_s": 5.5, "num_prompts": 4, "attempts": [{"num_prompts": 4, "duration_s": 4.0}],
            "counters_before": BEFORE, "counters_after": _after(1024, hits, 64)}  # fmt: skip
    if repeats is not None:
        side["prompt_repeats"] = repeats
    return side


def test_finished_records_reread_their_points_from_the_bench_folder(tmp_path: Path) -> None:
    point = SweepPoint("inf", 1, 0)
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / f"{point.name}.json").write_text(json.dumps(RESULT))
    (bench / f"{point.name}.qv.json").write_text(json.dumps(_side(240, None)))
    bench_keys = ["bench.concurrencies=[1]", "bench.repeats=1", "bench.output_len=16", "bench.warmup_prompts=0"]
    cfg = as_dict(compose(["bench=cpu-concurrency", *bench_keys]))
    old = bench_result.parse_result(RESULT, point, 4, 16)
    bench_result.add_client_side(old, _side(240, None))
    old.result_file = "/gpu/machine/bench/conc-1_r0.json"
    rec = JobRecord.view({"config": cfg, "speed": {"points": [old.to_dict()]}})
    assert not rec.speed.points[0].valid
    # the sidecar gains the recount (quantverdict.children.recount_repeats), the record is re-derived
    side = _side(240, {"requests": 4, "prompt_tokens": 1024, "repeated_requests": 1, "repeated_tokens": 256})
    (bench / f"{point.name}.qv.json").write_text(json.dumps(side))
    reparse_points(rec, tmp_path)
    (new,) = rec.speed.points
    assert new.valid and new.prompt_repeat_rate == 0.25
    assert new.result_file == "/gpu/machine/bench/conc-1_r0.json"  # where it was written, kept
    # a record whose job folder has no bench/ files keeps its points as they are
    rec2 = JobRecord.view({"config": cfg, "speed": {"points": [old.to_dict()]}})
    reparse_points(rec2, tmp_path / "elsewhere")
    assert rec2.speed.points[0].valid is False
