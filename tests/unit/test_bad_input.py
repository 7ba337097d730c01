"""Bad input is refused before any work, the global and per-task evaluation limits are reconciled (the smaller
wins, and the record names the key that set it), and a review's baseline is the newest baseline record that
holds accuracy results."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantverdict.children.evaluate import task_limit
from quantverdict.config.compose import compose
from quantverdict.config.schema import ConfigError, ReviewConfig
from quantverdict.results.baseline import find_baseline, no_baseline_reason
from quantverdict.results.record import JobRecord
from quantverdict.review import build_review
from review_records import record, stamp

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["bench.num_prompts=0"], "bench.num_prompts=0 must be >= 1"),
        (["bench.warmup_prompts=-1"], "bench.warmup_prompts=-1 must be >= 0"),
        (["bench.server.max_num_seqs=0"], "bench.server.max_num_seqs=0 must be >= 1 or null"),
        (["bench.point_timeout_s=0"], "bench.point_timeout_s=0.0 must be > 0 (seconds)"),
        (["bench.server.gpu_memory_utilization=1.5"], "bench.server.gpu_memory_utilization=1.5 must be in (0, 1]"),
        (["eval.batch_size=0"], "eval.batch_size=0 must be >= 1"),
        (["eval.num_fewshot=-1"], "eval.num_fewshot=-1 must be >= 0"),
        (["eval.token_perplexity.max_tokens=0"], "eval.token_perplexity.max_tokens=0 must be >= 1 or null"),
        (["scheme=gptq", "scheme.calibration.num_samples=0"], "scheme.calibration.num_samples=0 must be >= 1"),
        (["model.max_model_len=0"], "model.max_model_len=0 must be >= 1"),
    ],
)
def test_counts_out_of_range_are_refused_naming_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        compose(overrides)
    assert message in str(err.value)


def test_round_to_nearest_reads_no_calibration_counts() -> None:
    compose(["scheme=int8", "scheme.calibration.num_samples=0"])  # rtn: the calibration is not used


@pytest.mark.parametrize(
    ("limit", "task_limits", "task", "expected"),
    [
        (20, {"hellaswag": 30}, "hellaswag", (20, "eval.limit")),  # the global limit is smaller: it wins
        (50, {"hellaswag": 30}, "hellaswag", (30, "eval.task_limits.hellaswag")),  # the per-task cap is smaller
        (50, {"hellaswag": 30}, "arc_easy", (50, "eval.limit")),  # no cap for this task
        (None, {"wikitext": 1}, "wikitext", (1, "eval.task_limits.wikitext")),  # no global limit
        (None, {}, "piqa", (None, None)),  # every document
        (30, {"hellaswag": 30}, "hellaswag", (30, "eval.task_limits.hellaswag")),  # a tie names the cap
    ],
)
def test_the_smaller_limit_wins_and_is_named(
    limit: int | None, task_limits: dict[str, int], task: str, expected: tuple[int | None, str | None]
) -> None:
    assert task_limit(task, {"limit": limit, "task_limits": task_limits}) == expected


# --- the baseline of a review --------------------------------------------------------------------------


def _without_accuracy(rec: dict, finished_at: str, *, settings_only: bool) -> dict:
    """A bf16 record that holds no accuracy results: evaluation disabled ({}), or an accuracy section with
    settings but no task and no token perplexity."""
    rec["job"]["id"], rec["job"]["finished_at"] = f"m_bf16_{finished_at[11:13]}", finished_at
    rec["accuracy"] = {"tasks": {}, "token_perplexity": None, "settings": {}, "samples": {}} if settings_only else {}
    rec["stages"] = {"evaluate": {"status": "skipped", "detail": "eval.enabled=false"}}
    return rec


@pytest.mark.parametrize("settings_only", [False, True])
def test_the_newest_baseline_with_accuracy_is_taken(settings_only: bool) -> None:
    measured = record("bf16", acc_norm=0.50)
    measured["job"]["id"], measured["job"]["finished_at"] = "m_bf16_01", stamp(1)
    newer = _without_accuracy(record("bf16"), stamp(3), settings_only=settings_only)
    int8 = record("int8", acc_norm=0.45)
    records = [measured, newer, int8]
    views = [JobRecord.view(r) for r in records]
    assert find_baseline(views[2], views) is views[0]
    review = build_review(records, ReviewConfig(log_to_mlflow=False, floor_test="point"), "test")
    card = next(c for c in review.scorecards if c.scheme == "int8")
    arc = next(d for d in card.accuracy.deltas if d.name == "arc_easy")
    assert arc.baseline == 0.50 and arc.recovery_pct == pytest.approx(90.0)  # 100 * 0.45 / 0.50
    assert not any("no baseline" in m for m in card.missing)


def test_no_baseline_with_accuracy_lists_the_candidates() -> None:
    newer = _without_accuracy(record("bf16"), stamp(3), settings_only=True)
    failed = _without_accuracy(record("bf16"), stamp(2), settings_only=False)
    failed["status"], failed["stages"] = "failed", {"evaluate": {"status": "failed", "detail": "RuntimeError: boom"}}
    int8 = record("int8")
    views = [JobRecord.view(r) for r in (newer, failed, int8)]
    assert find_baseline(views[2], views) is None
    assert no_baseline_reason(views[2], views) == (
        "no bf16 record of m holds accuracy results; candidates: "
        f"m_bf16_03 (ok, finished {stamp(3)}): no accuracy results, evaluate skipped (eval.enabled=false); "
        f"m_bf16_02 (failed, finished {stamp(2)}): no accuracy results, evaluate failed (RuntimeError: boom)"
    )
    assert no_baseline_reason(views[2], views[2:]) == "no bf16 record of m among the records"
    review = build_review([newer, failed, int8], ReviewConfig(log_to_mlflow=False), "test")
    card = next(c for c in review.scorecards if c.scheme == "int8")
    assert any(
        m.startswith("no baseline record with accuracy for this model: no deltas (no bf16 record") for m in card.missing
    )
