"""A task outside the project's offline set, end to end: a generated-text (``generate_until``) exact-match task given
as an lm-eval task YAML over a local JSONL (``eval.include_path``), run by the real pipeline on the embedded
SmolLM2-135M with no offline data folder (``data.offline_root=null``) and no hub.

The record holds the task with its ``exact_match``, its headline metric and direction from the task's
``metric_list``, its ``data_source`` (the JSONL and its sha256), per-item rows the review pairs; the review's
accuracy code compares it. The second test runs the same task through the job's vLLM server (``eval.backend=server``:
lm-eval's local-completions model generating through ``/v1/completions``) and finds the same answers.
"""

from __future__ import annotations

import hashlib
import json
import string
from pathlib import Path
from typing import Any

import pytest

from clihelp import run_cli
from quantverdict.config.schema import ReviewConfig
from quantverdict.results.record import JobRecord, find_records, load
from quantverdict.results.table import format_table
from quantverdict.review.accuracy import accuracy_section

pytestmark = pytest.mark.integration

# famous capitals and two that small models often miss (Sydney, Lagos): a mix of 0 and 1 scores
CAPITALS = [
    ("France", "Paris"),
    ("Australia", "Canberra"),
    ("Japan", "Tokyo"),
    ("Nigeria", "Abuja"),
    ("Italy", "Rome"),
    ("Egypt", "Cairo"),
]
LIMIT = 4
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
# the cheapest job that still evaluates: 4 items, no token perplexity (the WikiText-2 text), no KLD, float32
EVAL = [
    "scheme=bf16",
    "data.offline_root=null",
    "eval.tasks=[qv_capitals]",
    f"eval.limit={LIMIT}",
    "eval.token_perplexity.enabled=false",
    "eval.kld.enabled=false",
    "eval.batch_invariance_check=false",
    "eval.dtype=float32",
]
PORT = 8799  # apart from the other integration tests' servers (8765, 8777, 8791, 8793, 8795)


@pytest.fixture(scope="module")
def own_tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("own_tasks")
    data = folder / "capitals.jsonl"
    data.write_text("".join(json.dumps({"country": c, "capital": k}) + "\n" for c, k in CAPITALS))
    (folder / "qv_capitals.yaml").write_text(TASK_YAML.format(data=data))
    return folder


def _job(out: Path, *overrides: str) -> dict[str, Any]:
    proc = run_cli(out, *EVAL, *overrides, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    (path,) = find_records(out / "runs")
    return load(path)


@pytest.fixture(scope="module")
def hf_job(tmp_path_factory: pytest.TempPathFactory, stage_envs: dict, embedded_model: dict, own_tasks: Path) -> dict:
    return _job(tmp_path_factory.mktemp("own_hf"), f"eval.include_path={own_tasks}", "bench.enabled=false")


def _rows(rec: dict[str, Any]) -> list[dict[str, Any]]:
    path = Path(rec["accuracy"]["samples"]["qv_capitals"])
    return [json.loads(line) for line in path.read_text().splitlines()]


def _rescored(response: str, target: str) -> float:
    """exact_match as the task's metric_list asks, worked out here: outer whitespace off, case and punctuation
    ignored (lm-eval's exact_match_hf_evaluate with regexes_to_ignore, ignore_case, ignore_punctuation)."""

    def norm(s: str) -> str:
        return s.strip().lower().translate(str.maketrans("", "", string.punctuation))

    return float(norm(response) == norm(target))


def test_own_generative_task_runs_end_to_end(hf_job: dict, own_tasks: Path) -> None:
    rec = hf_job
    assert rec["status"] == "ok", rec.get("error")
    assert rec["config"]["data"]["offline_root"] is None
    task = rec["accuracy"]["tasks"]["qv_capitals"]
    assert set(rec["accuracy"]["tasks"]) == {"qv_capitals"}
    assert (task["headline_metric"], task["higher_is_better"], task["output_type"]) == (
        "exact_match",
        True,
        "generate_until",
    )
    assert task["n"] == task["limit"] == LIMIT
    # where the items came from: the JSONL, by path and content
    data = own_tasks / "capitals.jsonl"
    src = task["data_source"]
    assert src["kind"] == "lm-eval task over local files" and src["task"] == "qv_capitals"
    assert src["files"] == [{"path": str(data), "sha256": hashlib.sha256(data.read_bytes()).hexdigest()}]
    # per item: the generated answer (until the newline, at most 8 tokens) and its 0/1 score, which the task's
    # exact_match averages
    rows = _rows(rec)
    assert [r["doc_id"] for r in rows] == list(range(LIMIT))
    assert [r["target"] for r in rows] == [k for _, k in CAPITALS[:LIMIT]]
    for r in rows:
        assert isinstance(r["response"], str) and "\n" not in r["response"]
        assert r["exact_match"] == _rescored(r["response"], r["target"])
        assert len(r["doc_hash"]) == len(r["prompt_hash"]) == 64
    assert task["exact_match"] == pytest.approx(sum(r["exact_match"] for r in rows) / LIMIT)
    print("qv_capitals answers:", [(r["target"], r["response"]) for r in rows])


def test_the_review_compares_it(hf_job: dict) -> None:
    base = hf_job
    scheme = json.loads(json.dumps(base))  # the same items scored again: a delta of exactly 0 on 4 pairs
    scheme["job"]["scheme"] = "int8"
    deltas, refused, missing = accuracy_section(JobRecord.view(scheme), JobRecord.view(base), ReviewConfig())
    assert refused is None and missing == []
    (d,) = [d for d in deltas if d.name == "qv_capitals"]
    assert (d.metric, d.kind, d.paired, d.n, d.delta, d.note) == ("exact_match", "score", True, LIMIT, 0.0, "")
    assert (d.mcnemar_b, d.mcnemar_c) == (0, 0)
    assert "qv_capitals exact_match" in format_table([base])


@pytest.mark.slow
def test_generated_text_through_the_server(
    tmp_path_factory: pytest.TempPathFactory, hf_job: dict, own_tasks: Path
) -> None:
    rec = _job(
        tmp_path_factory.mktemp("own_server"),
        f"eval.include_path={own_tasks}",
        "eval.backend=server",
        "bench.server.dtype=float32",
        "bench.mode=concurrency",
        "bench.concurrencies=[1]",
        "bench.num_prompts=2",
        "bench.min_duration_s=0",
        "bench.warmup_prompts=1",
        "bench.input_len=64",
        "bench.output_len=8",
        f"bench.server.port={PORT}",
    )
    assert rec["status"] == "ok", rec.get("error")
    assert rec["accuracy"]["backend"] == "server"
    task = rec["accuracy"]["tasks"]["qv_capitals"]
    assert task["headline_metric"] == "exact_match" and task["n"] == LIMIT
    served, local = _rows(rec), _rows(hf_job)
    for r in served:
        assert r["exact_match"] == _rescored(r["response"], r["target"])
    # greedy decoding in float32 on both engines, same prompt tokens: the same answers item by item
    assert [r["response"] for r in served] == [r["response"] for r in local]
    assert task["exact_match"] == hf_job["accuracy"]["tasks"]["qv_capitals"]["exact_match"]
