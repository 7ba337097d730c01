"""report.format_table on a synthetic grid: accuracy n/a (never refused), the roofline table, the GPU line.

Numbers from :func:`review_records.synthetic_grid` (see the table there)."""

from __future__ import annotations

from quantverdict.results.table import format_table
from review_records import grid, synthetic_grid


def section(md: str, heading: str) -> list[str]:
    """The table rows (header and separator left out) of the section under ``heading``."""
    part = md.split(heading, 1)[1].split("\n### ", 1)[0]
    return [ln for ln in part.splitlines() if ln.startswith("|")][2:]


def test_synthetic_accuracy_rows_are_na() -> None:
    md = format_table(synthetic_grid())
    rows = section(md, "### Accuracy")
    # no tasks in a synthetic grid: job and the token-perplexity column, which says n/a
    assert rows == [
        "| llama3.1-8b-shape / bf16 (BF16) | n/a (random weights) |",
        "| llama3.1-8b-shape / fp8 (FP8_DYNAMIC) | n/a (random weights) |",
        "| llama3.1-8b-shape / w8a8 (W8A8) | n/a (random weights) |",
        "| llama3.1-8b-shape / gptq (W4A16) | n/a (random weights) |",
    ]
    # not applicable is not a refused delta, and the evaluate stage has no wall time but n/a
    assert "refused" not in md
    stage = section(md, "### Stage wall time")
    assert stage[0] == "| llama3.1-8b-shape / bf16 (BF16) | – | 120 | n/a | 600 |"


def test_synthetic_roofline_table_and_hardware_line() -> None:
    md = format_table(synthetic_grid())
    rows = section(md, "### Roofline at concurrency 1")
    # GB read/token, copy GB/s, ideal ms = bytes / 4.0e12 B/s, TPOT c=1, achieved = bytes / TPOT, efficiency
    assert rows == [
        "| llama3.1-8b-shape / bf16 (BF16) | 16.00 | 4,000 | 4.00 | 5.00 | 3,200 | 80% |",
        "| llama3.1-8b-shape / fp8 (FP8_DYNAMIC) | 9.00 | 4,000 | 2.25 | 3.00 | 3,000 | 75% |",
        "| llama3.1-8b-shape / w8a8 (W8A8) | 9.00 | 4,000 | 2.25 | 3.12 | 2,880 | 72% |",
        "| llama3.1-8b-shape / gptq (W4A16) | 5.00 | 4,000 | 1.25 | 2.50 | 2,000 | 50% |",
    ]
    assert "Hardware and serving stack: NVIDIA H200 (driver 570.124.06); vLLM 0.11.0" in md
    # with the power cap and top SM clock a record keeps (hardware.gpu_info)
    grid = synthetic_grid()
    for r in grid:
        for g in r["environment"]["gpu"]:
            g.update(enforced_power_limit_w=700.0, clocks_max_sm_mhz=1980.0)
    line = "NVIDIA H200 (driver 570.124.06, power limit 700 W, max SM clock 1980 MHz); vLLM 0.11.0"
    assert f"Hardware and serving stack: {line}" in format_table(grid)
    # the concurrency sweep's loads: c=1 of gptq, 20 + 127 * 2.5 = 337.5 ms E2E p50 -> 1000 / 337.5 = 2.96 req/s
    speed = section(md, "### Speed")
    assert speed[12].startswith("| llama3.1-8b-shape / gptq (W4A16) | c=1 | 2.96 |")
    # bits/weight of stages.memory's effective_bits_per_weight: 4 bits + a bf16 scale per 64 = 4.25
    assert section(md, "### Memory")[3].split(" | ")[2] == "4.25"


def test_mixed_grid_synthetic_rows_say_na_for_every_task() -> None:
    md = format_table(grid() + synthetic_grid())
    rows = section(md, "### Accuracy")
    # real tasks arc_easy and wikitext give the synthetic rows two more n/a cells
    assert "| llama3.1-8b-shape / gptq (W4A16) | n/a (random weights) | n/a | n/a |" in rows
    # the real model's gptq keeps its numbers: token ppl 41.6 vs 40 = +4.0%, acc_norm 0.48 - 0.50 = -0.020
    assert "| m / gptq (W4A16) | 41.60 (+4.0%) | 0.480 (-0.020) | 21.00 (+5.0%) |" in rows


def test_dtype_line_one_value_or_per_job() -> None:
    from quantverdict.results.table import dtype_line

    def rec(scheme: str, serve: str, chosen: str) -> dict:
        return {
            "job": {"model": "m", "scheme": scheme},
            "environment": {
                "dtypes": {
                    "evaluate": {"dtype": "float32", "chosen_by": "cpu"},
                    "serve": {"dtype": serve, "chosen_by": chosen},
                }
            },
        }

    same = [rec("bf16", "float32", "cpu"), rec("fp8", "float32", "cpu")]
    assert dtype_line(same) == "Compute dtypes: evaluate float32 (cpu); serve float32 (cpu)"
    # an AVX512 CPU without BF16: W4A16 is served in bf16, forced by its kernel, the rest in float32
    mixed = [rec("bf16", "float32", "cpu"), rec("gptq", "bfloat16", "kernel")]
    assert dtype_line(mixed) == (
        "Compute dtypes: evaluate float32 (cpu); serve m/bf16 float32 (cpu), m/gptq bfloat16 (kernel)"
    )
    assert dtype_line([{"job": {}, "environment": {}}]) == ""
