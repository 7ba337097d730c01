"""A task outside the project's offline set, end to end: a generated-text (``generate_until``) exact-match task given
as an lm-eval task YAML over a local JSONL (``eval.include_path``, tests/integration/owntask.py), run by the real
pipeline on the embedded SmolLM2-135M with no offline data folder (``data.offline_root=null``) and no hub.

The record holds the task with its ``exact_match``, its headline metric and direction from the task's
``metric_list``, its ``data_source`` (the JSONL and its sha256), per-item rows the review pairs; the review's
accuracy code compares it. The same task through a job's vLLM server (``eval.backend=server``: lm-eval's
local-completions model generating through ``/v1/completions``) finds the same answers as the hf backend:
tests/integration/test_eval_server.py, whose served and hf jobs run it beside their other tasks.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from clihelp import run_cli
from owntask import CAPITALS, LIMIT, rescored, rows, write_task
from quantverdict.config.schema import ReviewConfig
from quantverdict.results.record import JobRecord, find_records, load
from quantverdict.results.table import format_table
from quantverdict.review.accuracy import accuracy_section

pytestmark = pytest.mark.integration

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


@pytest.fixture(scope="module")
def own_tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_task(tmp_path_factory.mktemp("own_tasks"))


def _job(out: Path, *overrides: str) -> dict[str, Any]:
    proc = run_cli(out, *EVAL, *overrides, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    (path,) = find_records(out / "runs")
    return load(path)


@pytest.fixture(scope="module")
def hf_job(tmp_path_factory: pytest.TempPathFactory, stage_envs: dict, embedded_model: dict, own_tasks: Path) -> dict:
    return _job(tmp_path_factory.mktemp("own_hf"), f"eval.include_path={own_tasks}", "bench.enabled=false")


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
    items = rows(rec)
    assert [r["doc_id"] for r in items] == list(range(LIMIT))
    assert [r["target"] for r in items] == [k for _, k in CAPITALS[:LIMIT]]
    for r in items:
        assert isinstance(r["response"], str) and "\n" not in r["response"]
        assert r["exact_match"] == rescored(r["response"], r["target"])
        assert len(r["doc_hash"]) == len(r["prompt_hash"]) == 64
    assert task["exact_match"] == pytest.approx(sum(r["exact_match"] for r in items) / LIMIT)
    print("qv_capitals answers:", [(r["target"], r["response"]) for r in items])


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
