"""Which points a serving sweep runs: offered loads (req/s or concurrency), repeats, requests per point.

A *point* is one run of ``vllm bench serve``: an offered load (open loop: a Poisson request rate,
``inf`` = all requests at t=0; closed loop: a fixed number of requests in flight) and a repeat
index. Pure (standard library only), so the orchestrator, the review and the tests share it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from quantverdict.measure.points import INF as INF
from quantverdict.measure.points import SweepPoint as RecordedPoint
from quantverdict.measure.points import as_point
from quantverdict.measure.points import is_inf_rate as is_inf_rate

METRICS = ("ttft", "tpot", "itl", "e2el")  # passed to --percentile-metrics
PERCENTILES = (50, 90, 99)  # passed to --metric-percentiles


def prompts_for(num_prompts: int, prompts_per_concurrency: int | None, concurrency: int | None) -> int:
    """Requests sent at one point, at least: ``max(num_prompts, prompts_per_concurrency * concurrency)`` in a
    concurrency sweep with ``prompts_per_concurrency`` set, else ``num_prompts``; in a concurrency sweep rounded
    up to whole waves, a multiple of ``concurrency`` (:func:`whole_waves`).

    E.g. num_prompts 16, 4 per concurrency: c=1 -> 16, c=64 -> 256, c=256 -> 1024 (four full waves); num_prompts 8
    at c=16 without a per-concurrency count -> 16 (one wave).
    """
    n = (
        max(num_prompts, prompts_per_concurrency * concurrency)
        if prompts_per_concurrency and concurrency
        else num_prompts
    )
    return whole_waves(n, concurrency)


def whole_waves(n: int, wave: int | None) -> int:
    """``n`` rounded up to a multiple of ``wave`` (a closed loop's concurrency; None or 0: ``n``). Requests of one
    length started together finish together, so a part wave at the end of a closed-loop point would run its last
    requests at a lower concurrency than the point names (measured on an H200, 128 in / 1,024 out at c=256:
    519 requests, two waves and 7, ran those 7 alone for the last 4.1 s of 43.0-46.4 s, the whole-run
    output tok/s 7.6-8.3% under that of the two waves)."""
    return -(-n // wave) * wave if wave and wave > 0 else n


@dataclass(frozen=True)
class SweepPoint:
    """One benchmark run: ``offered_rate_rps`` (req/s, or ``"inf"``), ``concurrency`` (None: unlimited)."""

    offered_rate_rps: float | str
    concurrency: int | None
    repeat: int

    @property
    def name(self) -> str:
        """File-name stem: ``rate-1_r0``, ``rate-0.5_r1``, ``rate-inf_r0``, ``conc-16_r0``."""
        if self.concurrency is not None:
            return f"conc-{self.concurrency}_r{self.repeat}"
        return f"rate-{format_rate(self.offered_rate_rps)}_r{self.repeat}"

    @property
    def request_rate_arg(self) -> str:
        """Value for ``vllm bench serve --request-rate``."""
        return format_rate(self.offered_rate_rps)


def normalize_rate(rate: float | int | str) -> float | str:
    """A rate as a float in req/s, or ``"inf"`` for an infinite one.

    Raises:
        ValueError: the rate is not positive.
    """
    if isinstance(rate, str):
        if rate.strip().lower() in ("inf", "+inf", "infinity", ".inf"):
            return INF
        rate = float(rate)
    if math.isinf(rate) and rate > 0:
        return INF
    if not rate > 0:
        raise ValueError(f"request rate must be > 0 req/s or inf, got {rate!r}")
    return float(rate)


def format_rate(rate: float | str) -> str:
    """``1.0 -> "1"``, ``0.5 -> "0.5"``, ``inf -> "inf"`` (``%g``)."""
    rate = normalize_rate(rate)
    return INF if rate == INF else f"{rate:g}"


def plan(mode: str, rates: list[float], concurrencies: list[int], repeats: int) -> list[SweepPoint]:
    """The points of a sweep, in run order: each load level, then each repeat of it.

    Args:
        mode: ``rate`` (open loop, one point per offered rate, ``inf`` allowed) or ``concurrency``
            (closed loop: ``--max-concurrency C`` with ``--request-rate inf``).
        rates: offered request rates, req/s.
        concurrencies: requests in flight.
        repeats: runs per load level (>= 1).

    Raises:
        ValueError: unknown mode, empty list, or repeats < 1.
    """
    if repeats < 1:
        raise ValueError(f"bench.repeats={repeats} must be >= 1")
    if mode == "rate":
        if not rates:
            raise ValueError("bench.rates is empty")
        return [SweepPoint(normalize_rate(r), None, i) for r in rates for i in range(repeats)]
    if mode == "concurrency":
        if not concurrencies:
            raise ValueError("bench.concurrencies is empty")
        return [SweepPoint(INF, int(c), i) for c in concurrencies for i in range(repeats)]
    raise ValueError(f"bench.mode={mode!r} is not allowed; allowed: rate, concurrency")


def load_of(p: RecordedPoint | Mapping[str, Any], mode: str) -> float:
    """Sort key of a point's load level: its concurrency (closed loop) or offered req/s (inf last); ``p`` a recorded
    point, typed or as its JSON holds it (:meth:`quantverdict.measure.points.SweepPoint.load`)."""
    return as_point(p).load(mode)


# --- seeds and windows (no prefix-cache reuse; windows long enough to trust) ---------------------------

# A point's prompts come from vLLM's random dataset seeded per (point, repeat): every seed is distinct, so
# no point starts with the prompts of the one before (the prefix cache would serve them). The warm-up draws
# from a seed no measured point uses; so does a second, longer attempt when the cache could not be reset
# after the first (after a reset it keeps the point's seed: the same prompt starts for every scheme).
WARMUP_SEED_OFFSET = 1_000_000
RETRY_SEED_STRIDE = 7919


def point_seed(base_seed: int, index: int) -> int:
    """Seed of the ``index``-th point in run order (:func:`plan`): ``base_seed + 1 + index``.

    The same plan gives the same seed to the same (load, repeat) in every job of a grid, so schemes are
    compared on the same prompts and arrivals; no two points of a sweep share a seed.
    """
    return base_seed + 1 + index


def warmup_seed(base_seed: int) -> int:
    """Seed of the warm-up prompts: ``base_seed + WARMUP_SEED_OFFSET``, never a measured point's
    (:func:`point_seed` stays below it for sweeps of fewer than a million points)."""
    return base_seed + WARMUP_SEED_OFFSET


def requests_for(
    min_requests: int, min_duration_s: float, rate_rps: float | None, margin: float = 1.0, wave: int | None = None
) -> int:
    """Requests a point sends so that its window lasts at least ``min_duration_s``:
    ``max(min_requests, ceil(rate_rps x min_duration_s x margin))`` (``min_requests`` alone when either the
    duration or the rate estimate is missing or zero), then with ``wave`` (a closed loop's concurrency) rounded up
    to whole waves (:func:`whole_waves`).

    E.g. 16 requests minimum, 30 s at an estimated 2.5 req/s: ``max(16, 75) = 75``; in a closed loop of
    concurrency 16 the same gives 80.
    """
    n = (
        min_requests
        if not min_duration_s or not rate_rps
        else max(min_requests, math.ceil(rate_rps * min_duration_s * margin))
    )
    return whole_waves(n, wave)


def warmup_requests(warmup_prompts: int, concurrency: int | None) -> int:
    """Warm-up requests before a point: none when ``bench.warmup_prompts`` is 0; in a closed loop one full
    wave of ``concurrency`` requests (every slot busy once, at the batch size the point runs, so its mean
    E2E sizes the window: :func:`requests_for` at ``C / E2E``); in an open loop ``warmup_prompts``.

    E.g. c=256: 256 (not 8, whose E2E at batch 8 would size a c=256 window ~4x too long on an H200).
    """
    if warmup_prompts <= 0:
        return 0
    return int(concurrency) if concurrency else warmup_prompts
