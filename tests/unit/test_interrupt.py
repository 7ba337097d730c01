"""Ctrl-C is an interruption, not a failure; no lock file is left behind."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

from quantverdict.config.compose import compose
from quantverdict.orchestrate.caches import exclusive_lock, materialize
from quantverdict.orchestrate.hub import HubModel
from quantverdict.processes import procs
from quantverdict.processes.envs import StageEnv
from quantverdict.processes.runner import StageError
from quantverdict.results.record import StageInfo


def test_interrupted_carries_the_shell_exit_code() -> None:
    assert procs.Interrupted(signal.SIGINT).exit_code == 130
    assert procs.Interrupted(signal.SIGTERM).exit_code == 143
    assert procs.interrupt_signal(KeyboardInterrupt()) == "SIGINT"


def test_a_model_that_could_not_be_materialized_leaves_no_lock_file(tmp_path: Path) -> None:
    # a stage interpreter that dies at once, as a hub download that cannot reach the hub fails
    cfg = compose(["model=qwen3.5-9b"]).model
    found = HubModel("Qwen/Qwen3.5-9B", "main", "0" * 40, str(tmp_path / "hf"), offline=False)
    with pytest.raises(StageError):
        materialize(cfg, StageEnv("quantize", "/bin/false"), tmp_path, tmp_path / "out", StageInfo(), hub=found)
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
