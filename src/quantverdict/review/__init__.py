"""The review: which scheme to deploy under stated constraints, defended with three numbers.

Reads per-job records (a multirun folder or an MLflow experiment), joins each scheme with the
baseline of the same model, checks memory, accuracy and latency constraints
(:class:`~quantverdict.config.schema.ReviewConfig`), and writes ``review.md``, ``review.html`` (self-contained)
and ``review.json``. Modules: :mod:`.stats` (paired intervals and tests), :mod:`.scorecard` (per-scheme
numbers), :mod:`.verdict` (constraints and decision), :mod:`.plots`, :mod:`.render`, :mod:`.core`.
"""

from quantverdict.review.core import Review, build_review, run_review, to_json, write_review

__all__ = ["Review", "build_review", "run_review", "to_json", "write_review"]
