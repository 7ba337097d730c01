"""A task outside the project's offline set, for the tests that run it: a generated-text (``generate_until``)
exact-match task given as an lm-eval task YAML over a local JSONL (``eval.include_path``), four capitals asked of the
embedded SmolLM2-135M (tests/integration/test_own_task.py: the hf backend with no offline data folder;
tests/integration/test_eval_server.py: the same answers through the job's vLLM server)."""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

NAME = "qv_capitals"
# famous capitals and two that small models often miss (Sydney, Lagos): a mix of 0 and 1 scores
CAPITALS = [
    ("France", "Paris"),
    ("Australia", "Canberra"),
    ("Japan", "Tokyo"),
    ("Nigeria", "Abuja"),
    ("Italy", "Rome"),
    ("Egypt", "Cairo"),
]
LIMIT = 4  # items a job scores (eval.limit or eval.task_limits)
TASK_YAML = """task: qv_capitals
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: generate_until
test_split: test
doc_to_text: "Q: What is the capital of Peru?\\nA: Lima\\nQ: What is the capital of {{{{country}}}}?\\nA:"
doc_to_target: "{{{{capital}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: true
    regexes_to_ignore: ["^\\\\s+", "\\\\s+$"]
metadata:
  version: 1.0
"""


def write_task(folder: Path) -> Path:
    """The task's files in ``folder`` (``capitals.jsonl`` and ``qv_capitals.yaml``, the folder to give as
    ``eval.include_path``); returns ``folder``."""
    data = folder / "capitals.jsonl"
    data.write_text("".join(json.dumps({"country": c, "capital": k}) + "\n" for c, k in CAPITALS))
    (folder / f"{NAME}.yaml").write_text(TASK_YAML.format(data=data))
    return folder


def rows(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The task's per-item rows of a job's record (its ``samples_qv_capitals.jsonl``)."""
    path = Path(rec["accuracy"]["samples"][NAME])
    return [json.loads(line) for line in path.read_text().splitlines()]


def rescored(response: str, target: str) -> float:
    """exact_match as the task's metric_list asks, worked out here: outer whitespace off, case and punctuation
    ignored (lm-eval's exact_match_hf_evaluate with regexes_to_ignore, ignore_case, ignore_punctuation)."""

    def norm(s: str) -> str:
        return s.strip().lower().translate(str.maketrans("", "", string.punctuation))

    return float(norm(response) == norm(target))
