"""Run the real evaluate stage (lm-eval 0.4.13, hf backend, CPU) on the embedded SmolLM2-135M.

Short on purpose (about a minute on 2 idle cores): 10 documents of ARC-Easy and PIQA, 5 of HellaSwag,
the first WikiText-2 test article, and token perplexity over the first 1,024 tokens in 512-token
windows. The checks are on structure, plausibility, and relations that must hold between the
result's own numbers (every perplexity comes from one summed log-likelihood).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from quantverdict.processes.envs import StageEnv
from quantverdict.processes.runner import run_stage
from quantverdict.results.stage_results import EvaluateResult

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DATA_ROOT = Path(os.environ.get("QV_DATA_ROOT", ROOT.parent / "shared" / "data"))

LIMITS = {"arc_easy": 10, "piqa": 10, "hellaswag": 5, "wikitext": 1}
EVAL = {
    "name": "test",
    "enabled": True,
    "backend": "hf",
    "tasks": ["wikitext", "arc_easy", "piqa", "hellaswag"],
    "limit": 10,
    "task_limits": {"hellaswag": 5, "wikitext": 1},
    "batch_size": 8,
    "max_length": 2048,
    "num_fewshot": 0,
    "dtype": "float32",
    "seed": 1234,
    "token_perplexity": {"enabled": True, "seq_len": 512, "stride": 512, "max_tokens": 1024},
}


@pytest.fixture(scope="module")
def result(stage_envs: dict[str, StageEnv], embedded_model: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not (DATA_ROOT / "SOURCES.md").is_file():
        pytest.skip(f"no offline data at {DATA_ROOT}")
    work = tmp_path_factory.mktemp("evaluate")
    spec = {
        "model_path": embedded_model["path"],
        "eval": EVAL,
        "offline_root": str(DATA_ROOT),
        "cache_dir": str(work / "cache"),
        "output_dir": str(work / "eval"),
        "device": "cpu",
    }
    return run_stage(stage_envs["serve"], "evaluate", spec, work, EvaluateResult, timeout_s=900).model_dump()


def _samples(result: dict, task: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(result["samples"][task]).read_text().splitlines()]


def test_structure_and_settings(result: dict) -> None:
    assert result["status"] == "ok"
    assert set(result["tasks"]) == set(LIMITS)
    s = result["settings"]
    assert (s["backend"], s["batch_size"], s["max_length"], s["num_fewshot"], s["limit"], s["dtype"]) == (
        "hf", 8, 2048, 0, 10, "float32"
    )  # fmt: skip
    assert s["task_limits"] == {"hellaswag": 5, "wikitext": 1}
    assert "number of characters" in s["normalization"]  # lm-eval 0.4.13 divides by len(choice)
    assert result["versions"]["lm_eval"] == "0.4.13"
    assert {"transformers", "torch"} <= set(result["versions"])
    assert result["eval_s"] > 0
    for task, limit in LIMITS.items():
        assert result["tasks"][task]["n"] == result["tasks"][task]["limit"] == limit
        assert Path(result["samples"][task]).is_file()


@pytest.mark.parametrize("task", ["arc_easy", "piqa", "hellaswag"])
def test_multiple_choice(result: dict, task: str) -> None:
    r = result["tasks"][task]
    n_choices = {"arc_easy": (3, 5), "piqa": (2, 2), "hellaswag": (4, 4)}[task]
    for key in ("acc", "acc_norm"):
        assert 0.0 <= r[key] <= 1.0
        assert r[f"{key}_stderr"] is not None and r[f"{key}_stderr"] >= 0.0
    rows = _samples(result, task)
    assert [row["doc_id"] for row in rows] == list(range(LIMITS[task]))
    # lm-eval's per-sample sha256 of the document and of the prompt, which the review's pairing checks
    assert all(len(row["doc_hash"]) == 64 and len(row["prompt_hash"]) == 64 for row in rows)
    assert len({row["doc_hash"] for row in rows}) == len(rows)
    # the task's acc is the mean of the per-item 0/1 correctness the paired tests will read
    assert r["acc"] == pytest.approx(sum(row["acc"] for row in rows) / len(rows))
    assert r["acc_norm"] == pytest.approx(sum(row["acc_norm"] for row in rows) / len(rows))
    for row in rows:
        assert row["acc"] in (0.0, 1.0) and row["acc_norm"] in (0.0, 1.0)
        lls = row["loglikelihoods"]
        assert n_choices[0] <= len(lls) <= n_choices[1] and all(ll < 0 for ll in lls)
        # acc is 1 exactly when the gold choice has the highest log-likelihood (ties aside)
        assert row["acc"] == float(max(range(len(lls)), key=lls.__getitem__) == row["target"])
    # bf16 SmolLM2-135M, 0-shot: better than chance on these items would be nice, but 10 items are
    # too few to assert it; only require that the model is not broken (not every item wrong by acc_norm)
    assert sum(row["acc_norm"] for row in rows) >= 1


def test_wikitext_word_byte_relations(result: dict) -> None:
    r = result["tasks"]["wikitext"]
    ll, words, nbytes = r["loglikelihood_sum"], r["n_words"], r["n_bytes"]
    assert ll < 0 and words > 0 and nbytes > words
    # lm-eval's weighted_perplexity / bits_per_byte, recomputed from the same summed log-likelihood
    assert r["word_perplexity"] == pytest.approx(math.exp(-ll / words), rel=1e-9)
    assert r["byte_perplexity"] == pytest.approx(math.exp(-ll / nbytes), rel=1e-9)
    assert r["bits_per_byte"] == pytest.approx(-ll / (nbytes * math.log(2)), rel=1e-9)
    assert r["bits_per_byte"] == pytest.approx(math.log2(r["byte_perplexity"]), rel=1e-9)
    # word perplexity = byte perplexity ** (bytes per word)
    assert r["word_perplexity"] == pytest.approx(r["byte_perplexity"] ** (nbytes / words), rel=1e-9)
    assert 1.0 < r["byte_perplexity"] < r["word_perplexity"] < 1000.0
    rows = _samples(result, "wikitext")
    assert len(rows) == 1 and rows[0]["loglikelihood"] == pytest.approx(ll)
    assert (rows[0]["n_words"], rows[0]["n_bytes"]) == (words, nbytes)
    # the first article, " = Robert Boulter = " with its blank lines restored: lm-eval counts bytes of
    # the original page and words as re.split(r"\s+", page)
    data_file = Path(result["data"]["include_path"]).parent / "data" / "wikitext.jsonl"
    page = json.loads(data_file.read_text().splitlines()[0])["page"]
    assert page.startswith(" = Robert Boulter = ")
    assert nbytes == len(page.encode("utf-8"))


def test_token_perplexity(result: dict) -> None:
    tp = result["token_perplexity"]
    # 1,024 tokens in non-overlapping 512-token windows: [0,512) and [512,1024) score 511 tokens each
    assert (tp["seq_len"], tp["stride"], tp["max_tokens"]) == (512, 512, 1024)
    assert tp["n_windows"] == 2 and tp["n_tokens"] == 1022
    assert tp["n_text_tokens"] > 250_000  # the whole WikiText-2 test text, ~245k words
    assert tp["token_perplexity"] == pytest.approx(math.exp(tp["nll_sum"] / tp["n_tokens"]), rel=1e-9)
    assert 1.0 < tp["token_perplexity"] < 200.0
    assert tp["window_n_tokens"] == [511, 511]  # per window, in window order (what the paired interval pairs)
    assert sum(tp["window_nll"]) == pytest.approx(tp["nll_sum"], rel=1e-12)


def test_data_source_and_headline(result: dict) -> None:
    from quantverdict.children.offline_data import OFFLINE_TASKS

    for task in LIMITS:
        src = result["tasks"][task]["data_source"]
        assert src["kind"] == "offline file" and src["split"] == OFFLINE_TASKS[task].split
        files = [DATA_ROOT / rel for rel in OFFLINE_TASKS[task].files]
        assert src["files"] == [{"path": str(f), "sha256": hashlib.sha256(f.read_bytes()).hexdigest()} for f in files]
    # this spec names no eval.headline: the first metric lm-eval reports, its direction lm-eval's
    got = {t: (result["tasks"][t]["headline_metric"], result["tasks"][t]["higher_is_better"]) for t in LIMITS}
    assert got == {
        "wikitext": ("word_perplexity", False),
        "arc_easy": ("acc", True),
        "piqa": ("acc", True),
        "hellaswag": ("acc", True),
    }
