"""Sentences from values: the macros of ``templates/verdict.j2`` and ``templates/validity.j2``, rendered with the
review's Markdown environment (:func:`quantverdict.review.render.environment`)."""

from __future__ import annotations

from typing import Any

from quantverdict.review.render import environment


def say(macro: str, template: str = "verdict.j2", **values: Any) -> str:
    """The text macro ``macro`` of ``template`` writes for ``values``, ends trimmed."""
    return str(getattr(environment("md").get_template(template).module, macro)(**values)).strip()
