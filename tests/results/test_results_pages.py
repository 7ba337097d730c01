"""The study pages of docs/results (index.md and one page and plot per study) are what
``tools/results/make_results.py`` writes from the committed records today: text identical, plots identical in
bytes (Agg, no time or version in the PNG metadata)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.results import make_results

pytestmark = [pytest.mark.results, pytest.mark.slow]

PAGES = [
    "index",
    "regime-crossover",
    "kld-accuracy",
    "crossmodel-a10g",
    "hopper-schemes",
    "starts-energy",
    "cpu-grid",
]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pages")
    make_results.build(out)
    return out


def test_every_page_and_plot_is_written(written: Path) -> None:
    names = sorted(p.name for p in written.iterdir())
    assert names == sorted([f"{p}.md" for p in PAGES] + [f"{p}.png" for p in PAGES if p != "index"])


def test_committed_pages_equal_the_generated_ones(written: Path) -> None:
    assert make_results.compare(written) == []


def test_regime_page_answers_the_prefill_question_first(written: Path) -> None:
    lines = (written / "regime-crossover.md").read_text().splitlines()
    assert lines[2].startswith("**Does W4A16 pay at high concurrency for prefill-heavy traffic on an H200?** ")
    # the prefill-heavy W4A16 grid at concurrency 256: 2 paired repeats, ratios 0.9537 and 0.9521 of bf16's
    # output tok/s (the records' output_tok_s); geometric mean 0.9529, t(0.975, 1) = 12.706 on the log ratios
    assert "0.95x bf16's output tok/s (95% CI 0.94-0.96, 2 paired repeats; slower)" in lines[2]
    assert lines[2].split("** ")[1].startswith("No:")
    table_row = next(line for line in lines if line.startswith("| prefill-heavy | 2,048 / 128 | W4A16 |"))
    assert table_row.endswith("| 0.95x [0.94, 0.96] n=2 |")


def test_starts_page_pairs_the_speedups_by_server_start(written: Path) -> None:
    lines = (written / "starts-energy.md").read_text().splitlines()
    question = "**Do the speedups over bf16 hold across independent server starts, and what does each scheme spend in "
    assert lines[2].startswith(question)
    assert lines[2].split("?** ")[1].startswith("Partly, over 2 server starts paired by start: ")
    # W4A16 at c=256, the records' output tok/s per start over bf16's of the same start: 9,063.6 / 10,072.3 = 0.89986
    # and 9,186.8 / 9,427.6 = 0.97446; logs -0.10552 and -0.02587, mean -0.06570 -> 0.936x; their sd 0.07965 / sqrt 2
    # = 0.05632, se 0.05632 / sqrt 2 = 0.03982, t(0.975, 1) = 12.706 -> +-0.50601 -> [0.5646, 1.5532]: includes 1.
    # Between its starts: 9,186.8 / 9,063.6 - 1 = 1.36%
    row = next(line for line in lines if line.startswith("| gptq (W4A16) | 256 |"))
    assert row == "| gptq (W4A16) | 256 | 9,064 | 9,187 | 1.4% | 0.94x [0.56, 1.55] n=2 | no difference established |"
    assert "but not at c=256 (0.94x, 95% CI 0.56-1.55: no difference established)" in lines[2]
    # bf16 at c=1, the records' gpu.energy_per_output_token_j of starts 1 and 2: 2.90219 and 2.93011 J, median
    # (2.90219 + 2.93011) / 2 = 2.91615; output_tok_per_j 0.344567 and 0.341284, median 0.342925
    row = next(line for line in lines if line.startswith("| bf16 (BF16) | 1 | 2.92"))
    assert row.startswith("| bf16 (BF16) | 1 | 2.92 (2.90-2.93) | 0.343 | ")
    # between-start spread at c=256: bf16 10,072.3 / 9,427.6 - 1 = 6.84%, FP8_DYNAMIC 12,490.7 / 11,654.0 - 1 = 7.18%,
    # W4A16 1.36%; FP8_DYNAMIC's c=256 windows: idle_fraction 0.0458 and 0.0796, idle_longest_s 0.4 both
    assert (
        "- Between-start spread of output tok/s at c=256: bf16 6.8%, FP8_DYNAMIC 7.2%, W4A16 1.4%; widest for "
        "FP8_DYNAMIC, whose c=256 windows show idle gaps (idle 4.6-8.0% of samples, longest gap 0.4 s)."
    ) in lines
