"""eval.tasks names checked by lm-eval itself (lm-eval 0.4.13's TaskManager in the serve environment), before the
model is materialized: an unknown name fails with lm-eval's closest names, a tag is refused, a task or group
answers with its config's output type, metrics and their direction. Reads no dataset (no hub here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantverdict.config.compose import compose
from quantverdict.config.schema import ConfigError
from quantverdict.orchestrate import data_access
from quantverdict.processes.envs import StageEnv
from quantverdict.processes.runner import run_stage
from quantverdict.results.stage_results import TaskCheckResult

pytestmark = pytest.mark.integration

OWN_TASK = """task: qv_echo
dataset_path: json
dataset_kwargs:
  data_files:
    test: /nonexistent/items.jsonl
output_type: generate_until
test_split: test
doc_to_text: "{{q}}"
doc_to_target: "{{a}}"
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


@pytest.fixture(scope="module")
def checked(stage_envs: dict[str, StageEnv], tmp_path_factory: pytest.TempPathFactory) -> dict:
    spec = {"tasks": ["arc_esay", "gsm8k", "mmlu", "ai2_arc", "winogrande"], "include_path": None}
    return run_stage(
        stage_envs["serve"], "task_check", spec, tmp_path_factory.mktemp("task_check"), TaskCheckResult, timeout_s=900
    ).model_dump()


def test_known_tasks_and_groups(checked: dict) -> None:
    assert checked["lm_eval"] == "0.4.13"
    # lm_eval/tasks/gsm8k/gsm8k.yaml: generate_until, metric_list [exact_match, higher_is_better: true]
    assert checked["tasks"]["gsm8k"] == {
        "kind": "task",
        "output_type": "generate_until",
        "metrics": ["exact_match"],
        "higher_is_better": {"exact_match": True},
        "source": "lm-eval",
    }
    # lm_eval/tasks/winogrande/default.yaml: multiple_choice with metric_list [acc]
    assert checked["tasks"]["winogrande"]["output_type"] == "multiple_choice"
    assert checked["tasks"]["winogrande"]["metrics"][0] == "acc"
    # lm_eval/tasks/mmlu/default/_mmlu.yaml: a group whose aggregate_metric_list is [acc, weight_by_size]
    assert checked["tasks"]["mmlu"]["kind"] == "group" and checked["tasks"]["mmlu"]["metrics"] == ["acc"]
    assert checked["tasks"]["mmlu"]["higher_is_better"] == {"acc": True}


def test_unknown_name_and_tag_are_refused_with_close_names(checked: dict) -> None:
    assert checked["unknown"]["arc_esay"][0] == "arc_easy"
    assert set(checked["tags"]["ai2_arc"]) >= {"arc_easy", "arc_challenge"}
    from quantverdict.children.task_check import problems

    bad = problems(checked, None)
    assert len(bad) == 2
    assert bad[0].startswith("eval.tasks: 'arc_esay' is not a task or group of lm-eval 0.4.13; closest: arc_easy")
    assert bad[1].startswith("eval.tasks: 'ai2_arc' is an lm-eval tag (tasks without an aggregate metric:")


def test_the_job_stage_refuses_before_any_work(stage_envs: dict[str, StageEnv], tmp_path: Path) -> None:
    own = tmp_path / "own"
    own.mkdir()
    (own / "qv_echo.yaml").write_text(OWN_TASK)
    cfg = compose([f"eval.include_path={own}", "eval.tasks=[qv_echo,qv_ech0]"])
    with pytest.raises(ConfigError) as err:
        data_access.check_task_names(cfg, stage_envs["serve"], tmp_path / "cache", tmp_path / "out")
    msg = str(err.value)
    assert msg.startswith("invalid configuration:\n  - eval.tasks: 'qv_ech0' is not a task or group of lm-eval 0.4.13 ")
    assert f"with eval.include_path='{own}'; closest: qv_echo" in msg
    # a passed check is kept for the same names and task files: the second job does not ask lm-eval again
    cfg = compose([f"eval.include_path={own}", "eval.tasks=[qv_echo,arc_easy]"])
    detail = data_access.check_task_names(cfg, stage_envs["serve"], tmp_path / "cache", tmp_path / "out2")
    assert detail == "lm-eval knows qv_echo: task (include_path)"
    (kept,) = (tmp_path / "cache" / "data" / "task-check").glob("*.json")
    assert json.loads(kept.read_text())["tasks"]["qv_echo"]["metrics"] == ["exact_match"]
    (tmp_path / "out2" / "task_check.log").unlink()
    data_access.check_task_names(cfg, stage_envs["serve"], tmp_path / "cache", tmp_path / "out2")
    assert not (tmp_path / "out2" / "task_check.log").exists()
