"""Pairing of scheme and baseline per-item results: lm-eval's doc_hash / prompt_hash, one item, token windows."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from per_item_records import mc_rows, with_token_windows
from quantverdict.children.lmeval_adapter import sample_rows
from quantverdict.config.schema import ReviewConfig
from quantverdict.results.record import JobRecord
from quantverdict.review.accuracy import NO_HASHES, NO_WINDOWS, accuracy_section
from review_records import record, write_samples

RC = replace(ReviewConfig(), interval="normal")
X = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]  # scheme; b = 2, c = 1 against Y (see test_review_stats)
Y = [0, 0, 1, 1, 0, 0, 0, 0, 0, 1]  # baseline


def view(rec: dict) -> JobRecord:
    return JobRecord.view(rec)


def _arc(q: dict, base: dict, rc: ReviewConfig = RC):
    deltas, refused, _ = accuracy_section(view(q), view(base), rc)
    assert refused is None
    return next(d for d in deltas if d.name == "arc_easy")


def test_doc_hash_mismatch_refuses_the_paired_test(tmp_path: Path) -> None:
    # the baseline ran a different data file: item 3's document differs (its doc_hash), the rest agree
    hashes = [f"{i:064x}" for i in range(10)]
    other = hashes[:3] + ["f" * 64] + hashes[4:]
    base, q = record("bf16", acc_norm=0.3), record("int8", acc_norm=0.4)
    write_samples(q, tmp_path, "arc_easy", mc_rows(X, doc_hashes=hashes, prompt_hashes=hashes))
    write_samples(base, tmp_path, "arc_easy", mc_rows(Y, doc_hashes=other, prompt_hashes=hashes))
    arc = _arc(q, base)
    assert arc.interval is None and arc.significant is None and arc.mcnemar_p is None and not arc.paired
    assert arc.note == (
        "arc_easy doc_id 3: doc_hash differs (000000000000... vs ffffffffffff... in the baseline): "
        "the two runs did not score the same document; paired test refused"
    )


def test_prompt_hash_mismatch_refuses_the_paired_test(tmp_path: Path) -> None:
    # same documents, another prompt template from item 5 on
    hashes = [f"{i:064x}" for i in range(10)]
    prompts = hashes[:5] + ["e" * 64] * 5
    base, q = record("bf16", acc_norm=0.3), record("int8", acc_norm=0.4)
    write_samples(q, tmp_path, "arc_easy", mc_rows(X, doc_hashes=hashes, prompt_hashes=hashes))
    write_samples(base, tmp_path, "arc_easy", mc_rows(Y, doc_hashes=hashes, prompt_hashes=prompts))
    arc = _arc(q, base)
    assert arc.interval is None and arc.significant is None
    assert arc.note.startswith("arc_easy doc_id 5: prompt_hash differs") and "same prompt" in arc.note


def test_matching_hashes_pair_silently_and_no_hashes_is_said(tmp_path: Path) -> None:
    hashes = [f"{i:064x}" for i in range(10)]
    base, q = record("bf16", acc_norm=0.3), record("int8", acc_norm=0.4)
    write_samples(q, tmp_path, "arc_easy", mc_rows(X, doc_hashes=hashes, prompt_hashes=hashes))
    write_samples(base, tmp_path, "arc_easy", mc_rows(Y, doc_hashes=hashes, prompt_hashes=hashes))
    arc = _arc(q, base)
    # hand values of test_review_stats: [-0.251824, 0.451824], McNemar b = 2, c = 1, p = 1
    assert arc.paired and arc.n == 10 and arc.note == ""
    assert arc.interval.low == pytest.approx(-0.251824, abs=1e-5) and arc.interval.n == 10
    assert (arc.mcnemar_b, arc.mcnemar_c) == (2, 1)
    write_samples(q, tmp_path, "arc_easy", mc_rows(X))
    write_samples(base, tmp_path, "arc_easy", mc_rows(Y))
    arc = _arc(q, base)
    assert arc.paired and arc.n == 10 and arc.note == NO_HASHES


def test_one_item_is_no_interval_and_never_significant(tmp_path: Path) -> None:
    base, q = record("bf16", acc_norm=0.0), record("int8", acc_norm=1.0)
    write_samples(q, tmp_path, "arc_easy", mc_rows([1], doc_hashes=["a"]))
    write_samples(base, tmp_path, "arc_easy", mc_rows([0], doc_hashes=["a"]))
    for rc in (RC, replace(RC, interval="bootstrap")):
        arc = _arc(q, base, rc)
        assert arc.n == 1 and arc.interval is None and arc.significant is None and arc.mcnemar_p is None
        assert "n=1 item: no interval" in arc.note


def test_unpaired_fallback_from_one_item_gives_no_interval() -> None:
    base, q = record("bf16", acc_norm=0.5), record("int8", acc_norm=0.4)
    for r in (base, q):
        r["accuracy"]["tasks"]["arc_easy"]["n"] = 1
    arc = _arc(q, base)
    assert arc.interval is None and arc.significant is None and "n=1 item: no interval" in arc.note


def _tppl(q: dict, base: dict, rc: ReviewConfig = RC):
    deltas, _, _ = accuracy_section(view(q), view(base), rc)
    return next(d for d in deltas if d.name == "token_perplexity")


def test_token_perplexity_paired_over_windows() -> None:
    # baseline [100, 200] nats, scheme [101, 203] nats over [50, 100] tokens: L = 4 / 150 nats/token;
    # ppl ratio exp(4 / 150) = 1.027025 -> +2.7025%; delta method interval exp(L -+ 0.00871095) - 1
    # = [+1.8118%, +3.6011%] (test_review_stats.test_window_log_ratio_by_hand)
    base = with_token_windows(record("bf16"), [100.0, 200.0], [50, 100])
    q = with_token_windows(record("int8"), [101.0, 203.0], [50, 100])
    t = _tppl(q, base)
    assert t.paired and t.n == 2 and t.significant is True
    assert t.delta_pct == pytest.approx(100 * math.expm1(4 / 150))
    assert t.interval.low == pytest.approx(1.8118, abs=1e-3) and t.interval.high == pytest.approx(3.6011, abs=1e-3)
    assert (t.interval.n, t.interval.unit) == (2, "window") and "per-window NLL" in t.interval.method
    boot = _tppl(q, base, replace(RC, interval="bootstrap", bootstrap_samples=2000))
    assert boot.interval.n == 2 and boot.interval.low <= boot.delta_pct <= boot.interval.high


def test_token_perplexity_without_windows_one_window_and_other_windows() -> None:
    t = _tppl(record("int8"), record("bf16"))
    assert t.interval is None and t.note == NO_WINDOWS == "no per-window data in this record: no interval"
    t = _tppl(with_token_windows(record("int8"), [101.0], [50]), with_token_windows(record("bf16"), [100.0], [50]))
    assert t.interval is None and t.significant is None and t.note.startswith("n=1 window: no interval")
    t = _tppl(
        with_token_windows(record("int8"), [101.0, 203.0], [50, 100]),
        with_token_windows(record("bf16"), [100.0, 200.0], [50, 99]),
    )
    assert t.interval is None and "first difference at window 1" in t.note and "refused" in t.note


def test_sample_rows_keep_lm_evals_hashes() -> None:
    logged = [
        {
            "doc_id": 1,
            "filtered_resps": [[-1.5, False]],
            "acc": 1.0,
            "acc_norm": 0.0,
            "doc_hash": "d1",
            "prompt_hash": "p1",
        },
        {"doc_id": 0, "filtered_resps": [[-2.0, False]], "acc": 0.0, "acc_norm": 1.0},
    ]
    rows = sample_rows("arc_easy", logged)
    assert [r["doc_id"] for r in rows] == [0, 1]
    assert "doc_hash" not in rows[0] and (rows[1]["doc_hash"], rows[1]["prompt_hash"]) == ("d1", "p1")
