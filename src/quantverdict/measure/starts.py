"""Repeats across independent server starts: the order starts run in, the ratio of a scheme to the baseline with an
interval over starts, the spread between starts, and the rule that stops adding starts once the answer is settled.

A *server start* is one start of a scheme's vLLM server and one whole sweep against it (every load level, every
repeat). Repeats inside one start share whatever that start drew (where the weights landed, the compiled graphs,
the host's state), so an interval over them understates what the next start shows. Here the start is the unit:

* :func:`round_order` / :func:`plan_order`: the schemes of a grid run start by start, interleaved in time
  (baseline, A, B, baseline, A, B, ...) or in a seeded random order per round, so that a drift of the machine lands
  on every scheme.
* :func:`start_means`: per load level, each start's mean of a metric over its valid repeats (a point recorded before
  starts were counted has no ``server_start`` and reads as start 1).
* :func:`start_ratios`: per load level the paired log ratio of each start's mean to the baseline's mean of the same
  start index (starts of one index run in the same round, next to each other in time), and a Student-t interval over
  the starts: the analysis of summary measures (Matthews, Altman, Campbell & Royston 1990, BMJ 300:230-235), in
  which each start contributes one number, so the between-start variance is in the interval by construction.
* :func:`start_spread`: per scheme and load level, the SD of the start means, the pooled within-start SD of the
  repeats, and the between-start variance component of the balanced one-way random-effects model
  (Searle, Casella & McCulloch 1992, *Variance Components*, §3.5: ``(MSB - MSW) / n``, 0 when negative).
* :func:`settle` / :func:`look_confidence`: the stopping rule (see there).

Quantiles from ``scipy.stats.t``. Pure: the orchestrator and the review share it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from quantverdict.measure.points import SweepPoint as RecordedPoint
from quantverdict.measure.points import as_point
from quantverdict.measure.validity import point_valid

# The review's decision band (quantverdict.review.verdict.PAYS): a speedup >= 1.05 pays, <= 1 / 1.05 costs, between:
# no change. A unit test holds the two equal (measure may not import the review).
DECISION_BAND = 1.05
# the fewest starts the stopping rule decides on: two give a t interval with one degree of freedom
MIN_STARTS_TO_SETTLE = 2

StartOrder = Literal["interleaved", "random"]
Ending = Literal["settled_above", "settled_below", "settled_inside", "max_reached", "continue"]


def start_index(point: RecordedPoint | Mapping[str, Any]) -> int:
    """The server start a point came from (1-based); a point recorded before starts were counted: 1. ``point``
    typed or as the record's JSON holds it."""
    s = as_point(point).server_start
    return s if s is not None and s >= 1 else 1


def round_order(jobs: Sequence[str], start: int, order: StartOrder = "interleaved", seed: int = 0) -> list[str]:
    """The jobs of one round (start index ``start`` of every job), in the order they run.

    Args:
        jobs: the grid's jobs, baseline first (any hashable names; the order of the grid otherwise).
        start: the start index of this round (>= 1).
        order: ``interleaved``: ``jobs`` as given, every round (baseline, A, B, baseline, A, B, ...); ``random``:
            a shuffle of ``jobs`` by ``random.Random(f"{seed}:{start}")`` (Python's Mersenne Twister seeded with a
            string: the same order for the same seed and round on every machine and Python version >= 3.2).
        seed: the random order's seed (``bench.seed`` of the grid).

    Raises:
        ValueError: an unknown ``order``, or ``start`` < 1.
    """
    if start < 1:
        raise ValueError(f"start index {start} must be >= 1")
    if order == "interleaved":
        return list(jobs)
    if order == "random":
        out = list(jobs)
        random.Random(f"{seed}:{start}").shuffle(out)
        return out
    raise ValueError(f"bench.start_order={order!r} is not allowed; allowed: interleaved, random")


def plan_order(
    jobs: Sequence[str], starts: Iterable[int], order: StartOrder = "interleaved", seed: int = 0
) -> list[tuple[int, str]]:
    """``(start, job)`` in time order over the rounds ``starts`` (:func:`round_order` per round).

    E.g. jobs ``[bf16, A, B]``, starts 2 and 3, interleaved: ``(2, bf16), (2, A), (2, B), (3, bf16), (3, A), (3, B)``.
    """
    return [(s, job) for s in starts for job in round_order(jobs, s, order, seed)]


@dataclass(frozen=True)
class StartMean:
    """One start's mean of a metric at one load level: ``mean`` over ``n`` valid repeats (``values``)."""

    start: int
    mean: float
    n: int
    values: tuple[float, ...]


def start_means(
    points: Iterable[RecordedPoint | Mapping[str, Any]], metric: str, mode: str
) -> dict[float, dict[int, StartMean]]:
    """Per load level (:func:`quantverdict.measure.sweep_plan.load_of`), per start index (:func:`start_index`), the
    mean of ``metric`` over the start's valid repeats (:func:`quantverdict.measure.validity.point_valid`) where the
    metric is a positive number.

    Returns:
        ``{load: {start: StartMean}}``; a start with no usable repeat at a load is absent there.
    """
    groups: dict[float, dict[int, list[float]]] = {}
    for p in map(as_point, points):
        v = p.number(metric)
        if not point_valid(p) or v is None or not v > 0:
            continue
        groups.setdefault(p.load(mode), {}).setdefault(start_index(p), []).append(v)
    return {
        load: {s: StartMean(s, math.fsum(vs) / len(vs), len(vs), tuple(vs)) for s, vs in sorted(by.items())}
        for load, by in sorted(groups.items())
    }


@dataclass(frozen=True)
class StartRatio:
    """A scheme's ratio to the baseline at one load level, over starts.

    Attributes:
        load: concurrency or offered req/s.
        starts: the start indices both have (the pairs).
        log_ratios: ``ln(scheme mean / baseline mean)`` per start, in ``starts`` order.
        ratio: ``exp(mean log ratio)`` (the geometric mean of the per-start ratios).
        low, high: the interval ``exp(m -+ t_{(1+c)/2, n-1} s / sqrt(n))``; None under two starts.
        confidence: its two-sided coverage ``c``.
        sd_log: ``s``, the SD of the log ratios (None under two starts).
    """

    load: float
    starts: tuple[int, ...]
    log_ratios: tuple[float, ...]
    ratio: float
    low: float | None
    high: float | None
    confidence: float
    sd_log: float | None

    @property
    def n(self) -> int:
        """Starts paired."""
        return len(self.starts)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "n": self.n}


def t_interval_logs(logs: Sequence[float], confidence: float) -> tuple[float, float, float] | None:
    """``(mean, low, high)`` of the Student-t interval ``m -+ t_{(1+c)/2, n-1} s / sqrt(n)`` on ``logs``
    (``scipy.stats.t.ppf``; ``s`` with ``n - 1`` in the denominator); None under two values.

    Raises:
        ValueError: ``confidence`` not in (0, 1).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence} must be in (0, 1)")
    n = len(logs)
    if n < 2:
        return None
    from scipy import stats  # imported where used: the review and the orchestrator have scipy, measure runs anywhere

    m = math.fsum(logs) / n
    s = math.sqrt(math.fsum((x - m) ** 2 for x in logs) / (n - 1))
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * s / math.sqrt(n)
    return m, m - half, m + half


def start_ratios(
    points: Iterable[RecordedPoint | Mapping[str, Any]],
    baseline_points: Iterable[RecordedPoint | Mapping[str, Any]],
    metric: str = "output_tok_s",
    mode: str = "concurrency",
    confidence: float = 0.95,
) -> list[StartRatio]:
    """Per load level, the scheme's ratio to the baseline over server starts (analysis of summary measures,
    Matthews et al. 1990): each start's mean over its valid repeats (:func:`start_means`), paired with the baseline's
    start of the same index (same round: next to it in time), ``d_s = ln(x_s / b_s)``, and the t interval over the
    ``d_s`` (:func:`t_interval_logs`), so a ratio and its inverse get mirrored intervals.

    Args:
        points, baseline_points: the two jobs' ``speed.points`` (``server_start`` per point; absent: start 1).
        metric: a point key where higher is better for a speedup (``output_tok_s``); for a latency pass the
            baseline as ``points`` and the scheme as ``baseline_points``.
        mode: ``rate`` or ``concurrency``.
        confidence: two-sided coverage of each interval.

    Returns:
        Sorted by load, only loads where both have at least one start in common.

    E.g. starts 1-3 with ratios 1.10, 1.00, 1.05: logs 0.09531, 0, 0.04879, m = 0.04803, s = 0.04766,
    t_{0.975, 2} = 4.30265, half width 0.11840: interval exp(-0.07037) .. exp(0.16643) = 0.9320 .. 1.1811.
    """
    mine, base = start_means(points, metric, mode), start_means(baseline_points, metric, mode)
    out = []
    for load in sorted(set(mine) & set(base)):
        common = sorted(set(mine[load]) & set(base[load]))
        if not common:
            continue
        logs = [math.log(mine[load][s].mean / base[load][s].mean) for s in common]
        m = math.fsum(logs) / len(logs)
        iv = t_interval_logs(logs, confidence)
        sd = math.sqrt(math.fsum((x - m) ** 2 for x in logs) / (len(logs) - 1)) if len(logs) > 1 else None
        out.append(
            StartRatio(
                load=load,
                starts=tuple(common),
                log_ratios=tuple(logs),
                ratio=math.exp(m),
                low=math.exp(iv[1]) if iv else None,
                high=math.exp(iv[2]) if iv else None,
                confidence=confidence,
                sd_log=sd,
            )
        )
    return out


@dataclass(frozen=True)
class StartSpread:
    """How much one scheme's metric moves between starts and within a start, at one load level.

    Attributes:
        load: concurrency or offered req/s.
        starts: starts with a usable repeat.
        means: each start's mean, in ``starts`` order.
        grand_mean: the mean of ``means``.
        between_start_sd: the SD of the start means (``n - 1``); None under two starts.
        within_start_sd: the pooled SD of the repeats around their start's mean,
            ``sqrt(sum (x - m_s)^2 / sum (n_s - 1))``; None when no start has two repeats.
        between_start_var: the between-start variance component of the one-way random-effects model,
            ``max(0, (MSB - MSW) / n0)`` with ``MSB = sum n_s (m_s - m)^2 / (k - 1)``, ``MSW`` = the pooled within
            variance, ``n0 = (N - sum n_s^2 / N) / (k - 1)`` (= n for a balanced design; Searle, Casella & McCulloch
            1992, §3.5-3.6); None where either mean square is.
        between_start_cv_pct: ``100 x between_start_sd / grand_mean``.
    """

    load: float
    starts: tuple[int, ...]
    means: tuple[float, ...]
    grand_mean: float
    between_start_sd: float | None
    within_start_sd: float | None
    between_start_var: float | None
    between_start_cv_pct: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def start_spread(
    points: Iterable[RecordedPoint | Mapping[str, Any]], metric: str = "output_tok_s", mode: str = "concurrency"
) -> list[StartSpread]:
    """Per load level, the spread of one scheme's ``metric`` between and within server starts (:class:`StartSpread`).

    E.g. start 1: 100, 102; start 2: 110, 108: means 101, 109, grand mean 105; between-start SD
    sqrt(((101-105)^2 + (109-105)^2) / 1) = 5.657; within SD sqrt((1 + 1 + 1 + 1) / 2) = 1.414; MSB =
    2 x 32 / 1 = 64, MSW = 2, n0 = 2: between variance (64 - 2) / 2 = 31.
    """
    out = []
    for load, by in start_means(points, metric, mode).items():
        sm = list(by.values())
        k = len(sm)
        means = [x.mean for x in sm]
        n_tot = sum(x.n for x in sm)
        grand = math.fsum(means) / k
        between_sd = math.sqrt(math.fsum((m - grand) ** 2 for m in means) / (k - 1)) if k > 1 else None
        ss_within = math.fsum((v - x.mean) ** 2 for x in sm for v in x.values)
        df_within = n_tot - k
        msw = ss_within / df_within if df_within > 0 else None
        var_b = None
        if k > 1 and msw is not None:
            weighted = math.fsum(x.n * x.mean for x in sm) / n_tot
            msb = math.fsum(x.n * (x.mean - weighted) ** 2 for x in sm) / (k - 1)
            n0 = (n_tot - math.fsum(x.n**2 for x in sm) / n_tot) / (k - 1)
            var_b = max(0.0, (msb - msw) / n0)
        out.append(
            StartSpread(
                load=load,
                starts=tuple(x.start for x in sm),
                means=tuple(means),
                grand_mean=grand,
                between_start_sd=between_sd,
                within_start_sd=math.sqrt(msw) if msw is not None else None,
                between_start_var=var_b,
                between_start_cv_pct=100 * between_sd / grand if between_sd is not None and grand else None,
            )
        )
    return out


def look_confidence(confidence: float, min_starts: int, max_starts: int) -> float:
    """The coverage of each look's interval so that all looks hold together with ``confidence`` at least.

    Looking at an interval after every start and stopping once it clears a line inflates the chance that some look
    errs (Armitage, McPherson & Rowe 1969, JRSS A 132:235; repeated confidence intervals: Jennison & Turnbull 1989,
    JRSS B 51:305-361, and *Group Sequential Methods with Applications to Clinical Trials*, 2000, ch. 9). With
    ``K = max_starts - min_starts + 1`` looks, each at ``1 - (1 - confidence) / K`` (Bonferroni), the probability
    that any look's interval misses the true ratio is at most ``1 - confidence``: conservative (the looks are
    positively correlated), simple, and valid whatever the stopping rule does with them.

    E.g. 0.95 with starts 3..6 (four looks): 1 - 0.05 / 4 = 0.9875.

    Raises:
        ValueError: ``confidence`` not in (0, 1), or ``max_starts < min_starts``.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence} must be in (0, 1)")
    if max_starts < min_starts:
        raise ValueError(f"max_starts={max_starts} < min_starts={min_starts}")
    return 1 - (1 - confidence) / (max_starts - min_starts + 1)


def settle(
    low: float | None, high: float | None, n_starts: int, min_starts: int, max_starts: int, band: float = DECISION_BAND
) -> Ending:
    """Whether a ratio's start-level interval settles the review's question, after ``n_starts`` starts.

    The question is the review's 1.05x rule (``band``): a speedup >= 1.05 pays, <= 1 / 1.05 costs, between is no
    change. The interval ``[low, high]`` (from :func:`start_ratios` at :func:`look_confidence`) settles it when it
    lies wholly on one side of a line of the band or wholly inside it:

    * ``settled_above``: ``low >= band`` (pays);
    * ``settled_below``: ``high <= 1 / band`` (costs);
    * ``settled_inside``: ``1 / band < low`` and ``high < band`` (no change either way);
    * otherwise ``max_reached`` once ``n_starts >= max_starts``, else ``continue``.

    Nothing settles before ``max(min_starts, 2)`` starts (an interval needs two), nor without an interval.

    Raises:
        ValueError: ``band`` <= 1.
    """
    if band <= 1:
        raise ValueError(f"decision band {band} must be > 1")
    if n_starts >= max(min_starts, MIN_STARTS_TO_SETTLE) and low is not None and high is not None:
        if low >= band:
            return "settled_above"
        if high <= 1 / band:
            return "settled_below"
        if 1 / band < low and high < band:
            return "settled_inside"
    return "max_reached" if n_starts >= max_starts else "continue"


@dataclass(frozen=True)
class LevelDecision:
    """What ended the starts of one scheme pair at one load level: ``ended_by`` (:func:`settle`), after ``starts``
    starts, with the interval it was decided on (``ratio``, ``low``, ``high`` at ``confidence``)."""

    load: float
    ended_by: Ending
    starts: int
    ratio: float
    low: float | None
    high: float | None
    confidence: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decide_levels(
    points: Iterable[RecordedPoint | Mapping[str, Any]],
    baseline_points: Iterable[RecordedPoint | Mapping[str, Any]],
    min_starts: int,
    max_starts: int,
    confidence: float,
    metric: str = "output_tok_s",
    mode: str = "concurrency",
    band: float = DECISION_BAND,
) -> list[LevelDecision]:
    """:func:`settle` at every load level of a scheme against the baseline, on the starts both have, with each look's
    interval at :func:`look_confidence` ``(confidence, min_starts, max_starts)``."""
    each = look_confidence(confidence, min_starts, max_starts)
    out = []
    for r in start_ratios(points, baseline_points, metric, mode, each):
        out.append(
            LevelDecision(
                r.load, settle(r.low, r.high, r.n, min_starts, max_starts, band), r.n, r.ratio, r.low, r.high, each
            )
        )
    return out


def gpu_time_saved_s(start_wall_s: Sequence[float], starts_run: int, max_starts: int) -> float:
    """GPU seconds a stopped job saved against the fixed count: ``(max_starts - starts_run) x mean start wall``
    (server start-up and sweep); 0 when every start ran or none has a wall time.

    E.g. starts of 100 s and 120 s, stopped after 2 of 5: 3 x 110 = 330 s.
    """
    if not start_wall_s or starts_run >= max_starts:
        return 0.0
    return (max_starts - starts_run) * math.fsum(start_wall_s) / len(start_wall_s)
