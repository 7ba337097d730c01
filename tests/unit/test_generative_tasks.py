"""Tasks beyond the project's six: lm-eval's samples and results of a generated-text task in the record's terms, and
the headline metric and its direction in the deltas and the review (lm-eval's metric_list, eval.headline on top)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from quantverdict.children.lmeval_adapter import headline_filter, sample_rows, task_metrics
from quantverdict.children.task_check import lmeval_data_source, offline_data_source
from quantverdict.config.schema import ReviewConfig
from quantverdict.results.baseline import accuracy_deltas, headline_of
from quantverdict.results.record import JobRecord, TaskResult
from quantverdict.results.table import format_table
from quantverdict.review.accuracy import accuracy_section
from review_records import record, write_samples

RC = replace(ReviewConfig(), interval="normal")
X = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]  # scheme's exact_match per item; b = 2, c = 1 against Y (test_review_stats)
Y = [0, 0, 1, 1, 0, 0, 0, 0, 0, 1]  # baseline's


def _gsm8k_sample(doc_id: int, flt: str, answer: str, em: float) -> dict[str, Any]:
    """One logged sample as lm-eval 0.4.13 writes it for a generate_until task (one per document and filter)."""
    return {
        "doc_id": doc_id,
        "target": "Natalia sold 48/2 = 24 clips in May. #### 72",
        "filtered_resps": [answer],
        "filter": flt,
        "metrics": ["exact_match"],
        "exact_match": em,
        "doc_hash": f"{doc_id:064x}",
        "prompt_hash": f"{doc_id + 100:064x}",
    }


def test_generated_text_rows_keep_the_headline_filter_only() -> None:
    samples = [
        _gsm8k_sample(1, "strict-match", "[invalid]", 0.0),
        _gsm8k_sample(1, "flexible-extract", "72", 1.0),
        _gsm8k_sample(0, "strict-match", "72", 1.0),
        _gsm8k_sample(0, "flexible-extract", "72", 1.0),
    ]
    rows = sample_rows("gsm8k", samples, "strict-match")
    assert rows == [
        {
            "task": "gsm8k",
            "doc_id": 0,
            "doc_hash": f"{0:064x}",
            "prompt_hash": f"{100:064x}",
            "target": "Natalia sold 48/2 = 24 clips in May. #### 72",
            "response": "72",
            "exact_match": 1.0,
            "filter": "strict-match",
        },
        {
            "task": "gsm8k",
            "doc_id": 1,
            "doc_hash": f"{1:064x}",
            "prompt_hash": f"{101:064x}",
            "target": "Natalia sold 48/2 = 24 clips in May. #### 72",
            "response": "[invalid]",
            "exact_match": 0.0,
            "filter": "strict-match",
        },
    ]
    # a group's rows: doc ids made unique by the task they come from
    assert [r["doc_id"] for r in sample_rows("g", samples, "flexible-extract", "gsm8k/")] == ["gsm8k/0", "gsm8k/1"]


def test_generated_text_metrics_by_filter() -> None:
    raw = {
        "alias": "gsm8k",
        "exact_match,strict-match": 0.25,
        "exact_match_stderr,strict-match": 0.1,
        "exact_match,flexible-extract": 0.5,
        "exact_match_stderr,flexible-extract": "N/A",
    }
    assert headline_filter(raw, "exact_match") == "strict-match"  # lm-eval lists filter_list's first first
    assert headline_filter({"acc,none": 0.5}, None) == "none" and headline_filter({}, "acc") == "none"
    res = {"results": {"gsm8k": raw}, "n-samples": {"gsm8k": {"original": 1319, "effective": 4}}}
    assert task_metrics("gsm8k", res, [], "exact_match", rolling=False) == {
        "exact_match": 0.25,
        "exact_match_stderr": 0.1,
        "exact_match,flexible-extract": 0.5,
        "exact_match_stderr,flexible-extract": None,
        "n": 4,
    }
    # multiple choice keeps its four keys, acc_norm None where the task reports none (boolq)
    res = {"results": {"boolq": {"acc,none": 0.6, "acc_stderr,none": 0.05}}, "n-samples": {}}
    assert task_metrics("boolq", res, [{}] * 3, "acc") == {
        "acc": 0.6,
        "acc_stderr": 0.05,
        "acc_norm": None,
        "acc_norm_stderr": None,
        "n": 3,
    }


def test_data_sources(tmp_path: Path) -> None:
    items = tmp_path / "items.jsonl"
    items.write_bytes(b'{"q": "1+1", "a": "2"}\n')
    sha = "bc688faec0ebf2251bcd21adf89adfedd7ddc486351e8d708f0a9041be8f6ae1"  # `sha256sum` of the 23 bytes above
    local = lmeval_data_source(
        "qv_sum", {"dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(items)}}, "test_split": "test"}
    )
    assert local["kind"] == "lm-eval task over local files" and local["files"] == [{"path": str(items), "sha256": sha}]
    assert local["description"] == f"lm-eval task qv_sum (json builder over {items} (sha256 {sha}))"
    hub = lmeval_data_source("gsm8k", {"dataset_path": "openai/gsm8k", "dataset_name": "main", "test_split": "test"})
    assert hub["description"] == (
        "lm-eval hub task gsm8k (dataset openai/gsm8k main, no revision pinned: the hub's default branch when fetched)"
    )
    assert (hub["kind"], hub["revision"], hub["split"], hub["files"]) == ("lm-eval hub task", None, "test", [])
    pinned = lmeval_data_source("t", {"dataset_path": "o/d", "dataset_kwargs": {"revision": "abc123"}})
    assert pinned["revision"] == "abc123" and pinned["description"].endswith("(dataset o/d, revision abc123)")
    off = offline_data_source("piqa", "/data", {"sources": {"piqa/valid.jsonl": "aa", "piqa/valid-labels.lst": "bb"}})
    assert off["files"] == [
        {"path": "/data/piqa/valid.jsonl", "sha256": "aa"},
        {"path": "/data/piqa/valid-labels.lst", "sha256": "bb"},
    ]
    assert off["kind"] == "offline file"


def test_headline_of_a_task() -> None:
    em = TaskResult.model_validate({"exact_match": 0.5, "headline_metric": "exact_match", "higher_is_better": True})
    ter = TaskResult.model_validate({"ter": 30.0, "bleu": 10.0, "headline_metric": "ter", "higher_is_better": False})
    assert headline_of("qv_gen", {}, em) == ("exact_match", True)
    assert headline_of("qv_mt", {}, ter) == ("ter", False)
    assert headline_of("qv_mt", {"qv_mt": "bleu"}, ter) == ("bleu", True)  # eval.headline wins; its direction
    assert headline_of("wikitext", {"wikitext": "word_perplexity"}, TaskResult()) == ("word_perplexity", False)
    assert headline_of("arc_easy", {}, None) == ("acc", True)  # records without a headline_metric


def _with_task(rec: dict[str, Any], task: str, metrics: dict[str, Any]) -> dict[str, Any]:
    rec["accuracy"]["tasks"][task] = {"n": 10, "limit": 10, **metrics}
    return rec


def test_review_pairs_a_generated_text_task(tmp_path: Path) -> None:
    gen = {"headline_metric": "exact_match", "higher_is_better": True, "output_type": "generate_until"}
    base = _with_task(record("bf16"), "qv_gen", {**gen, "exact_match": 0.3, "exact_match_stderr": 0.15})
    q = _with_task(record("int8"), "qv_gen", {**gen, "exact_match": 0.4, "exact_match_stderr": 0.16})
    hashes = [f"{i:064x}" for i in range(10)]
    rows = [
        {"doc_id": i, "exact_match": float(v), "doc_hash": hashes[i], "prompt_hash": hashes[i]} for i, v in enumerate(X)
    ]
    write_samples(q, tmp_path, "qv_gen", rows)
    write_samples(base, tmp_path, "qv_gen", [{**r, "exact_match": float(y)} for r, y in zip(rows, Y)])
    deltas, refused, missing = accuracy_section(JobRecord.view(q), JobRecord.view(base), RC)
    assert refused is None and missing == []
    (d,) = [d for d in deltas if d.name == "qv_gen"]
    # 0.4 - 0.3, paired over the 10 items: hand values of test_review_stats ([-0.251824, 0.451824], b = 2, c = 1)
    assert (d.metric, d.kind, d.paired, d.n) == ("exact_match", "score", True, 10)
    assert d.delta == pytest.approx(0.1) and d.recovery_pct == pytest.approx(100 * 0.4 / 0.3)
    assert d.interval is not None and d.interval.low == pytest.approx(-0.251824, abs=1e-5)
    assert (d.mcnemar_b, d.mcnemar_c) == (2, 1)
    # the grid's table heads the column with the task's own headline
    table = format_table([base, q])
    assert "qv_gen exact_match" in table and "0.400 (+0.100)" in table


def test_lower_is_better_metric_is_a_percent_change(tmp_path: Path) -> None:
    mt = {"headline_metric": "ter", "higher_is_better": False}
    base = _with_task(record("bf16"), "qv_mt", {**mt, "ter": 25.0})
    q = _with_task(record("int8"), "qv_mt", {**mt, "ter": 30.0})
    d = accuracy_deltas(JobRecord.view(q), JobRecord.view(base), {}).of("qv_mt")
    assert d is not None and (d.metric, d.value, d.baseline, d.higher_is_better) == ("ter", 30.0, 25.0, False)
    assert d.delta_pct == pytest.approx(20.0) and d.delta is None and d.recovery_pct is None  # 100 * (30 - 25) / 25
    deltas, _, _ = accuracy_section(JobRecord.view(q), JobRecord.view(base), RC)
    (td,) = [x for x in deltas if x.name == "qv_mt"]
    assert (td.kind, td.delta_pct, td.interval) == ("perplexity", pytest.approx(20.0), None)
    assert td.note == "lower is better: % change, no paired interval for this metric"
