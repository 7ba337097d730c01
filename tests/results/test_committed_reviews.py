"""The reviews committed in docs/results regenerate identically from their records (tests/regen_docs_results.py:
every review is a child process ``python -m pipelines.review``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from regen_docs_results import committed_reviews, regenerate

pytestmark = pytest.mark.results


def test_committed_reviews_regenerate_identically(tmp_path: Path) -> None:
    reviews = committed_reviews()
    assert [p.relative_to(p.parents[1]).as_posix() for p in reviews] == ["gpu-hopper-schemes/review"]
    compared, problems = regenerate(tmp_path)
    # md, html, json and the review's plots (latency, memory, pareto, speed_ratio)
    assert len(compared) == 3 + len(list((reviews[0] / "plots").glob("*.png")))
    assert problems == []
