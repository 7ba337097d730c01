"""The review: which scheme to deploy under stated constraints, defended with three numbers.

Reads per-job records (a multirun folder or an MLflow experiment), joins each scheme with the
baseline of the same model, checks memory, accuracy and latency constraints
(:class:`~quantverdict.config.schema.ReviewConfig`), and writes ``review.md``, ``review.html`` (self-contained)
and ``review.json``. Modules: :mod:`.sources` (records from a folder or MLflow), :mod:`.constraints` (the
constraint set), :mod:`.scorecard` (the per-scheme dataclasses) filled by :mod:`.memory`, :mod:`.accuracy` (paired
deltas, :mod:`.stats`), :mod:`.speed` and :mod:`.validity` (what each number stands on; :mod:`.same_gpu`:
whether a scheme and its baseline ran on one GPU), :mod:`.flags` (honesty flags),
:mod:`.verdict` (checks and decision), :mod:`.model` (the Review),
:mod:`.headline` (the first screen's three numbers per scheme), :mod:`.kld` (the KL divergence against the
baseline's distributions), :mod:`.gpus` (GPUs used and needed, throughput per GPU, the GPU-name match),
:mod:`.cost` (USD per million output tokens from a GPU price), :mod:`.crossmodel` (models compared on one target
GPU), :mod:`.plots`, :mod:`.render`, :mod:`.document` (``review.json``'s typed document and JSON schema) filled by
:mod:`.export`, :mod:`.core` (build, write, log).
"""

from quantverdict.review.core import ReviewNotLogged, build_review, run_review, to_json, write_review
from quantverdict.review.model import Review

__all__ = ["Review", "ReviewNotLogged", "build_review", "run_review", "to_json", "write_review"]
