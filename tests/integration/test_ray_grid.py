"""A grid on Ray (``hydra/launcher=ray``) tracked to a real MLflow tracking server, on this 2-core machine.

The test starts a real ``mlflow server`` (sqlite backend, artifacts served by the server) on a free localhost
port, then runs a two-job grid (``tiny-llama-shape`` x bf16, w8a8, each serving its checkpoint with vLLM for a
two-prompt sweep) through Hydra's Ray launcher with a local Ray instance of 2 CPUs: each job asks for 1 CPU,
so both run at once, each with its own vLLM server on a port of its own (``bench.server.port=0``). Then the
same bf16 job alone through the plain launcher, whose record must have the same shape (the same key paths).

What is checked, by hand-derived rules rather than printed values:

* overlap: the jobs' intervals ``[started_at, finished_at]`` intersect by at least a second, and the sum of
  both jobs' stage wall times exceeds the span from the first start to the last finish (impossible one job
  after the other);
* the two servers listened on different ports (each record's ``speed`` and server log);
* both MLflow runs are on the tracking server, FINISHED, with ``record.json`` downloadable through it;
* no process of the grid is left: every process the grid started carries the test's marker in its
  environment (``QV_TEST_MARKER``, :mod:`clihelp`), inherited by Ray's GCS, raylet and workers and by vLLM;
  none may live on. The MLflow server carries a marker of its own: it is the fixture's, stopped at teardown.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from browser import free_port
from clihelp import command, marked_env, marked_pids, new_marker
from quantverdict.config.compose import PROJECT_ROOT
from quantverdict.results.record import find_records, load

# serial: Ray is told this machine's two cores (num_cpus=2) and the two jobs must overlap in time on them
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.serial]

CHEAP = [
    "model=tiny-llama-shape",
    "bench.num_prompts=2",
    "bench.warmup_prompts=1",
    "bench.input_len=32",
    "bench.output_len=8",
    "bench.rates=[inf]",
    "bench.server.kv_cache_space_gib=1",
    "bench.server.port=0",  # a free port per server: two servers of one node never share one
]


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[str]:
    """A real ``mlflow server`` on a free localhost port (sqlite store, served artifacts); its URI."""
    port = free_port()
    store = tmp_path / "server"
    store.mkdir()
    log = open(store / "server.log", "w")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{store}/mlflow.db",
            "--artifacts-destination",
            str(store / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=marked_env(new_marker()),  # not the grid's marker: the server outlives the grid, until teardown
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as resp:  # noqa: S310 - our server
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, (store / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "mlflow server did not answer /health in 120 s"
            time.sleep(0.5)
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server's own group (start_new_session): gunicorn/uvicorn too
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _run(out: Path, marker: str, *overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(out, *overrides, multirun=True),
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
        env=marked_env(marker),
    )


def _shape(data: Any, prefix: str = "") -> set[str]:
    """Key paths of a record (lists: the shape of their first item)."""
    if isinstance(data, dict):
        return {p for k, v in data.items() for p in {f"{prefix}{k}"} | _shape(v, f"{prefix}{k}.")}
    if isinstance(data, list) and data:
        return _shape(data[0], f"{prefix}[].")
    return set()


def _t(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S%z").timestamp()


def test_two_jobs_run_at_once_on_ray_tracked_to_a_server(
    tmp_path: Path, stage_envs: dict, embedded_model: dict, mlflow_server: str, marker: str
) -> None:
    from mlflow import MlflowClient

    tracking = ["tracking=server", f"tracking.uri={mlflow_server}", "tracking.experiment=ray-grid"]
    ray_tmp = tempfile.mkdtemp(prefix="qvr", dir="/tmp")  # Ray's socket paths must stay under 107 bytes
    ray = [
        "hydra/launcher=ray",
        "hydra.launcher.ray.init.num_cpus=2",  # this machine's 2 cores: two 1-CPU jobs at once
        f"+hydra.launcher.ray.init._temp_dir={ray_tmp}",
    ]
    t0 = time.monotonic()
    proc = _run(tmp_path / "ray", marker, *ray, "scheme=bf16,w8a8", *CHEAP, *tracking)
    grid_wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    recs = {r["job"]["scheme"]: r for r in map(load, find_records(tmp_path / "ray" / "multirun"))}
    assert set(recs) == {"bf16", "w8a8"} and all(r["status"] == "ok" for r in recs.values())

    # both jobs ran at the same time: their intervals intersect, and their stages add up to more than the span
    starts = [_t(r["job"]["started_at"]) for r in recs.values()]
    ends = [_t(r["job"]["finished_at"]) for r in recs.values()]
    assert max(starts) < min(ends), (starts, ends)
    span = max(ends) - min(starts)
    stage_sum = sum(s["wall_s"] or 0.0 for r in recs.values() for s in r["stages"].values())
    print(f"ray grid: {grid_wall:.0f} s wall, jobs span {span:.0f} s, stage wall times sum {stage_sum:.0f} s")
    assert stage_sum > span + 1.0, (stage_sum, span)

    # two servers at once, on two ports: each server log names the address it listened on
    assert {r["config"]["bench"]["server"]["port"] for r in recs.values()} == {0}  # "a free port" asked for
    ports = {}
    for scheme, rec in recs.items():
        text = (Path(rec["job"]["output_dir"]) / "vllm_server.log").read_text(errors="replace")
        ports[scheme] = set(re.findall(r"http://127\.0\.0\.1:(\d+)", text))
    assert len(ports["bf16"]) == len(ports["w8a8"]) == 1 and ports["bf16"] != ports["w8a8"], ports

    # both runs are on the tracking server, FINISHED, with their record.json stored by it
    client = MlflowClient(tracking_uri=mlflow_server)
    exp = client.get_experiment_by_name("ray-grid")
    assert exp is not None and exp.artifact_location.startswith("mlflow-artifacts:"), exp
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    for scheme in ("bf16", "w8a8"):
        run = runs[f"tiny-llama-shape/{scheme}"]
        assert run.info.status == "FINISHED"
        path = client.download_artifacts(run.info.run_id, "record.json", str(tmp_path / scheme))
        assert json.loads(Path(path).read_text())["job"]["config_hash"] == recs[scheme]["job"]["config_hash"]

    # the plain launcher's record of the same job has the same shape
    plain = _run(tmp_path / "plain", marker, "scheme=bf16", *CHEAP, *tracking)
    assert plain.returncode == 0, plain.stdout[-4000:] + plain.stderr[-4000:]
    (plain_rec,) = map(load, find_records(tmp_path / "plain" / "multirun"))
    assert _shape(plain_rec) == _shape(recs["bf16"]), _shape(plain_rec) ^ _shape(recs["bf16"])

    # nothing of the grid lives on (Ray stops its local instance when the grid's process ends)
    deadline = time.monotonic() + 30
    while marked_pids(marker) and time.monotonic() < deadline:
        time.sleep(1)
    assert not (left := marked_pids(marker)), left
    shutil.rmtree(ray_tmp, ignore_errors=True)
