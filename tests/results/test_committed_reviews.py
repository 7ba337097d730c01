"""The reviews committed in docs/results regenerate identically from their records (tests/regen_docs_results.py:
every review is a child process ``python -m pipelines.review``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from regen_docs_results import committed_reviews, regenerate, review_files

pytestmark = pytest.mark.results


def test_committed_reviews_regenerate_identically(tmp_path: Path) -> None:
    reviews = committed_reviews()
    names = [p.relative_to(p.parents[1]).as_posix() for p in reviews]
    assert names == ["gpu-hopper-schemes/review"]
    compared, problems = regenerate(tmp_path)
    # each review: md and json (its html, the same review with the plots inlined, is left out); then every review's
    # plots (latency, memory, pareto, speed_ratio)
    assert [len(review_files(r)) for r in reviews] == [2]
    assert len(compared) == 2 + sum(len(list((r / "plots").glob("*.png"))) for r in reviews)
    assert problems == []
