"""The review's data: everything a review found, as the renderers (Markdown, HTML, plots, JSON) read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from quantverdict.config.schema import ReviewConfig
from quantverdict.review import constraints
from quantverdict.review.document import Regime
from quantverdict.review.flags import Flag
from quantverdict.review.scorecard import Scorecard
from quantverdict.review.verdict import Check, Verdict


@dataclass
class Review:
    """What :func:`~quantverdict.review.core.build_review` computed; the plots read it, and
    :func:`~quantverdict.review.export.to_document` assembles it into ``review.json``'s document."""

    source: str
    generated_at: str
    config: ReviewConfig
    cards: list[Scorecard]
    checks: dict[str, dict[str, dict[str, Check]]]  # model -> scheme -> constraint -> check
    verdicts: list[Verdict]
    regime: dict[str, list[Regime]]  # model -> one row per quantized scheme
    flags: list[Flag] = field(default_factory=list)  # every scorecard's, in card order
    validity: list[str] = field(default_factory=list)  # what each number stands on (repeats, checks, kernels)
    notes: list[str] = field(default_factory=list)
    job_dirs: list[str] = field(default_factory=list)  # job.output_dir of each reviewed record
    environment: list[str] = field(default_factory=list)  # GPU(s) and vLLM version(s) the records ran on
    constraints_how: str = ""  # how the constraint set was picked (constraints.resolve)
    # results derived from the fields above once and read by several renderers (crossmodel.cross_model)
    derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def label(self) -> str:
        """``<set name>-<constraints hash>``: names the review's folder and MLflow run."""
        return constraints.label(self.config)

    def cards_of(self, model: str) -> list[Scorecard]:
        """The scorecards of one model, in review order."""
        return [c for c in self.cards if c.model == model]
