"""The review: which scheme to deploy under stated constraints, defended with three numbers: records -> a typed
document (:mod:`.core` -> :mod:`.document`, ``review.json``) -> ``review.md`` and ``review.html`` (:mod:`.render`)."""

from quantverdict.review.core import ReviewNotLogged, build_review, run_review, to_json, write_review
from quantverdict.review.document import Review

__all__ = ["Review", "ReviewNotLogged", "build_review", "run_review", "to_json", "write_review"]
