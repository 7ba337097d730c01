"""The review: which scheme to deploy under stated constraints, defended with three numbers.

Reads job records (a folder or an MLflow experiment), computes per scheme memory, accuracy and speed against the
model's baseline, checks them against :class:`~quantverdict.config.schema.ReviewConfig` and decides
(:mod:`.core`); the result is a typed document (:mod:`.document`, ``review.json``) that templates render as
``review.md`` and ``review.html`` (:mod:`.render`).
"""

from quantverdict.review.core import ReviewNotLogged, build_review, run_review, to_json, write_review
from quantverdict.review.document import Review

__all__ = ["Review", "ReviewNotLogged", "build_review", "run_review", "to_json", "write_review"]
