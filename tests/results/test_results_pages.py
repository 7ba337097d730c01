"""The study pages of docs/results (index.md and one page and plot per study) are what
``tools/results/make_results.py`` writes from the committed records today: text identical, plots identical in
bytes (Agg, no time or version in the PNG metadata)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.results import make_results

pytestmark = [pytest.mark.results, pytest.mark.slow]

PAGES = ["index", "regime-crossover", "kld-accuracy", "crossmodel-a10g", "hopper-schemes", "cpu-grid"]


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
