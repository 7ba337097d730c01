"""Ctrl-C is an interruption, not a failure; no lock file is left behind (issue 18, item 9)."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import pytest

from quantverdict import hardware, procs
from quantverdict.envs import StageEnv
from quantverdict.pipeline import _materialize, exclusive_lock, run_job
from quantverdict.record import StageInfo
from quantverdict.settings import compose
from quantverdict.stages.runner import StageError


def test_interrupted_job_is_recorded_interrupted_and_its_mlflow_run_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow import MlflowClient

    def ctrl_c(cuda_visible_devices: str | None = None) -> list:
        raise procs.Interrupted(signal.SIGINT)

    monkeypatch.setattr(hardware, "gpu_info", ctrl_c)  # Ctrl-C in the first stage of a cuda job
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = compose(["env=h200-prebuilt", "scheme=fp8", f"tracking.uri={uri}", f"paths.output_root={tmp_path}"])
    with pytest.raises(KeyboardInterrupt):
        run_job(cfg, tmp_path / "job")
    rec = json.loads((tmp_path / "job" / "record.json").read_text())
    assert rec["status"] == "interrupted" and rec["failed_stage"] == "gpu_check"
    assert rec["error"] == "interrupted by SIGINT" and rec["traceback"] is None
    assert rec["stages"]["gpu_check"]["status"] == "interrupted"
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    runs = {r.info.run_name: r.info.status for r in client.search_runs([exp.experiment_id])}
    assert runs == {"smollm2-135m/fp8": "KILLED", "gpu_check": "KILLED"}  # the job's run and its stage's


def test_interrupted_carries_the_shell_exit_code() -> None:
    assert procs.Interrupted(signal.SIGINT).exit_code == 130
    assert procs.Interrupted(signal.SIGTERM).exit_code == 143
    assert procs.interrupt_signal(KeyboardInterrupt()) == "SIGINT"


def test_a_model_that_could_not_be_materialized_leaves_no_lock_file(tmp_path: Path) -> None:
    # a stage interpreter that dies at once, as a hub download that cannot reach the hub fails
    cfg = compose(["model=qwen3.5-9b"]).model
    with pytest.raises(StageError):
        _materialize(cfg, StageEnv("quantize", "/bin/false"), tmp_path, tmp_path / "out", StageInfo())
    assert not list((tmp_path / "models").iterdir())  # neither the model nor .qwen3.5-9b.lock


def test_the_removed_lock_file_still_excludes(tmp_path: Path) -> None:
    lock = tmp_path / ".m.lock"
    inside: list[int] = []
    overlaps: list[int] = []

    def hold(i: int) -> None:
        with exclusive_lock(lock):
            inside.append(i)
            if len(inside) > 1:
                overlaps.append(i)
            time.sleep(0.05)
            inside.remove(i)

    threads = [threading.Thread(target=hold, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert overlaps == [] and not lock.exists()
