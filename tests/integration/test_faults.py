"""Injected faults: the record says what failed, MLflow says FAILED, nothing is left running, the grid
goes on, and finished results are kept. Real stages on the embedded model."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from clihelp import TINY, marked_pids, run_cli, start_cli
from quantverdict.results.record import find_records, load

# the server's process tree as vLLM lays it out by default (a worker process too), which no fault may leave behind
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("worker_process")]

FAST = ["eval.enabled=false", "bench.enabled=false"]
PORT = "bench.server.port=8791"  # apart from the other integration tests' servers
# five load levels of 4 prompts, the first at 0.5 requests/s (~8 s): a fault after the first point finds more to come
SWEEP_RATES = (0.5, 1, 2, 4, "inf")
SWEEP = [f"bench.rates=[{','.join(map(str, SWEEP_RATES))}]", "bench.num_prompts=4"]


def wait_for(predicate, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def mlflow_statuses(out: Path) -> dict[str, str]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out}/mlflow.db")
    exp = client.get_experiment_by_name("quantverdict")
    return {
        r.info.run_name: r.info.status for r in client.search_runs([exp.experiment_id]) if "config_hash" in r.data.tags
    }


def mlflow_run_statuses(out: Path) -> list[tuple[str, str]]:
    """(run name, status) of every job run of the store under ``out``, sorted: runs of one name stay apart."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out}/mlflow.db")
    exp = client.get_experiment_by_name("quantverdict")
    runs = client.search_runs([exp.experiment_id])
    return sorted((r.info.run_name, r.info.status) for r in runs if "config_hash" in r.data.tags)


def test_killed_quantizer_fails_its_job_and_the_grid_goes_on(
    tmp_path: Path, stage_envs: dict, embedded_model: dict, marker: str
) -> None:
    t_start = time.time()
    # a calibration size no other test uses, so that AWQ really runs (no cached checkpoint)
    proc = start_cli(
        tmp_path,
        "scheme=awq,int8",
        *FAST,
        "scheme.calibration.num_samples=13",
        "scheme.calibration.seq_len=128",
        marker=marker,
        multirun=True,
    )
    quantizer = "quantverdict.children.quantize"
    wait_for(lambda: marked_pids(marker, quantizer), 300, "the quantize child")
    time.sleep(5)
    for pid in marked_pids(marker, quantizer):
        os.kill(pid, signal.SIGKILL)
    output, _ = proc.communicate(timeout=900)
    assert proc.returncode == 1, output[-3000:]
    recs = {r["job"]["scheme"]: r for r in map(load, find_records(tmp_path / "multirun"))}
    awq, int8 = recs["awq"], recs["int8"]
    assert awq["status"] == "failed" and awq["failed_stage"] == "quantize"
    assert "killed by signal 9" in awq["error"]
    assert "Traceback" in awq["traceback"]
    assert int8["status"] == "ok"  # the next job of the grid ran
    assert "FAILED smollm2-135m_awq" in output and "1 of 2 jobs failed" in output
    assert mlflow_statuses(tmp_path) == {"smollm2-135m/awq": "FAILED", "smollm2-135m/int8": "FINISHED"}
    assert not marked_pids(marker)
    # no half-written checkpoint where a later run would take it for a finished one (an AWQ entry of another
    # calibration size is another test's, which may finish meanwhile when files run side by side)
    cache = Path(os.environ.get("QV_CACHE_ROOT", Path.home() / ".cache/quantverdict")) / "checkpoints/smollm2-135m"
    finished = [p / "quantverdict_quantize.json" for p in cache.glob("awq-*") if p.stat().st_mtime > t_start]
    assert not [f for f in finished if f.exists() and json.loads(f.read_text())["calibration"]["num_samples"] == 13]


@pytest.mark.slow
def test_sigterm_in_the_benchmark_stops_everything_and_the_same_command_resumes(
    tmp_path: Path, stage_envs: dict, embedded_model: dict, marker: str
) -> None:
    """SIGTERM to the orchestrator after the first finished sweep point: exit 143, the record interrupted in the
    benchmark with its finished points and its evaluation kept, the MLflow run KILLED, nothing left running. The same
    command then resumes that attempt: the evaluation is reused (no evaluate child), the sweep runs whole."""
    # one cheap task (arc_easy, 4 items); five load levels of 4 prompts, the first at 0.5 requests/s (~8 s), so that
    # the signal lands while points are still to come
    args = [
        "scheme=bf16",
        *TINY,
        "eval.tasks=[arc_easy]",
        *SWEEP,
        PORT,
    ]

    proc = start_cli(tmp_path, *args, marker=marker)
    wait_for(lambda: list(tmp_path.rglob("bench/sweep.jsonl")), 900, "the first finished sweep point")
    assert marked_pids(marker, "quantverdict.children.vllm_cli serve")
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, output[-3000:]  # 128 + SIGTERM
    (first_path,) = find_records(tmp_path / "runs")
    first = load(first_path)
    assert first["status"] == "interrupted" and first["failed_stage"] == "benchmark"  # stopped from outside
    assert first["error"] == "interrupted by SIGTERM"
    assert 1 <= len(first["speed"]["points"]) < len(SWEEP_RATES)  # finished sweep points are kept
    assert first["stages"]["evaluate"]["status"] == "ok" and first["accuracy"]["tasks"]["arc_easy"]
    assert mlflow_statuses(tmp_path) == {"smollm2-135m/bf16": "KILLED"}
    wait_for(lambda: not marked_pids(marker), 30, "the server and client to be gone")

    second = run_cli(tmp_path, *args, timeout=900)  # the same command
    assert second.returncode == 0, second.stderr[-3000:]
    (rec,) = [load(p) for p in find_records(tmp_path / "runs") if p != first_path]
    assert rec["status"] == "ok" and rec["job"]["resume_key"] == first["job"]["resume_key"]
    assert rec["job"]["resumed_attempt"] == {
        "from": str(first_path.parent),
        "status": "interrupted",
        "stages_reused": ["evaluate"],
    }
    assert rec["stages"]["evaluate"]["status"] == "cached"
    assert str(first_path.parent) in rec["stages"]["evaluate"]["detail"]
    out = Path(rec["job"]["output_dir"])
    assert not (out / "evaluate.spec.json").exists() and not (out / "evaluate.log").exists()  # no evaluate child
    # the per-item results the review's paired tests read came along, and the record names the copies
    copied = out / "eval" / "samples_arc_easy.jsonl"
    assert rec["accuracy"]["samples"] == {"arc_easy": str(copied)}
    assert copied.read_text() == Path(first["accuracy"]["samples"]["arc_easy"]).read_text()
    assert {k: v for k, v in rec["accuracy"].items() if k != "samples"} == {
        k: v for k, v in first["accuracy"].items() if k != "samples"
    }
    assert rec["stages"]["benchmark"]["status"] == "ok" and len(rec["speed"]["points"]) == len(SWEEP_RATES)
    assert mlflow_run_statuses(tmp_path) == [("smollm2-135m/bf16", "FINISHED"), ("smollm2-135m/bf16", "KILLED")]


def test_ctrl_c_is_an_interruption_not_a_failure(
    tmp_path: Path, stage_envs: dict, embedded_model: dict, marker: str
) -> None:
    proc = start_cli(
        tmp_path,
        "scheme=bf16",
        *TINY,
        "bench.server.port=8797",
        "eval.enabled=false",
        marker=marker,
        split_stderr=True,
    )
    # this test's server (its marker), whichever port it took: in stage benchmark
    wait_for(lambda: marked_pids(marker, "quantverdict.children.vllm_cli serve"), 600, "the vLLM server to start")
    time.sleep(3)
    proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in out + err
    assert err.strip().splitlines()[-1] == "interrupted by SIGINT: stopped; what finished is kept in the record"
    (rec,) = [load(p) for p in find_records(tmp_path / "runs")]
    assert rec["status"] == "interrupted" and rec["failed_stage"] == "benchmark"
    assert rec["error"] == "interrupted by SIGINT" and rec["traceback"] is None
    assert rec["stages"]["benchmark"]["status"] == "interrupted" and rec["stages"]["quantize"]["status"] == "skipped"
    assert mlflow_statuses(tmp_path) == {"smollm2-135m/bf16": "KILLED"}
    wait_for(lambda: not marked_pids(marker), 30, "no child left")


@pytest.mark.slow
def test_server_killed_mid_sweep_keeps_finished_points(
    tmp_path: Path, stage_envs: dict, embedded_model: dict, marker: str
) -> None:
    proc = start_cli(tmp_path, "scheme=bf16", *TINY, PORT, "eval.enabled=false", *SWEEP, marker=marker)
    wait_for(lambda: list(tmp_path.rglob("bench/sweep.jsonl")), 600, "the first finished sweep point")
    servers = marked_pids(marker, "quantverdict.children.vllm_cli serve")  # this test's server, no other
    assert servers
    for pid in servers:
        os.killpg(os.getpgid(pid), signal.SIGKILL)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1, output[-2000:]
    (rec,) = [load(p) for p in find_records(tmp_path / "runs")]
    assert rec["status"] == "failed" and rec["failed_stage"] == "benchmark"
    assert 1 <= len(rec["speed"]["points"]) < len(SWEEP_RATES)
    assert rec["memory"]["server"]["kv_cache_tokens"] > 0  # what the server log said before it died
    assert mlflow_statuses(tmp_path) == {"smollm2-135m/bf16": "FAILED"}
    assert not marked_pids(marker, "quantverdict.children.vllm_cli")


def test_bad_config_fails_before_any_work(tmp_path: Path) -> None:
    # values outside an Enum field's choices: refused while the command line is checked, before Hydra makes a
    # job folder; every problem in one message, with the closest allowed value
    proc = run_cli(tmp_path, "scheme=gptq", "eval.backend=vlm", "bench.mode=closed", timeout=120)
    assert proc.returncode == 2
    err = proc.stdout + proc.stderr
    assert "eval.backend='vlm'" in err and "did you mean 'vllm'" in err
    assert "bench.mode='closed'" in err and "allowed: rate, concurrency" in err
    assert not find_records(tmp_path / "runs") and not list(tmp_path.rglob("*.spec.json"))
    # a value only validate() can judge: refused before Hydra too, no folder and no record left
    proc = run_cli(tmp_path, "scheme=gptq", "eval.limit=0", timeout=120)
    assert proc.returncode == 2
    assert "eval.limit=0 must be >= 1 or null" in proc.stdout + proc.stderr
    assert not find_records(tmp_path) and not (tmp_path / "runs").exists()
    assert not list(tmp_path.rglob("*.spec.json"))  # no stage was started
