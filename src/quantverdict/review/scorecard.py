"""The scorecard: the review's working view of one job (identity and the three numbers)."""

from __future__ import annotations

from dataclasses import dataclass, field

from quantverdict.results.baseline import baseline_scheme
from quantverdict.results.record import JobRecord
from quantverdict.review import document as doc
from quantverdict.review.document import Memory


@dataclass
class Scorecard:
    """The review's view of one job: identity, the three numbers, and what could not be computed."""

    job_id: str
    model: str
    scheme: str
    label: str
    tier: int
    status: str
    failed_stage: str | None
    error: str | None
    is_baseline: bool
    memory: Memory = field(default_factory=Memory.unknown)
    accuracy: list[doc.AccuracyDelta] = field(default_factory=list)
    accuracy_refused: str | None = None
    accuracy_not_applicable: str | None = None  # why accuracy cannot be measured (random weights)
    speed: doc.Speed = field(default_factory=doc.Speed.unmeasured)
    flags: list[doc.Flag] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    validity: list[str] = field(default_factory=list)
    gpus: int = 1  # tensor parallel size (review.gpus.job_gpus)
    kv: str = "auto"  # the KV cache's precision (kv=NAME, conf/kv): auto, fp8, fp8_calibrated

    @property
    def name(self) -> str:
        return f"{self.scheme} ({self.label})"


def weight_tier(rec: JobRecord) -> int:
    """0 for 16-bit weights (no quantization), 1 for 8-bit (W8A16, W8A8, FP8), 2 for 4-bit or fewer, from
    ``config.scheme.weight_bits`` (the scheme schema's default is 16)."""
    bits = int(rec.cfg.scheme.weight_bits or 16)
    return 0 if bits >= 16 else 1 if bits >= 8 else 2


NOT_APPLICABLE_DEFAULT = "synthetic model with random weights: accuracy is not applicable"


def accuracy_not_applicable(rec: JobRecord) -> str | None:
    """Why the record's accuracy cannot be measured (None: it can), from ``accuracy.not_applicable``, else
    ``stages.evaluate`` marked ``not_applicable``, else ``config.model.source == "synthetic"`` (random weights)."""
    if rec.accuracy.not_applicable:
        return str(rec.accuracy.not_applicable)
    if rec.stage("evaluate").status == "not_applicable":
        return str(rec.stage("evaluate").detail or NOT_APPLICABLE_DEFAULT)
    if rec.cfg.model.source == "synthetic":
        return NOT_APPLICABLE_DEFAULT
    return None


def na_label(reason: str | None) -> str:
    """How a not-applicable accuracy is shown in a table cell: ``not applicable (random weights)``."""
    return "not applicable (random weights)" if "random weights" in (reason or "") else "not applicable"


def is_baseline(rec: JobRecord) -> bool:
    """True for the job of the model's baseline scheme (``config.baseline_scheme``, default ``bf16``)."""
    return rec.job.scheme == baseline_scheme(rec)
