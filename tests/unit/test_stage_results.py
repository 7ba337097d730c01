"""A child stage's result is validated where its JSON crosses back (quantverdict.results.stage_results)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from quantverdict.processes.envs import StageEnv
from quantverdict.processes.runner import ChildFailed, ChildOk, StageError, read_outcome, run_stage
from quantverdict.results.stage_results import HbmResult, MaterializeResult, SanityResult

HBM = {"copy_bytes_per_s": 4.2e12, "copy_gbps": 4200.0, "buffer_bytes": 4 << 30, "iters": 20, "device": "H200"}


def _child(tmp_path: Path, result: dict) -> StageEnv:
    """A stage environment whose every stage writes ``result`` (a real child process, no stage code)."""
    (tmp_path / "result.json").write_text(json.dumps(result))
    script = tmp_path / "child.py"  # called as: child.py SPEC_JSON RESULT_JSON
    script.write_text(f"import shutil, sys\nshutil.copy({str(tmp_path / 'result.json')!r}, sys.argv[2])\n")

    class Env(StageEnv):
        def module(self, module: str, *args: str) -> list[str]:
            return [sys.executable, str(script), *args]

    return Env("serve", sys.executable)


def test_a_result_that_matches_its_stage_is_returned_typed(tmp_path: Path) -> None:
    env = _child(tmp_path, {"status": "ok", **HBM, "wall_s": 1.5})
    got = run_stage(env, "hbm", {}, tmp_path / "work", HbmResult)
    assert got.copy_gbps == 4200.0 and got.buffer_bytes == 4 * 1024**3 and got.wall_s == 1.5
    assert got.payload() == HBM  # what the record keeps: no status, no wall_s


@pytest.mark.parametrize(
    ("result", "says"),
    [
        ({**HBM, "copy_gbs": 1.0}, "copy_gbs: Extra inputs are not permitted"),  # a key the model does not name
        ({k: v for k, v in HBM.items() if k != "iters"}, "iters: Field required"),
        ({**HBM, "iters": "twenty"}, "iters: Input should be a valid integer"),
    ],
)
def test_a_result_that_does_not_match_fails_the_stage_naming_the_key(tmp_path: Path, result: dict, says: str) -> None:
    env = _child(tmp_path, {"status": "ok", **result, "wall_s": 1.0})
    with pytest.raises(StageError, match=f"stage hbm failed: its result .* does not match HbmResult: {says}"):
        run_stage(env, "hbm", {}, tmp_path / "work", HbmResult)


def test_a_failed_child_is_reported_before_its_result_is_typed(tmp_path: Path) -> None:
    env = _child(tmp_path, {"status": "failed", "error": "ValueError: no such model", "traceback": "tb", "wall_s": 0.1})
    with pytest.raises(StageError, match="stage checkpoint_sanity failed: ValueError: no such model") as caught:
        run_stage(env, "checkpoint_sanity", {}, tmp_path / "work", SanityResult)
    # the child's traceback and its log reach the record and the user
    log = tmp_path / "work" / "checkpoint_sanity.log"
    assert caught.value.child_traceback == "tb" and caught.value.log_path == log
    assert str(caught.value).endswith(f"(log: {log})")


@pytest.mark.parametrize(
    ("result", "says"),
    [
        ({"status": "done", **HBM}, "(top): Input tag 'done' found using 'status' does not match any of the expected"),
        ({"status": "failed", "traceback": "tb", "wall_s": 0.1}, "failed.error: Field required"),
        ({"status": "failed", "error": None}, "failed.error: Input should be a valid string"),
        ({**HBM}, "(top): Unable to extract tag using discriminator 'status'"),
    ],
)
def test_a_file_that_is_not_a_childs_result_fails_the_stage_naming_the_key(
    tmp_path: Path, result: dict, says: str
) -> None:
    env = _child(tmp_path, result)
    with pytest.raises(StageError, match=f"stage hbm failed: its result .* is not a child's result: {re.escape(says)}"):
        run_stage(env, "hbm", {}, tmp_path / "work", HbmResult)


def test_a_result_file_that_is_not_json_fails_the_stage(tmp_path: Path) -> None:
    env = _child(tmp_path, {})
    (tmp_path / "result.json").write_text('{"status": "ok", "copy_gbps": ')  # cut off mid-write
    with pytest.raises(StageError, match=r"stage hbm failed: its result .* is not JSON: Expecting value"):
        run_stage(env, "hbm", {}, tmp_path / "work", HbmResult)


def test_the_sweep_clients_error_line_is_read_from_its_result(tmp_path: Path) -> None:
    path = tmp_path / "sweep_client.result.json"
    path.write_text(json.dumps({"status": "failed", "error": "ConnectionError: refused", "traceback": "tb"}))
    outcome, _ = read_outcome(path)
    assert isinstance(outcome, ChildFailed) and outcome.error == "ConnectionError: refused"
    path.write_text(json.dumps({"status": "ok", "points": 3, "wall_s": 9.0}))
    outcome, data = read_outcome(path)
    assert isinstance(outcome, ChildOk) and data["points"] == 3  # the stage's own keys pass to its model


def test_a_hub_model_keeps_its_id_revision_and_commit_and_a_local_one_has_none(tmp_path: Path) -> None:
    local = {"path": "/m", "architecture": "LlamaForCausalLM", "model_type": "llama", "dims": {"hidden_size": 576}}
    local |= {"num_parameters": 134_515_008, "dtype": "bfloat16", "source": "local"}
    hub = {**local, "source": "hf", "hf_id": "org/m", "revision": "main", "commit": "0" * 40}
    env = _child(tmp_path, {"status": "ok", **hub, "wall_s": 2.0})
    assert run_stage(env, "materialize", {}, tmp_path / "hub", MaterializeResult).payload() == hub
    env = _child(tmp_path, {"status": "ok", **local, "wall_s": 2.0})
    assert run_stage(env, "materialize", {}, tmp_path / "local", MaterializeResult).payload() == local
