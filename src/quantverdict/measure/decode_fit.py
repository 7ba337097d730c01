"""The decode step as a fixed cost plus a cost per sequence in the batch, fitted from a serving sweep.

A continuous-batching server (vLLM) runs one forward pass per decode step for every running sequence;
each output token of a request waits one step, so the time per output token (TPOT) is the step time.
Reading the weights costs the same for any batch, each sequence adds its KV-cache reads and its share of
the matrix products, so over the memory-bound range::

    TPOT(c) = fixed + per_seq * c        (c: sequences decoding together)

fitted by ordinary least squares (:func:`numpy.polyfit`, degree 1), with the coefficient of determination
``R^2 = 1 - SS_res / SS_tot`` as its quality. The seed measured 313 µs/seq for Qwen3.5-4B fp16 and
395 µs/seq for Qwen3.5-9B AWQ on an A10G (ratio 1.26, like the bytes per step). Standard library + numpy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from quantverdict.measure.points import SweepPoint, as_point


@dataclass(frozen=True)
class DecodeFit:
    """``TPOT = fixed_us + per_seq_us * concurrency`` (µs), fitted on ``n`` points; ``r2`` None when every
    TPOT is equal (no variance to explain)."""

    fixed_us: float
    per_seq_us: float
    r2: float | None
    n: int
    concurrency_range: tuple[float, float]

    def tpot_us(self, concurrency: float) -> float:
        """The fitted TPOT (µs) at ``concurrency`` sequences."""
        return self.fixed_us + self.per_seq_us * concurrency


def fit_decode_step(concurrency: list[float], tpot_ms: list[float]) -> DecodeFit:
    """Least-squares line of TPOT against the number of sequences decoding together.

    Args:
        concurrency: sequences in flight at each point (> 0), e.g. :func:`in_flight`.
        tpot_ms: the TPOT (ms) measured at each point (mean or median over requests), same length.

    Returns:
        The fit in µs: points on an exact line give that line (``r2`` = 1.0). E.g. TPOT 20.313, 22.504,
        25.008 ms at c = 1, 8, 16 -> 20.0 ms fixed + 313 µs/seq.

    Raises:
        ValueError: fewer than 2 points, lengths that differ, a non-finite or non-positive value, or every
            point at the same concurrency (no slope to fit).
    """
    if len(concurrency) != len(tpot_ms):
        raise ValueError(f"{len(concurrency)} concurrency values but {len(tpot_ms)} TPOT values")
    if len(concurrency) < 2:
        raise ValueError(f"a line needs at least 2 points, got {len(concurrency)}")
    for name, vals in (("concurrency", concurrency), ("tpot_ms", tpot_ms)):
        bad = [v for v in vals if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0)]
        if bad:
            raise ValueError(f"{name} values must be finite and > 0, got {bad}")
    x = np.asarray(concurrency, dtype=float)
    y = np.asarray(tpot_ms, dtype=float) * 1000.0  # µs
    if np.ptp(x) == 0:
        raise ValueError(f"every point is at concurrency {x[0]:g}: no slope to fit")
    slope, intercept = np.polyfit(x, y, 1)
    ss_res = float(np.sum((y - (intercept + slope * x)) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else None
    return DecodeFit(float(intercept), float(slope), r2, len(x), (float(x.min()), float(x.max())))


def in_flight(point: SweepPoint | Mapping[str, Any], mode: str) -> float | None:
    """Sequences in flight at one sweep point.

    A concurrency sweep: the point's ``concurrency`` (the client keeps that many requests open). A rate
    sweep: Little's law, ``L = lambda * W`` = achieved req/s x mean E2E latency (s), the mean number of
    requests in the server over the run (it includes requests waiting for their first token, so a
    saturated point overstates the decode batch). None when the point lacks the numbers.
    """
    pt = as_point(point)
    if mode == "concurrency":
        c = pt.number("concurrency")
        return c if c is not None and c > 0 else None
    rps, e2e = pt.achieved_rps, pt.e2e_ms_mean or pt.e2e_ms_p50
    if rps is None or e2e is None or rps <= 0 or e2e <= 0:
        return None
    return float(rps) * float(e2e) / 1000.0
