"""The review of a synthetic model's grid (random weights): accuracy is not applicable everywhere, the
verdict rests on memory and speed alone and says so; the roofline and the GPU appear in the report.

Numbers of :func:`review_records.synthetic_grid` (Llama-3.1-8B shape, KV cache 131,072 B/token, 16
requests of 1152 tokens = 18,432 tokens = 2.25 GiB; see the table in review_records.py):

| scheme | need GiB | E2E p50 at c=1 | at c=16 | roofline: decode GB, TPOT c=1, efficiency |
|---|---|---|---|---|
| bf16 | 15.0 + 2.25 = 17.25 | 20 + 127 × 5 = 655 | 60 + 127 × 6 = 822 | 16.0, 5.0 ms, 4.00 / 5.0 = 80% |
| fp8 | 8.5 + 2.25 = 10.75 | 15 + 127 × 3 = 396 | 45 + 127 × 4 = 553 | 9.0, 3.0 ms, 2.25 / 3.0 = 75% |
| w8a8 | 10.75 | 15 + 127 × 3.125 = 411.875 | 45 + 127 × 3.9 = 540.3 | 9.0, 3.125 ms, 2.25 / 3.125 = 72% |
| gptq | 5.5 + 2.25 = 7.75 | 20 + 127 × 2.5 = 337.5 | 70 + 127 × 4 = 578 | 5.0, 2.5 ms, 1.25 / 2.5 = 50% |

At c=1 every scheme reaches the default 1 req/s load (bf16: 1000 / 655 = 1.53 req/s).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from quantverdict.config.schema import ReviewConfig
from quantverdict.review import build_review, write_review
from quantverdict.review.render import markdown
from review_records import grid, others, sentence, synthetic_grid, synthetic_record

RC = ReviewConfig(log_to_mlflow=False, bootstrap_samples=1000)
NA = "not applicable (random weights)"
TAIL = "accuracy must be measured on the real model before deploying."


def review(records: list[dict] | None = None, **kw: object):  # type: ignore[no-untyped-def]
    return build_review(records if records is not None else synthetic_grid(), replace(RC, **kw), "synthetic")


def md_of(rv) -> str:  # type: ignore[no-untyped-def]
    return markdown(rv)


def table_rows(md: str, heading: str) -> list[list[str]]:
    """The body rows of the first table after ``heading``, as cells."""
    part = md.split(heading, 1)[1]
    lines = [ln for ln in part.splitlines() if ln.startswith("|")]
    rows = []
    for ln in lines[2:]:
        rows.append([c.strip() for c in ln.strip("|").split(" | ")])
        if part.split(ln, 1)[1].startswith("\n\n"):  # end of this table
            break
    return rows


def test_budget_that_8bit_meets_deploys_8bit_on_memory_and_speed_alone() -> None:
    # 12 GiB: bf16 needs 17.25 (5.25 over, 5.25 / 12 = 43.75% -> 44%); 8-bit 10.75 fits; at the default
    # load (1 req/s, reached at c=1) fp8's E2E p50 396 ms beats w8a8's 411.875 ms
    rv = review(memory_budget_gib=12.0)
    v = rv.verdicts[0]
    assert v.decision == "quantize" and v.chosen_scheme == "fp8"
    assert sentence(rv, v).startswith("**On memory and speed alone: deploy fp8 (FP8_DYNAMIC).**")
    assert v.binding == ["memory"]
    assert rv.scheme(v.model, "bf16").checks.memory.shortfall == "5.250 GiB (44%) over the 12.0 GiB budget"
    assert "needs 10.8 GiB <= 12.0 GiB budget" in sentence(rv, v)
    assert "accuracy not measured (not applicable: random weights)" in sentence(rv, v)
    assert "meets both memory and latency (8-bit tier; E2E p50 396 ms at the load, ahead of w8a8)" in sentence(rv, v)
    line = next(line for line in markdown(rv).splitlines() if sentence(rv, v) in line)  # the verdict as shown
    assert line.endswith(f" Accuracy not measured (not applicable: synthetic model with random weights): {TAIL}")
    assert v.accuracy_not_measured.startswith("synthetic model with random weights")
    assert "gptq (W4A16): passes both memory and latency too, not chosen (more aggressive)" in others(rv, v)
    assert {sc.checks.accuracy.outcome for sc in rv.scorecards} == {"not_applicable"}
    # nothing is missing: not applicable is not missing
    assert all(sc.missing == [] for sc in rv.scorecards)


def test_load_at_concurrency_16_picks_w8a8() -> None:
    # at c=16 w8a8's E2E p50 540.3 ms beats fp8's 553 ms; the load is named "concurrency 16", not "16.0"
    rv = review(memory_budget_gib=12.0, load_rps=None, load_concurrency=16)
    v = rv.verdicts[0]
    assert v.chosen_scheme == "w8a8"
    assert "ITL p99 6 ms <= 200 ms at concurrency 16:" in sentence(rv, v)  # 1.5 x 3.9 = 5.85
    assert "E2E p50 540 ms at the load, ahead of fp8" in sentence(rv, v)


def test_budget_only_4bit_meets() -> None:
    # 9 GiB: 8-bit needs 10.75 (1.75 over = 19.4% -> 19%), gptq 7.75 fits
    rv = review(memory_budget_gib=9.0)
    v = rv.verdicts[0]
    assert v.chosen_scheme == "gptq"
    assert sentence(rv, v).startswith("**On memory and speed alone: deploy gptq (W4A16).**")
    assert "fp8 (FP8_DYNAMIC): fails memory: 1.750 GiB (19%) over the 9.000 GiB budget" in others(rv, v)


def test_nothing_binds_keeps_bf16_and_still_says_accuracy_was_not_measured() -> None:
    rv = review()  # 24 GiB >= 17.25
    v = rv.verdicts[0]
    assert v.decision == "do not quantize"
    assert sentence(rv, v).startswith("**On memory and speed alone: do not quantize, keep bf16 (BF16).**")
    assert "not measured" in sentence(rv, v) and v.accuracy_not_measured.startswith(
        "synthetic model with random weights"
    )
    assert "fp8 (FP8_DYNAMIC): would also pass both memory and latency, but nothing needs it" in others(rv, v)


@pytest.mark.parametrize(
    "floor",
    [
        {"min_recovery_pct": 99.9, "max_perplexity_increase_pct": 0.1},
        {"min_recovery_pct": None, "max_perplexity_increase_pct": None},
    ],
)
def test_accuracy_floor_is_not_applicable_and_never_blocks(floor: dict) -> None:
    rv = review(memory_budget_gib=12.0, **floor)
    assert rv.verdicts[0].chosen_scheme == "fp8"
    check = rv.scheme("llama3.1-8b-shape", "fp8").checks.accuracy
    assert check.outcome == "not_applicable" and check.text.startswith(NA)
    md = md_of(rv)
    if floor["min_recovery_pct"] is not None:
        assert "The accuracy floor is **not applicable** to llama3.1-8b-shape" in md
        assert "the accuracy floor (recovery >= 99.9%, perplexity <= +0.1%) does not apply" in check.text


def test_markdown_has_no_accuracy_number_for_synthetic_jobs() -> None:
    md = md_of(review(memory_budget_gib=12.0))
    rows = table_rows(md, "### Accuracy")
    assert [r[0] for r in rows] == ["fp8 (FP8_DYNAMIC)", "w8a8 (W8A8)", "gptq (W4A16)"]
    for r in rows:
        assert r[3:6] == [NA, NA, NA]  # value vs baseline, delta, recovery
        assert not any(re.search(r"\d", c) for c in r[1:9]), r  # no number in task..significant
    checks = table_rows(md, "### Checks")
    assert len(checks) == 4
    for r in checks:
        assert r[2].startswith(NA + ": accuracy was not measured"), r
    low = md.lower()
    for word in ("missing", "no accuracy results", "worst recovery", "excluded", "refused"):
        assert word not in low, word
    assert "**Accuracy not measured** for llama3.1-8b-shape" in md


def test_roofline_gpu_and_bits_per_weight_in_the_report() -> None:
    md = md_of(review(memory_budget_gib=12.0))
    roof = table_rows(md, "### Roofline at concurrency 1")
    # GB read/token, copy GB/s, ideal ms, TPOT c=1, achieved GB/s (bytes / TPOT), efficiency
    assert roof == [
        ["bf16 (BF16)", "16.00", "4,000", "4.00", "5.00", "3,200", "80%"],  # 16e9 / 0.005 s = 3.2e12
        ["fp8 (FP8_DYNAMIC)", "9.00", "4,000", "2.25", "3.00", "3,000", "75%"],
        ["w8a8 (W8A8)", "9.00", "4,000", "2.25", "3.12", "2,880", "72%"],  # 9e9 / 0.003125 = 2.88e12
        ["gptq (W4A16)", "5.00", "4,000", "1.25", "2.50", "2,000", "50%"],
    ]
    assert (
        "Ran on: GPU: NVIDIA H200 (driver 570.124.06, memory 140.4 GiB, compute capability 9.0) · serving: vllm 0.11.0"
    ) in md
    mem = {r[0]: r[1] for r in table_rows(md, "### Memory")}
    assert mem["gptq (W4A16)"] == "4.25" and mem["bf16 (BF16)"] == "–"  # stages.memory's effective_bits_per_weight


def test_written_review_json_and_plots(tmp_path: Path) -> None:
    paths = write_review(review(memory_budget_gib=12.0), tmp_path)
    assert "plots/accuracy.png" not in paths and "plots/memory.png" in paths
    data = json.loads(paths["json"].read_text())
    v = data["verdicts"][0]
    assert v["decision"] == "quantize" and v["chosen_scheme"] == "fp8" and v["accuracy_not_measured"]
    gptq = next(c for c in data["scorecards"] if c["scheme"] == "gptq")
    assert gptq["accuracy"]["deltas"] == [] and gptq["accuracy"]["not_applicable"].startswith("synthetic model")
    assert gptq["checks"]["accuracy"]["outcome"] == "not_applicable"
    assert gptq["speed"]["roofline"]["efficiency"] == pytest.approx(0.5)  # 1.25 / 2.5
    md = paths["md"].read_text()
    assert "No accuracy plot: accuracy is not applicable to llama3.1-8b-shape" in md


def test_mixed_grid_real_model_keeps_its_accuracy_check() -> None:
    # the real model "m" (review_records.grid) at 0.22 GiB: gptq, with its recovery 96.0% cited
    rv = review(grid() + synthetic_grid(), memory_budget_gib=0.22)
    by_model = {v.model: v for v in rv.verdicts}
    real, syn = by_model["m"], by_model["llama3.1-8b-shape"]
    assert sentence(rv, real).startswith("**Deploy gptq (W4A16).**") and "worst recovery 96.0%" in sentence(rv, real)
    assert not real.accuracy_not_measured and "not measured" not in sentence(rv, real)
    # 0.22 GiB is far below the synthetic model's needs: no scheme meets memory, said on memory/speed alone
    assert syn.decision == "no scheme meets all three"
    assert sentence(rv, syn).startswith(
        "**No scheme meets both memory and latency constraints for llama3.1-8b-shape.**"
    )
    assert syn.accuracy_not_measured and f"{sentence(rv, syn)} Accuracy not measured" in markdown(rv)


def test_synthetic_job_that_failed_before_evaluate_is_not_applicable_not_missing() -> None:
    # the pipeline writes accuracy.not_applicable after quantizing; a job that failed in quantize has none,
    # and config.model.source=synthetic says it
    failed = synthetic_record("gptq")
    failed.update(status="failed", failed_stage="quantize", error="RuntimeError: boom", accuracy={}, speed={})
    del failed["stages"]["evaluate"]
    rv = review([synthetic_record("bf16"), failed], memory_budget_gib=9.0)
    sc = next(c for c in rv.scorecards if c.scheme == "gptq")
    assert sc.accuracy.not_applicable
    assert not any("accuracy" in m for m in sc.missing)
    assert rv.scheme("llama3.1-8b-shape", "gptq").checks.accuracy.outcome == "not_applicable"
    v = rv.verdicts[0]
    assert v.decision == "no scheme meets all three"
    assert "its job failed in stage quantize" in sentence(rv, v) and v.accuracy_not_measured


@pytest.mark.browser
def test_synthetic_review_html_renders(tmp_path: Path) -> None:
    from test_review_html import page_problems

    page = write_review(review(memory_budget_gib=12.0), tmp_path / "review")["html"]
    problems, dom = page_problems(page, tmp_path, tmp_path / "review.png")
    assert problems == []
    text = re.sub(r"<[^>]+>", "", dom)
    assert "On memory and speed alone: deploy fp8 (FP8_DYNAMIC)." in text
    assert TAIL in text and NA in text
    assert "roofline efficiency (c=1)" in text and "NVIDIA H200" in text
    # the gptq roofline row: 5.00 GB/token, 4,000 GB/s, 1.25 ms ideal, 2.50 ms TPOT, 2,000 GB/s, 50%
    assert re.search(
        r"gptq \(W4A16\)</td><td>5\.00</td><td>4,000</td><td>1\.25</td><td>2\.50</td>"
        r"<td>2,000</td><td>50%</td>",
        dom,
    )
    assert dom.count('src="data:image/png;base64,') == 4  # speed ratio, pareto, memory, latency; no accuracy plot
    assert '<div class="verdict warn">' in dom  # a verdict without accuracy is shown as a warning
