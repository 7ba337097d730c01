"""A comparison that cannot be made leaves that task unjudged: when a document's hash differs between baseline
and scheme under the same doc_id, the paired test is refused and the task's point value neither fails nor passes
the scheme; the accuracy check says the task cannot be checked, and why."""

from __future__ import annotations

from pathlib import Path

from per_item_records import mc_rows
from quantverdict.config.schema import ReviewConfig
from quantverdict.review import build_review
from review_records import record, write_samples

# defaults: 95% recovery floor, +5% perplexity (word_perplexity); judged on the point value (floor_test=point)
RC = ReviewConfig(log_to_mlflow=False, bootstrap_samples=1000, floor_test="point", interval="normal")
HASHES = [f"{i:064x}" for i in range(10)]
OTHER = HASHES[:3] + ["f" * 64] + HASHES[4:]  # the baseline scored another document under doc_id 3
REFUSAL = (
    "arc_easy doc_id 3: doc_hash differs (000000000000... vs ffffffffffff... in the baseline): "
    "the two runs did not score the same document; paired test refused"
)


def _checks(tmp_path: Path, baseline_hashes: list[str], wppl: float = 20.2) -> dict:
    # arc_easy acc_norm 0.40 against 0.50: recovery 100 * 0.40 / 0.50 = 80.0%, 15.0 points below the 95% floor;
    # word perplexity 20.2 against 20.0: +1.0% (within +5%)
    base, fp8 = record("bf16", acc_norm=0.50, wppl=20.0), record("fp8", acc_norm=0.40, wppl=wppl)
    write_samples(fp8, tmp_path, "arc_easy", mc_rows([1] * 4 + [0] * 6, doc_hashes=HASHES, prompt_hashes=HASHES))
    write_samples(base, tmp_path, "arc_easy", mc_rows([1] * 5 + [0] * 5, doc_hashes=baseline_hashes))
    review = build_review([base, fp8], RC, "test")
    return review.scheme("m", "fp8").checks


def test_the_same_items_are_judged_on_their_recovery(tmp_path: Path) -> None:
    acc = _checks(tmp_path, HASHES).accuracy
    assert acc.outcome == "fail"
    assert "arc_easy recovery 80.0% is 15.0 points below the 95% floor" in acc.shortfall


def test_a_refused_comparison_is_neither_failed_nor_passed(tmp_path: Path) -> None:
    acc = _checks(tmp_path, OTHER).accuracy
    assert acc.outcome == "unknown"  # blocks the scheme like any check that cannot be made; never "fail"
    assert acc.text.startswith(f"not checked: arc_easy acc_norm cannot be checked ({REFUSAL}); the rest: ")
    assert "word_perplexity +1.0%" in acc.text and "recovery 80.0%" not in acc.text
    assert not acc.shortfall


def test_a_refused_task_does_not_hide_another_failure(tmp_path: Path) -> None:
    # word perplexity 22.0 against 20.0: +10.0%, 5.0 points over the +5% limit: the scheme fails on that alone
    acc = _checks(tmp_path, OTHER, wppl=22.0).accuracy
    assert acc.outcome == "fail"
    assert acc.shortfall == "word_perplexity rises +10.0%, 5.0 points over the +5% limit"
    assert f"arc_easy acc_norm cannot be checked ({REFUSAL})" in acc.text
