"""Intervals and paired tests: accuracy deltas of a scheme against its baseline on the same items, KL divergence
over windows, speed ratios paired by repeat.

From ``scipy.stats``: quantiles (``norm``, ``t``), the percentile bootstrap (``bootstrap(paired=True)``; Efron &
Tibshirani 1993, ch. 13) and the exact binomial test (McNemar's exact test). Written out here, with their source:
the delta-method standard errors of a ratio and the standard error of a difference of independent estimates.

No interval from fewer than :data:`MIN_ITEMS` independent items: :class:`TooFewItems` instead (a bootstrap over
one item gives a zero-width interval that looks significant). scipy is imported by the orchestrator and by the
serve environment's evaluate child (through lm-eval's scikit-learn), never by the quantize child.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

from quantverdict.measure.points import SweepPoint, as_point
from quantverdict.measure.validity import point_valid

MIN_ITEMS = 2  # fewer independent items: no interval and no significance test


def z_value(confidence: float) -> float:
    """Two-sided standard-normal quantile ``Φ⁻¹((1 + confidence) / 2)``: 1.959964 for 0.95.

    Raises:
        ValueError: ``confidence`` is not in (0, 1).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence} must be in (0, 1)")
    return float(sps.norm.ppf(0.5 + confidence / 2.0))


def too_few(n: int, unit: str = "item") -> str | None:
    """Why ``n`` independent ``unit``s give no interval (``"n=1 document: no interval and no significance test
    ..."``); None when ``n >= MIN_ITEMS``."""
    if n >= MIN_ITEMS:
        return None
    return (
        f"n={n} {unit}{'' if n == 1 else 's'}: no interval and no significance test "
        f"(they need at least {MIN_ITEMS} independent {unit}s)"
    )


class TooFewItems(ValueError):
    """Fewer than :data:`MIN_ITEMS` independent items; the message is :func:`too_few`'s."""

    def __init__(self, n: int, unit: str = "item") -> None:
        super().__init__(too_few(n, unit))
        self.n = n
        self.unit = unit


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided interval, its method and ``n`` independent ``unit``s (None: unknown)."""

    estimate: float
    low: float
    high: float
    method: str
    n: int | None = None
    unit: str = "item"

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def excludes_zero(self) -> bool:
        return not self.contains(0.0)

    def describe(self) -> str:
        """``paired bootstrap, n=100``; ``... over 2 windows`` for another unit."""
        if self.n is None:
            return self.method
        return f"{self.method}, n={self.n}" if self.unit == "item" else f"{self.method} over {self.n} {self.unit}s"


def significant(iv: Interval | None) -> bool | None:
    """True when ``iv`` excludes 0; None without an interval or under :data:`MIN_ITEMS` items."""
    if iv is None or (iv.n is not None and iv.n < MIN_ITEMS):
        return None
    return iv.excludes_zero()


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    a = np.asarray(values, dtype=float)
    return float(a.mean()), float(a.std(ddof=1))


def _check_pairs(x: Sequence[float], y: Sequence[float], unit: str = "item") -> None:
    if len(x) != len(y):
        raise ValueError(f"paired samples differ in length: {len(x)} vs {len(y)}")
    if len(x) < MIN_ITEMS:
        raise TooFewItems(len(x), unit)


def paired_normal_interval(x: Sequence[float], y: Sequence[float], confidence: float = 0.95) -> Interval:
    """``mean(x) - mean(y)`` ± ``z · sd(d) / sqrt(n)`` over the paired differences ``d_i = x_i - y_i`` (x: the
    scheme's per-item scores, y: the baseline's on the same items).

    Raises:
        TooFewItems: fewer than 2 pairs.
        ValueError: lengths differ.
    """
    _check_pairs(x, y)
    d = [a - b for a, b in zip(x, y)]
    mean, sd = _mean_sd(d)
    half = z_value(confidence) * sd / math.sqrt(len(d))
    return Interval(mean, mean - half, mean + half, "paired normal", len(d))


def ratio_normal_interval(
    x: Sequence[float], y: Sequence[float], confidence: float = 0.95, unit: str = "item"
) -> Interval:
    """``R = mean(x) / mean(y)`` ± ``z · se(R)``, ``se(R) = sd(x_i - R·y_i) / (sqrt(n) · mean(y))`` (delta method
    for a ratio estimator; Cochran, *Sampling Techniques*, 1977, §6.3).

    Raises:
        TooFewItems: fewer than 2 pairs.
        ValueError: lengths differ, or ``mean(y)`` is 0.
    """
    _check_pairs(x, y, unit)
    n = len(x)
    my = sum(y) / n
    if my == 0:
        raise ValueError("mean of the baseline scores is 0: the ratio is undefined")
    r = (sum(x) / n) / my
    _, sd = _mean_sd([a - r * b for a, b in zip(x, y)])
    half = z_value(confidence) * sd / (math.sqrt(n) * my)
    return Interval(r, r - half, r + half, "paired delta method", n, unit)


def log_ratio_normal_interval(
    num: Sequence[float], den: Sequence[float], confidence: float = 0.95, unit: str = "item"
) -> Interval:
    """``sum(num) / sum(den)`` by :func:`ratio_normal_interval`: the log perplexity ratio with ``num_i = ll_base_i -
    ll_scheme_i`` (nats) and ``den_i`` the item's words.

    Raises:
        TooFewItems: fewer than 2 pairs.
        ValueError: lengths differ, or ``sum(den)`` is 0.
    """
    return ratio_normal_interval(num, den, confidence, unit)


def unpaired_interval(
    value: float, value_se: float, base: float, base_se: float, confidence: float = 0.95, n: int | None = None
) -> Interval:
    """``value - base`` ± ``z · sqrt(se1² + se2²)`` from two independent standard errors (Wasserman, *All of
    Statistics*, 2004, §3.3): the fallback without per-item results. ``n``: the items behind each stderr.

    Raises:
        TooFewItems: ``n`` is given and below 2.
    """
    if n is not None and n < MIN_ITEMS:
        raise TooFewItems(n)
    half = z_value(confidence) * math.hypot(value_se, base_se)
    delta = value - base
    return Interval(delta, delta - half, delta + half, "unpaired normal (stderrs)", n)


def unpaired_ratio_interval(
    value: float, value_se: float, base: float, base_se: float, confidence: float = 0.95, n: int | None = None
) -> Interval:
    """``R = value / base`` ± ``z · |R| · sqrt((se_v / v)² + (se_b / b)²)`` (delta method; Casella & Berger,
    *Statistical Inference*, 2002, §5.5.4).

    Raises:
        TooFewItems: ``n`` is given and below 2.
        ValueError: ``value`` or ``base`` is 0.
    """
    if n is not None and n < MIN_ITEMS:
        raise TooFewItems(n)
    if value == 0 or base == 0:
        raise ValueError("the delta method for a ratio needs non-zero value and base")
    r = value / base
    half = z_value(confidence) * abs(r) * math.hypot(value_se / value, base_se / base)
    return Interval(r, r - half, r + half, "unpaired delta method (stderrs)", n)


def mcnemar_exact(x: Sequence[float], y: Sequence[float]) -> tuple[int, int, float]:
    """Exact McNemar test of paired 0/1 outcomes (McNemar 1947; Fagerland, Lydersen & Laake 2013): ``b`` items the
    scheme gets right and the baseline wrong, ``c`` the reverse, p = ``scipy.stats.binomtest(b, b + c, 0.5)``'s
    two-sided p-value (1 without a discordant pair).

    Returns:
        ``(b, c, p_value)``.

    Raises:
        TooFewItems: fewer than 2 pairs.
        ValueError: lengths differ, or a score is not 0/1.
    """
    _check_pairs(x, y)
    b = c = 0
    for a, r in zip(x, y):
        if a not in (0, 1) or r not in (0, 1):
            raise ValueError(f"McNemar needs 0/1 outcomes, got {a!r} and {r!r}")
        b += a == 1 and r == 0
        c += a == 0 and r == 1
    if b + c == 0:
        return b, c, 1.0
    return b, c, float(sps.binomtest(b, b + c, 0.5).pvalue)


# --- paired bootstrap -------------------------------------------------------------------------------

StatFn = Callable[..., np.ndarray]  # scipy's vectorized statistic: stat(*columns, axis=-1)
_BATCH_CELLS = 2_000_000  # resampled values held at once per column (bounds scipy's index arrays)


def paired_bootstrap(
    columns: Sequence[Sequence[float]],
    stat: StatFn,
    *,
    samples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
    method: str = "paired bootstrap",
    unit: str = "item",
) -> Interval:
    """Percentile bootstrap of ``stat`` over rows (items) resampled with replacement: ``scipy.stats.bootstrap(
    columns, stat, paired=True, method="percentile")`` with ``numpy.random.default_rng(seed)``. Resamples where
    ``stat`` is not finite (a zero denominator) are left out of the percentiles (``numpy.quantile``, linear).

    Args:
        columns: k columns of n values (rows = items).
        stat: ``stat(*columns, axis=-1)``, vectorized; on the original columns it is the estimate.
        samples, seed, confidence: resamples B, the generator's seed, two-sided coverage.
        method, unit: the interval's name and what a row is.

    Raises:
        TooFewItems: fewer than 2 rows.
        ValueError: columns of unequal length.
    """
    n = len(columns[0])
    if any(len(c) != n for c in columns):
        raise ValueError("bootstrap columns must be of equal length")
    if n < MIN_ITEMS:
        raise TooFewItems(n, unit)
    data = tuple(np.asarray(c, dtype=float) for c in columns)
    estimate = float(stat(*data, axis=-1))
    with warnings.catch_warnings(), np.errstate(invalid="ignore"):
        warnings.simplefilter("ignore", sps.DegenerateDataWarning)
        res = sps.bootstrap(
            data,
            stat,
            n_resamples=samples,
            batch=max(1, min(samples, _BATCH_CELLS // n)),
            vectorized=True,
            paired=True,
            confidence_level=confidence,
            method="percentile",
            rng=np.random.default_rng(seed),
        )
    dist = np.asarray(res.bootstrap_distribution)
    finite = np.isfinite(dist)
    if finite.all():
        low, high = res.confidence_interval.low, res.confidence_interval.high
    else:
        alpha = 1.0 - confidence
        low, high = np.quantile(dist[finite], [alpha / 2, 1 - alpha / 2])
    return Interval(estimate, float(low), float(high), method, n, unit)


def _mean(d: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.asarray(d.mean(axis=axis))


def _ratio(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(x.sum(axis=axis) / y.sum(axis=axis))


def bootstrap_mean_diff(
    x: Sequence[float],
    y: Sequence[float],
    *,
    samples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
    unit: str = "item",
) -> Interval:
    """Paired bootstrap (:func:`paired_bootstrap`) of ``mean(x) - mean(y)`` over the differences ``x_i - y_i``.

    Raises:
        TooFewItems: fewer than 2 pairs.
        ValueError: lengths differ.
    """
    _check_pairs(x, y, unit)
    d = [float(a) - float(b) for a, b in zip(x, y)]
    return paired_bootstrap([d], _mean, samples=samples, seed=seed, confidence=confidence, unit=unit)


def bootstrap_ratio(
    x: Sequence[float],
    y: Sequence[float],
    *,
    samples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
    unit: str = "item",
    method: str = "paired bootstrap",
) -> Interval:
    """Paired bootstrap (:func:`paired_bootstrap`) of ``sum(x) / sum(y)``: a recovery / 100, a log perplexity
    ratio (``x = ll_base - ll_scheme``, ``y`` = words), a mean KLD over windows (``x`` = KLD sums, ``y`` = tokens).

    Raises:
        TooFewItems: fewer than 2 pairs.
        ValueError: lengths differ, or ``sum(y)`` is 0.
    """
    _check_pairs(x, y, unit)
    if sum(y) == 0:
        raise ValueError("sum of the denominators is 0: the ratio is undefined")
    return paired_bootstrap([x, y], _ratio, samples=samples, seed=seed, confidence=confidence, method=method, unit=unit)


WINDOW_METHODS = ("bootstrap", "normal")


def window_log_ratio_interval(
    nll_scheme: Sequence[float],
    nll_base: Sequence[float],
    n_tokens: Sequence[int],
    *,
    method: str = "bootstrap",
    samples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> Interval:
    """The log token-perplexity ratio ``sum(s_i - b_i) / sum(t_i)`` over windows (``s_i``, ``b_i``: summed NLL in
    nats of the scheme and the baseline over the window's ``t_i`` scored tokens), windows resampled:
    :func:`bootstrap_ratio` or, ``method="normal"``, :func:`log_ratio_normal_interval`. ``exp`` of the bounds is
    the perplexity ratio's interval; ``n`` = windows.

    Raises:
        TooFewItems: fewer than 2 windows.
        ValueError: lengths differ, no token scored, or an unknown ``method``.
    """
    if not len(nll_scheme) == len(nll_base) == len(n_tokens):
        raise ValueError(f"windows differ in number: {len(nll_scheme)}, {len(nll_base)}, {len(n_tokens)}")
    if method not in WINDOW_METHODS:
        raise ValueError(f"method={method!r}: allowed {', '.join(WINDOW_METHODS)}")
    num = [float(s) - float(b) for s, b in zip(nll_scheme, nll_base)]
    den = [float(t) for t in n_tokens]
    if method == "normal":
        iv = log_ratio_normal_interval(num, den, confidence, unit="window")
        name = "paired delta method on the log perplexity ratio (per-window NLL differences)"
    else:
        iv = bootstrap_ratio(num, den, samples=samples, seed=seed, confidence=confidence, unit="window")
        name = "paired bootstrap of the log perplexity ratio (per-window NLL differences)"
    return Interval(iv.estimate, iv.low, iv.high, name, iv.n, "window")


# --- Student's t: speed ratios paired by repeat -----------------------------------------------------------


def t_interval(values: Sequence[float], confidence: float = 0.95, unit: str = "item") -> Interval:
    """Student's t interval of the mean (Student 1908): ``mean ± t_{(1+confidence)/2, n-1} · s / sqrt(n)``
    (``scipy.stats.t.interval``); zero spread gives the zero-width interval at the mean.

    Raises:
        TooFewItems: fewer than 2 values.
    """
    if len(values) < MIN_ITEMS:
        raise TooFewItems(len(values), unit)
    mean, sd = _mean_sd(values)
    n = len(values)
    if sd == 0:
        return Interval(mean, mean, mean, "Student's t", n, unit)
    low, high = sps.t.interval(confidence, n - 1, loc=mean, scale=sd / math.sqrt(n))
    return Interval(mean, float(low), float(high), "Student's t", n, unit)


def paired_ratio(
    points: Sequence[SweepPoint | Mapping[str, Any]],
    baseline_points: Sequence[SweepPoint | Mapping[str, Any]],
    metric: str = "output_tok_s",
    mode: str = "concurrency",
    higher_is_better: bool = True,
    confidence: float = 0.95,
) -> list[dict[str, Any]]:
    """Per load level, a scheme's ``metric`` over the baseline's, repeat ``r`` paired with repeat ``r`` (valid
    points only, :func:`quantverdict.measure.validity.point_valid`): the geometric mean ratio and
    ``exp(`` :func:`t_interval` ``)`` of the log ratios.

    Points from more than one server start (``server_start`` > 1 on either side) are paired by start instead: each
    start's mean over its valid repeats, start ``s`` with the baseline's start ``s``, so the interval holds the
    between-start variance (analysis of summary measures, Matthews et al. 1990, BMJ 300:230; the unit is then
    ``server start``, as :func:`quantverdict.measure.starts.start_ratios`).

    Args:
        points, baseline_points: sweep points as recorded (``repeat``, load keys, ``metric``).
        metric: a point key, e.g. ``output_tok_s``.
        mode: ``rate`` or ``concurrency`` (what keys a level).
        higher_is_better: False for a latency (a ratio below 1 is then faster).

    Returns:
        By load: ``{"load", "pairs", "ratios", "ratio", "low", "high" (None under 2 pairs), "verdict"}``, verdict
        ``faster``, ``slower`` or ``no difference established``.
    """

    mine_pts, base_pts = [as_point(p) for p in points], [as_point(p) for p in baseline_points]
    by_start = any((p.server_start or 1) > 1 for p in [*mine_pts, *base_pts])
    unit = "server start" if by_start else "repeat"

    def by_key(ps: list[SweepPoint]) -> dict[tuple[float, int], float]:
        groups: dict[tuple[float, int], list[float]] = {}
        for p in ps:
            v = p.number(metric)
            if point_valid(p) and v is not None and v > 0:
                key = (p.server_start or 1) if by_start else (p.repeat or 0)
                groups.setdefault((p.load(mode), key), []).append(v)
        return {k: math.fsum(vs) / len(vs) for k, vs in groups.items()}

    mine, base = by_key(mine_pts), by_key(base_pts)
    result = []
    for load in sorted({k[0] for k in mine} | {k[0] for k in base}):
        reps = sorted(r for (ld, r) in mine if ld == load and (ld, r) in base)
        ratios = [mine[(load, r)] / base[(load, r)] for r in reps]
        entry: dict[str, Any] = {"load": load, "pairs": len(ratios), "ratios": ratios, "ratio": None}
        entry.update(low=None, high=None, verdict="no difference established")
        logs = np.log(np.asarray(ratios, dtype=float))
        if ratios:
            entry["ratio"] = float(np.exp(logs.mean()))
        if len(ratios) >= MIN_ITEMS:
            iv = t_interval(logs.tolist(), confidence, unit=unit)
            low, high = float(np.exp(iv.low)), float(np.exp(iv.high))
            entry.update(low=low, high=high)
            better = low > 1 if higher_is_better else high < 1
            worse = high < 1 if higher_is_better else low > 1
            entry["verdict"] = "faster" if better else "slower" if worse else "no difference established"
        result.append(entry)
    return result
