"""Paths with spaces: commands are argument lists (never shell strings), specs and results are JSON, and
the logged command line can be pasted back into a shell."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import pytest

from quantverdict.config.compose import compose
from quantverdict.processes import procs
from quantverdict.processes.envs import SRC_DIR, StageEnv
from quantverdict.processes.runner import StageError, run_stage
from quantverdict.results.stage_results import MaterializeResult
from quantverdict.results.tracking import sqlite_path


def test_stage_command_is_a_list_that_keeps_spaces() -> None:
    env = StageEnv("quantize", "/opt/my envs/quantize/bin/python")
    cmd = env.module("quantverdict.children.quantize", "/runs/a b/quantize.spec.json", "/runs/a b/quantize.result.json")
    assert cmd == [
        "/opt/my envs/quantize/bin/python",
        "-m",
        "quantverdict.children.quantize",
        "/runs/a b/quantize.spec.json",
        "/runs/a b/quantize.result.json",
    ]


def test_child_gets_its_arguments_and_the_log_line_is_quoted(tmp_path: Path) -> None:
    out = tmp_path / "job with space"
    spec = out / "x.spec.json"
    cmd = [sys.executable, "-c", "import json,sys; print(json.dumps(sys.argv[1:]))", str(spec), "it's"]
    proc = procs.start(cmd, out / "x.log", echo=False)
    assert procs.wait(proc, timeout_s=60) == 0
    time.sleep(0.2)  # the reader thread flushes the last line
    first, child_out = (out / "x.log").read_text().splitlines()[:2]
    assert json.loads(child_out) == [str(spec), "it's"]  # argv arrived whole
    assert first.startswith("$ ")
    assert shlex.split(first[2:]) == cmd  # the logged command re-runs as it ran


def test_stage_spec_and_result_cross_a_folder_with_spaces(tmp_path: Path) -> None:
    # The orchestrator's interpreter has no torch, so the materialize child fails inside its run() --
    # after it read the spec and before it writes its result: a result (not "died without a result")
    # proves that the spec and result paths with spaces reached the child intact.
    work = tmp_path / "out dir" / "my job"
    env = StageEnv("probe", sys.executable, {"PYTHONPATH": str(SRC_DIR)})
    with pytest.raises(StageError) as err:
        run_stage(
            env,
            "materialize",
            {"model": {"path": str(tmp_path / "a model dir")}},
            work,
            MaterializeResult,
            timeout_s=120,
        )
    assert "died without a result" not in str(err.value)
    result = json.loads((work / "materialize.result.json").read_text())
    assert result["status"] == "failed" and err.value.child_traceback == result["traceback"]
    assert json.loads((work / "materialize.spec.json").read_text())["model"]["path"] == str(tmp_path / "a model dir")


def test_config_paths_with_spaces_resolve_whole(tmp_path: Path) -> None:
    root = tmp_path / "my runs"
    cfg = compose([f"paths.output_root={root}", f"paths.cache_root={tmp_path / 'my cache'}"])
    assert cfg.paths.output_root == str(root)
    assert cfg.tracking.uri == f"sqlite:///{root}/mlflow.db"
    assert sqlite_path(cfg.tracking.uri) == root / "mlflow.db"
    assert cfg.tracking.artifact_location == str(root / "mlartifacts")
