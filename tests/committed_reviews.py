"""The reviews of the committed cache-free GPU grids, for the tests that check them by hand.

Each grid's records sit in ``docs/results/gpu-cache-free/<name>-grid/records`` (the names of
``regen_docs_results.CACHE_FREE_GRIDS``; the balanced W4A16 grid in ``docs/results/gpu-cache-free/records``); a
test builds its grid's review once per module and reads the paired ratio of one scheme over bf16 at one load from
``review.regime``. The records keep each point's summary figures, not its per-request times or result files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantverdict.config.schema import ReviewConfig
from quantverdict.review import build_review
from quantverdict.review.document import PairedSpeedup
from quantverdict.review.sources import load_dir

CACHE_FREE = Path(__file__).resolve().parents[1] / "docs" / "results" / "gpu-cache-free"


def records_dir(grid: str) -> Path:
    """The records folder of the committed grid ``grid`` (e.g. ``"decode-w8a8"``)."""
    return CACHE_FREE / f"{grid}-grid" / "records"


def build(grid: str) -> Any:
    """The review of the committed grid ``grid``, with no MLflow logging and 200 bootstrap samples (the paired
    ratios use Student's t, not the bootstrap)."""
    records, _ = load_dir(records_dir(grid))
    return build_review(records, ReviewConfig(log_to_mlflow=False, bootstrap_samples=200), "t")


def paired(review: Any, scheme: str, metric: str, load: int) -> PairedSpeedup:
    """The paired-by-repeat row of ``scheme`` over the baseline for ``metric`` at concurrency ``load``.
    StopIteration when the review has no such row."""
    row = next(r for r in next(iter(review.regime.values())) if r.scheme == scheme)
    return next(p for p in row.paired if p.metric == metric and p.load == load)
