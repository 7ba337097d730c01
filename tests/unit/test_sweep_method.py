"""The sweep method's pure parts: seeds per point, window sizing, the server's counters (prefix-cache hit rate, token
counts), the client's sidecar, the stage's time split, compile-time parsing, and the server's dev-mode and
compile-cache environment. Values worked out by hand in the comments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantverdict.children.sweep_client import _drop_flags
from quantverdict.config.compose import as_dict, compose, job_config
from quantverdict.config.schema import BenchConfig, ConfigError, ServerConfig
from quantverdict.config.validate import validate
from quantverdict.measure import bench_result, server_metrics, sweep, sweep_plan, vllm_log
from quantverdict.measure.sweep_plan import SweepPoint
from quantverdict.processes.envs import StageEnv
from quantverdict.results.record import JobRecord
from quantverdict.serving.benchmark import parse_point
from quantverdict.serving.server import build_command

# --- seeds and windows ----------------------------------------------------------------------------------


def test_every_point_and_repeat_gets_its_own_seed_and_the_warmup_another() -> None:
    points = sweep_plan.plan("concurrency", [], [1, 16, 64, 256], 3)
    seeds = [sweep_plan.point_seed(0, i) for i in range(len(points))]
    assert seeds == list(range(1, 13))  # 4 levels x 3 repeats, base seed 0: 1..12, no repeats
    assert sweep_plan.warmup_seed(0) == 1_000_000 and sweep_plan.warmup_seed(0) not in seeds
    assert sweep_plan.point_seed(5, 0) == 6  # base + 1 + index: never the base seed itself


def test_requests_for_the_window() -> None:
    assert sweep_plan.requests_for(16, 30.0, 2.5) == 75  # max(16, ceil(2.5 x 30))
    assert sweep_plan.requests_for(16, 30.0, 0.2) == 16  # 6 < 16: the minimum count decides
    assert sweep_plan.requests_for(16, 30.0, 2.5, margin=1.15) == 87  # ceil(86.25)
    assert sweep_plan.requests_for(16, 0.0, 2.5) == 16 and sweep_plan.requests_for(16, 30.0, None) == 16


def test_a_closed_loop_sends_whole_waves() -> None:
    # the H200 decode shape at c=256: ~13 req/s x 30 s x 1.2 = 468 -> two waves of 256 = 512 (gptq sent 519)
    assert sweep_plan.requests_for(256, 30.0, 13.0, margin=1.2, wave=256) == 512
    assert sweep_plan.requests_for(16, 30.0, 2.5, wave=16) == 80  # 75 -> 5 waves of 16
    assert sweep_plan.requests_for(16, 30.0, 0.2, wave=16) == 16  # already whole
    assert sweep_plan.requests_for(16, 30.0, 2.5, wave=1) == 75 and sweep_plan.requests_for(8, 0.0, None, wave=3) == 9
    # the plan's minimum count too: 16 x 4 per concurrency at c=64 = 256 (four waves); 8 at c=16 = one wave; 10 at
    # c=4 = three waves; an open loop (no concurrency) keeps its count
    assert sweep_plan.prompts_for(16, 4, 64) == 256 and sweep_plan.prompts_for(8, None, 16) == 16
    assert sweep_plan.prompts_for(10, None, 4) == 12 and sweep_plan.prompts_for(10, None, None) == 10


# --- the server's counters --------------------------------------------------------------------------------

BEFORE = {
    "vllm:prefix_cache_queries": 1000.0,
    "vllm:prefix_cache_hits": 100.0,
    "vllm:prompt_tokens": 1000.0,
    "vllm:generation_tokens": 200.0,
    "vllm:num_preemptions": 0.0,
}


def _after(queries: float, hits: float, prompt: float, gen: float) -> dict[str, float]:
    return {
        "vllm:prefix_cache_queries": 1000.0 + queries,
        "vllm:prefix_cache_hits": 100.0 + hits,
        "vllm:prompt_tokens": 1000.0 + prompt,
        "vllm:generation_tokens": 200.0 + gen,
        "vllm:num_preemptions": 0.0,
    }


def test_hit_rate_above_one_percent_is_invalid() -> None:
    # 8 prompts x 256 tokens = 2,048 queried; 1,024 hit (one 128-token block of each): 50%
    c = server_metrics.server_checks(BEFORE, _after(2048, 1024, 2048, 128), 2048, 128)
    assert c["prefix_cache_queries"] == 2048 and c["prefix_cache_hits"] == 1024
    assert c["prefix_cache_hit_rate"] == 0.5
    assert len(c["server_invalid_reasons"]) == 1 and "50.0% > 1%" in c["server_invalid_reasons"][0]
    # 20 of 2,048 = 0.98%: passes; 21 = 1.03%: fails
    assert server_metrics.server_checks(BEFORE, _after(2048, 20, 2048, 128), 2048, 128)["server_invalid_reasons"] == []
    assert server_metrics.server_checks(BEFORE, _after(2048, 21, 2048, 128), 2048, 128)["server_invalid_reasons"]


def test_server_token_counts_beyond_five_percent_are_invalid() -> None:
    # client 4,096 prompt tokens; server 4,300: 204/4096 = 4.98% passes; 4,301: 5.005% fails
    ok = server_metrics.server_checks(BEFORE, _after(4300, 0, 4300, 512), 4096, 512)
    assert ok["server_invalid_reasons"] == [] and ok["prompt_tokens_rel_diff"] == pytest.approx(204 / 4096)
    bad = server_metrics.server_checks(BEFORE, _after(4301, 0, 4301, 512), 4096, 512)
    assert len(bad["server_invalid_reasons"]) == 1 and "prompt tokens" in bad["server_invalid_reasons"][0]
    # the public report's case: 1,000 tokens asked, ~5,100 seen by the server
    far = server_metrics.server_checks(BEFORE, _after(5100, 0, 5100, 128), 1000, 128)
    assert far["prompt_tokens_rel_diff"] == pytest.approx(4.1)
    gen = server_metrics.server_checks(BEFORE, _after(1000, 0, 1000, 100), 1000, 128)  # 28/128 = 21.9%
    assert "generation tokens" in gen["server_invalid_reasons"][0]


def test_missing_counters_give_none_and_no_verdict() -> None:
    c = server_metrics.server_checks({}, {}, 100, 10)
    assert c["prefix_cache_hit_rate"] is None and c["prompt_tokens_rel_diff"] is None
    assert c["server_invalid_reasons"] == []
    assert server_metrics.hit_rate(0, 0) == 0.0


# --- the client's sidecar on a parsed point ------------------------------------------------------------

RESULT = {
    "duration": 4.0,
    "completed": 4,
    "failed": 0,
    "total_input_tokens": 4 * 256,
    "total_output_tokens": 4 * 16,
    "request_throughput": 1.0,
    "output_throughput": 16.0,
    "start_times": [100.0, 101.0, 102.0, 103.0],
    "ttfts": [0.1, 0.1, 0.1, 0.1],
    "itls": [[0.06] * 15] * 4,
    "latencies": [1.0, 1.0, 1.0, 1.0],  # 0.1 + 15 x 0.06
    "output_lens": [16, 16, 16, 16],
    "errors": ["", "", "", ""],
}


def _side(hits: float) -> dict:
    return {
        "seed": 3,
        "warmup_seed": 1_000_000,
        "attempts": [{"num_prompts": 4, "duration_s": 4.0}],
        "wall_s": 5.5,
        "counters_before": BEFORE,
        "counters_after": _after(1024, hits, 1024, 64),
        "num_prompts": 4,
    }


def test_client_side_adds_overhead_window_and_server_validity() -> None:
    p = bench_result.parse_result(RESULT, SweepPoint(1.0, None, 0), 4, 16)
    assert p.valid
    bench_result.add_client_side(p, _side(0), min_duration_s=3.0)
    assert p.client_overhead_s == 1.5  # 5.5 s wall - 4.0 s window
    assert p.window_met and p.seed == 3 and p.attempts == 1
    assert p.prefix_cache_hit_rate == 0.0 and p.server_prompt_tokens == 1024 and p.valid
    cached = bench_result.parse_result(RESULT, SweepPoint(1.0, None, 0), 4, 16)
    bench_result.add_client_side(cached, _side(512), min_duration_s=5.0)  # 512/1024 hit, 4 s < 5 s
    assert not cached.valid and cached.prefix_cache_hit_rate == 0.5 and cached.window_met is False
    assert any("prefix-cache hit rate 50.0%" in r for r in cached.invalid_reasons)


def test_request_times_are_relative_to_the_first_request() -> None:
    t = bench_result.request_times(RESULT)
    assert t == {"start_s": [0.0, 1.0, 2.0, 3.0], "end_s": [1.0, 2.0, 3.0, 4.0]}
    assert bench_result.request_times({"completed": 1, "duration": 1.0}) is None


def test_old_points_without_the_new_keys_still_read() -> None:
    old = {"point": "rate-1_r0", "completed": 4, "valid": True, "output_tok_s": 16.0}
    rec = JobRecord.from_dict({"tool": {"name": "quantverdict"}, "schema_version": 2, "speed": {"points": [old]}})
    p = rec.speed.points[0]
    assert p.prefix_cache_hit_rate is None and p.client_overhead_s is None and p.valid
    assert rec.speed.time_split is None


# --- time split, compile time, server environment ------------------------------------------------------


def test_time_split_by_hand() -> None:
    pts = [{"duration_s": 30.0}, {"duration_s": 45.0}, {"duration_s": 45.0}]  # windows 120 s
    ts = sweep.time_split(226.0, {"compile_s": 40.5, "graph_capture_s": 12.0, "compile_cache_hit": False}, pts, 131.0)
    assert ts["windows_s"] == 120.0 and ts["overhead_s"] == 11.0
    assert ts["overhead_fraction"] == pytest.approx(11 / 346)  # 11 s over 226 + 120
    assert ts["compile_s"] == 40.5 and ts["graph_capture_s"] == 12.0
    assert sweep.time_split(None, None, pts, None)["overhead_fraction"] is None


LOG = """\
(EngineCore pid=1) INFO 12-01 03:00:01 [backends.py:1167] Dynamo bytecode transform time: 9.10 s
(EngineCore pid=1) INFO 12-01 03:00:20 [monitor.py:62] torch.compile took 25.40 s in total
(EngineCore pid=1) INFO 12-01 03:00:40 [gpu_model_runner.py:6582] Graph capturing finished in 14 secs, took 0.52 GiB
"""
LOG_CACHED = """\
(EngineCore pid=1) INFO [backends.py:296] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 3.100 s
(EngineCore pid=1) INFO [monitor.py:62] torch.compile took 6.20 s in total
"""  # noqa: E501


def test_compile_and_graph_capture_from_the_server_log() -> None:
    info = vllm_log.parse(LOG)
    assert info["compile_s"] == 25.4 and info["graph_capture_s"] == 14.0 and info["compile_cache_hit"] is False
    cached = vllm_log.parse(LOG_CACHED)
    assert cached["compile_s"] == 6.2 and cached["compile_cache_hit"] is True and cached["graph_capture_s"] is None
    assert info["warmup_after_capture_s"] is None  # no line ends the warm-up in LOG
    eager = vllm_log.parse("INFO nothing compiled here\n")
    assert eager["compile_s"] is None and eager["compile_cache_hit"] is None


# the H200's first server of a fresh machine (vLLM 0.26): FlashInfer's sampling kernels compiled by nvcc
# between graph capture and the JIT monitor, 16:22:55 -> 16:24:18 = 83 s; the next server (cache warm) 0 s
LOG_WARMUP = """\
(EngineCore pid=1392) INFO 12-01 16:22:55 [model_runner.py:747] Graph capturing finished in 3 secs, took 0.59 GiB
(EngineCore pid=1392) INFO 12-01 16:22:55 [gpu_worker.py:857] Free memory on device (139.29/139.8 GiB) on startup.
(EngineCore pid=1392) INFO 12-01 16:24:18 [jit_monitor.py:79] Kernel JIT monitor activated; monitored JIT compilations during inference will use mode=warn.
(EngineCore pid=1392) INFO 12-01 16:24:19 [core.py:340] init engine (profile, create kv cache, warmup model) took 95.58 s (compilation: 5.02 s)
"""  # noqa: E501


def test_warmup_after_graph_capture_from_the_stamps() -> None:
    assert vllm_log.parse(LOG_WARMUP)["warmup_after_capture_s"] == 83.0
    no_monitor = LOG_WARMUP.replace("Kernel JIT monitor activated", "something else")
    assert vllm_log.parse(no_monitor)["warmup_after_capture_s"] == 84.0  # ends at the init-engine line, 16:24:19
    over_midnight = LOG_WARMUP.replace("12-01 16:22:55", "12-01 23:59:50").replace("12-01 16:24:18", "12-02 00:00:20")
    assert vllm_log.parse(over_midnight)["warmup_after_capture_s"] == 30.0
    month = LOG_WARMUP.replace("12-01 16:22:55", "11-30 23:59:50").replace("12-01 16:24:18", "12-01 00:00:20")
    assert vllm_log.parse(month)["warmup_after_capture_s"] == 30.0
    year = LOG_WARMUP.replace("12-01 16:22:55", "12-31 23:59:50").replace("12-01 16:24:18", "01-01 00:00:20")
    assert vllm_log.parse(year)["warmup_after_capture_s"] == 30.0
    # February 28 -> March 1: 30 s in a year without a February 29 (the log names no year; a leap year's
    # February 28 -> March 1 would be a day and 30 s, which no server start takes)
    march = LOG_WARMUP.replace("12-01 16:22:55", "02-28 23:59:50").replace("12-01 16:24:18", "03-01 00:00:20")
    assert vllm_log.parse(march)["warmup_after_capture_s"] == 30.0
    leap = LOG_WARMUP.replace("12-01 16:22:55", "02-29 23:59:50").replace("12-01 16:24:18", "03-01 00:00:20")
    assert vllm_log.parse(leap)["warmup_after_capture_s"] == 30.0
    unstamped = LOG_WARMUP.replace("INFO 12-01 16:22:55 ", "INFO ")  # the capture line without its stamp
    assert vllm_log.parse(unstamped)["warmup_after_capture_s"] is None
    # a log appended to by a second server: the last server's warm-up (0 s: its caches were warm), and a server
    # that crashed after graph capture does not lend its capture time to the next one, which captured nothing
    engine = "(EngineCore pid=1) INFO 12-01 16:30:00 [core.py:116] Initializing a V1 LLM engine (v0.26.0) with config\n"
    second = (
        "(EngineCore pid=2) INFO 12-01 16:40:00 [model_runner.py:747] Graph capturing finished in 3 secs\n"
        "(EngineCore pid=2) INFO 12-01 16:40:00 [jit_monitor.py:79] Kernel JIT monitor activated; mode=warn.\n"
    )
    assert vllm_log.parse(engine + LOG_WARMUP + engine + second)["warmup_after_capture_s"] == 0.0
    crashed = engine + LOG_WARMUP.splitlines(keepends=True)[0] + engine  # captured at 16:22:55, then a restart
    assert vllm_log.parse(crashed + LOG_WARMUP.splitlines(keepends=True)[3])["warmup_after_capture_s"] is None
    ts = sweep.time_split(151.0, vllm_log.parse(LOG_WARMUP), [{"duration_s": 30.0}], 35.0)
    assert ts["warmup_after_capture_s"] == 83.0 and ts["graph_capture_s"] == 3.0


def test_server_runs_in_dev_mode_with_the_compile_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.delenv("FLASHINFER_WORKSPACE_BASE", raising=False)
    env = StageEnv("serve", "/usr/bin/python3", {})
    cfg = ServerConfig(port=8765, kv_cache_space_gib=1)
    _, extra = build_command(env, "/m", "m", cfg, 512, "cpu", tmp_path / "vllm")
    assert extra == {
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_CACHE_ROOT": str(tmp_path / "vllm"),
        "TRITON_CACHE_DIR": str(tmp_path / "vllm" / "triton"),
        "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "vllm" / "flashinfer"),
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    cmd, extra = build_command(env, "/m", "m", cfg, 512, "cuda")
    assert extra == {"VLLM_SERVER_DEV_MODE": "1"}
    monkeypatch.setenv("TRITON_CACHE_DIR", "/mine")  # the caller's own cache folder is kept (not overridden)
    _, extra = build_command(env, "/m", "m", cfg, 512, "cuda", tmp_path / "vllm")
    assert "TRITON_CACHE_DIR" not in extra and extra["FLASHINFER_WORKSPACE_BASE"] == str(
        tmp_path / "vllm" / "flashinfer"
    )
    monkeypatch.delenv("TRITON_CACHE_DIR")  # set in the serve environment's own variables (env.serve.env_vars)
    own = StageEnv("serve", "/usr/bin/python3", {"FLASHINFER_WORKSPACE_BASE": "/fi"})
    _, extra = build_command(own, "/m", "m", cfg, 512, "cuda", tmp_path / "vllm")
    assert "FLASHINFER_WORKSPACE_BASE" not in extra and extra["TRITON_CACHE_DIR"] == str(tmp_path / "vllm" / "triton")
    assert "--no-enable-prefix-caching" not in cmd  # prefix caching stays at vLLM's default


# --- config ----------------------------------------------------------------------------------------------


def test_gpu_profiles_repeat_three_times_with_30_s_windows() -> None:
    for name in ("gpu", "gpu-concurrency"):
        cfg = compose([f"bench={name}"])
        assert cfg.bench.repeats == 3 and cfg.bench.min_duration_s == 30.0 and cfg.bench.reset_prefix_cache
    cpu = compose(["bench=cpu"])
    assert cpu.bench.repeats == 1 and 0 < cpu.bench.min_duration_s <= 5


def test_negative_min_duration_is_refused_with_its_key() -> None:
    cfg = compose(["bench=cpu"])
    cfg.bench.min_duration_s = -1.0
    with pytest.raises(ConfigError, match=r"bench\.min_duration_s=-1\.0 must be"):
        validate(cfg)


def test_prefetch_without_warmup_waves_is_refused_before_any_work() -> None:
    cfg = compose(["bench=gpu-concurrency-prefill"])  # prefetch_prompts true, warmup_prompts 8: accepted
    validate(cfg)
    cfg.bench.warmup_prompts = 0  # nothing would size the runs before the sweep
    with pytest.raises(ConfigError, match=r"bench\.prefetch_prompts=true needs bench\.warmup_prompts > 0 \(got 0\)"):
        validate(cfg)


@pytest.mark.parametrize(("shape", "lens"), [("prefill", (2048, 128)), ("decode", (128, 1024))])
@pytest.mark.parametrize("model", ["llama3.1-8b-shape", "smollm2-135m"])
def test_request_shape_profiles_compose_for_the_gpu_models(shape: str, lens: tuple[int, int], model: str) -> None:
    cfg = compose([f"bench=gpu-concurrency-{shape}", f"model={model}", "env=cpu"])
    assert (cfg.bench.input_len, cfg.bench.output_len) == lens
    assert cfg.bench.repeats == 3 and list(cfg.bench.concurrencies) == [1, 16, 64, 256]


def test_warmup_is_one_wave_in_a_closed_loop() -> None:
    assert sweep_plan.warmup_requests(8, 256) == 256 and sweep_plan.warmup_requests(8, 1) == 1
    assert sweep_plan.warmup_requests(8, None) == 8 and sweep_plan.warmup_requests(0, 64) == 0


def test_parse_point_reads_vllms_file_and_the_clients_sidecar(tmp_path: Path) -> None:
    point = SweepPoint(1.0, None, 0)
    (tmp_path / f"{point.name}.json").write_text(json.dumps(RESULT))
    (tmp_path / f"{point.name}.qv.json").write_text(json.dumps(_side(0)))
    bench = BenchConfig(name="t", output_len=16, warmup_prompts=2, min_duration_s=2.0)
    p = parse_point(tmp_path, point, bench)
    assert p.num_prompts == 4 and p.output_tokens_requested == 64  # the sidecar's count x 16
    assert p.valid and p.prefix_cache_hit_rate == 0.0 and p.client_overhead_s == 1.5
    assert p.request_times is not None and p.request_times["end_s"] == [1.0, 2.0, 3.0, 4.0]
    assert p.result_file == str(tmp_path / "rate-1_r0.json")


def test_token_mismatch_with_preemptions_says_so() -> None:
    after = {**_after(2400, 0, 2400, 128), "vllm:num_preemptions": 3.0}  # 2,400 vs 2,048: 17.2%
    (why,) = server_metrics.server_checks(BEFORE, after, 2048, 128)["server_invalid_reasons"]
    assert "3 preemption(s)" in why and "17.2% > 5%" in why


def test_fidelity_rebuilds_the_jobs_config_from_its_record() -> None:
    cfg = compose(["bench=gpu-concurrency", "bench.seed=7"])
    back = job_config(as_dict(cfg))
    assert back.bench.seed == 7 and list(back.bench.concurrencies) == [1, 16, 64, 256]
    assert back.bench.min_duration_s == 30.0 and back.bench.server.port == cfg.bench.server.port
    old = as_dict(cfg)
    del old["bench"]["min_duration_s"], old["bench"]["reset_prefix_cache"]  # an older record
    assert job_config(old).bench.min_duration_s == 0.0


def test_sweep_client_drops_flags_an_older_vllm_lacks() -> None:
    args = ["--seed", "3", "--temperature", "0", "--ready-check-timeout-sec", "0", "--disable-tqdm"]
    assert _drop_flags(args, ["--temperature", "--ready-check-timeout-sec"]) == ["--seed", "3", "--disable-tqdm"]
    assert _drop_flags(args, []) == args
