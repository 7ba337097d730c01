"""Intervals and paired tests for accuracy deltas between a scheme and its baseline (pure functions).

Every accuracy number in the review is a comparison of two models on the *same* items, so the
intervals here are paired: they resample items (documents, questions), not the two scores
independently. Two interval methods are offered:

* ``normal``: the normal approximation of the paired difference, ``mean(d) ± z · sd(d)/sqrt(n)``,
  and the delta method for ratios (recovery %, perplexity ratio); worked out by hand in the tests;
* ``bootstrap``: the paired percentile bootstrap (Efron & Tibshirani 1993, ch. 13) with a fixed
  seed: ``scipy.stats.bootstrap(paired=True, method="percentile")``, which resamples item indices
  with replacement.

The exact McNemar test (McNemar 1947; exact binomial form, e.g. Fagerland et al. 2013) on the
discordant pairs (``scipy.stats.binomtest``) is reported next to binary metrics. When per-item results
are missing the review falls back to :func:`unpaired_interval` from the two standard errors (and says
so). Speed ratios paired by repeat (:func:`paired_ratio`) get Student's t interval on the log ratios
(:func:`t_interval`, quantiles from ``scipy.stats.t``).

scipy.stats provides the quantiles, the bootstrap and the binomial test; what is written out here (the
delta-method standard errors of a ratio, the standard error of a difference of independent estimates)
names its source in its docstring.

Never an interval from fewer than :data:`MIN_ITEMS` (2) independent items: every interval and test here
raises :class:`TooFewItems` (a ``ValueError`` whose message says ``n`` and why, e.g. "n=1 document: no
interval ...") instead; a bootstrap over one item resamples the same row and returns a zero-width interval
that looks significant. Every :class:`Interval` carries its ``n``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

from quantverdict.measure.sweep_plan import load_of
from quantverdict.measure.validity import point_valid


def z_value(confidence: float) -> float:
    """Two-sided standard-normal quantile ``Φ⁻¹((1 + confidence) / 2)`` (``scipy.stats.norm.ppf``): 1.959964 for
    ``confidence=0.95``.

    Raises:
        ValueError: ``confidence`` is not in (0, 1).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence} must be in (0, 1)")
    return float(sps.norm.ppf(0.5 + confidence / 2.0))


MIN_ITEMS = 2  # fewer independent items: no interval and no significance test


def too_few(n: int, unit: str = "item") -> str | None:
    """Why ``n`` independent ``unit``s give no interval, or None when there are enough (``n >= MIN_ITEMS``).

    Example: ``too_few(1, "document")`` -> ``"n=1 document: no interval and no significance test (they need
    at least 2 independent documents)"``.
    """
    if n >= MIN_ITEMS:
        return None
    return (
        f"n={n} {unit}{'' if n == 1 else 's'}: no interval and no significance test "
        f"(they need at least {MIN_ITEMS} independent {unit}s)"
    )


class TooFewItems(ValueError):
    """Fewer than :data:`MIN_ITEMS` independent items: no interval, no test. The message is :func:`too_few`'s."""

    def __init__(self, n: int, unit: str = "item") -> None:
        super().__init__(too_few(n, unit))
        self.n = n
        self.unit = unit


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided interval, how it was obtained and over how many independent items."""

    estimate: float
    low: float
    high: float
    method: str  # "paired normal", "paired bootstrap", "unpaired normal", "delta method", ...
    n: int | None = None  # independent items (documents, questions, windows); None: not known (stderrs)
    unit: str = "item"

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def excludes_zero(self) -> bool:
        return not self.contains(0.0)

    def describe(self) -> str:
        """The method and n, as the review shows them: ``paired bootstrap, n=100``, ``... over 2 windows``."""
        if self.n is None:
            return self.method
        return f"{self.method}, n={self.n}" if self.unit == "item" else f"{self.method} over {self.n} {self.unit}s"


def significant(iv: Interval | None) -> bool | None:
    """True when ``iv`` excludes 0; None without an interval or from fewer than :data:`MIN_ITEMS` items."""
    if iv is None or (iv.n is not None and iv.n < MIN_ITEMS):
        return None
    return iv.excludes_zero()


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1 in the denominator) of at least 2 values."""
    a = np.asarray(values, dtype=float)
    return float(a.mean()), float(a.std(ddof=1))


def paired_normal_interval(x: Sequence[float], y: Sequence[float], confidence: float = 0.95) -> Interval:
    """Interval of ``mean(x) - mean(y)`` from the paired differences ``d_i = x_i - y_i``.

    ``se = sd(d) / sqrt(n)`` with the sample standard deviation (n - 1 in the denominator), the interval
    ``mean(d) ± z · se`` (:func:`z_value`).

    Args:
        x: per-item scores of the scheme, length n (e.g. 0/1 ``acc_norm``).
        y: per-item scores of the baseline on the same items, in the same order.
        confidence: two-sided coverage, 0.95 for a 95% interval.

    Raises:
        TooFewItems: fewer than 2 pairs.
        ValueError: ``x`` and ``y`` differ in length.
    """
    _check_pairs(x, y)
    d = [a - b for a, b in zip(x, y)]
    mean, sd = _mean_sd(d)
    half = z_value(confidence) * sd / math.sqrt(len(d))
    return Interval(mean, mean - half, mean + half, "paired normal", len(d))


def ratio_normal_interval(
    x: Sequence[float], y: Sequence[float], confidence: float = 0.95, unit: str = "item"
) -> Interval:
    """Interval of ``R = mean(x) / mean(y)`` for paired items, by the delta method.

    ``se(R) = sd(x_i - R·y_i) / (sqrt(n) · mean(y))`` (the ratio estimator's linearization; Cochran,
    *Sampling Techniques*, 1977, §6.3). Multiply by 100 for recovery %.

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
    """Interval of ``L = sum(num) / sum(den)`` for per-item pairs (a ratio estimator).

    Used for the change of a perplexity: with per-document log-likelihoods ``ll`` and word counts
    ``w``, ``log(ppl_scheme / ppl_base) = sum(ll_base_i - ll_scheme_i) / sum(w_i)``, so ``num_i =
    ll_base_i - ll_scheme_i`` and ``den_i = w_i``. ``se(L) = sd(num_i - L·den_i) / (sqrt(n) ·
    mean(den))`` (delta method, as in :func:`ratio_normal_interval`).

    Raises:
        TooFewItems: fewer than 2 pairs.
        ValueError: lengths differ, or ``sum(den)`` is 0.
    """
    return ratio_normal_interval(num, den, confidence, unit)


def unpaired_interval(
    value: float,
    value_se: float,
    base: float,
    base_se: float,
    confidence: float = 0.95,
    n: int | None = None,
) -> Interval:
    """Interval of ``value - base`` from two independent standard errors: ``se = sqrt(se1² + se2²)`` (the
    variance of a difference of independent estimates is the sum of their variances; e.g. Wasserman, *All of
    Statistics*, 2004, §3.3), ``delta ± z · se``.

    The fallback when per-item results are missing; wider than the paired interval when the two
    models agree on most items (it ignores their positive correlation). ``n``: the items each stderr
    came from, when known (stated with the interval).

    Raises:
        TooFewItems: ``n`` is given and below 2.
    """
    if n is not None and n < MIN_ITEMS:
        raise TooFewItems(n)
    se = math.hypot(value_se, base_se)
    half = z_value(confidence) * se
    delta = value - base
    return Interval(delta, delta - half, delta + half, "unpaired normal (stderrs)", n)


def unpaired_ratio_interval(
    value: float, value_se: float, base: float, base_se: float, confidence: float = 0.95, n: int | None = None
) -> Interval:
    """Interval of ``value / base`` from two independent standard errors, by the delta method (e.g. Casella &
    Berger, *Statistical Inference*, 2002, §5.5.4): ``se(R) = |R| · sqrt((se_v / v)² + (se_b / b)²)``,
    ``R ± z · se(R)``.

    Raises:
        TooFewItems: ``n`` is given and below 2.
        ValueError: ``value`` or ``base`` is 0.
    """
    if n is not None and n < MIN_ITEMS:
        raise TooFewItems(n)
    if value == 0 or base == 0:
        raise ValueError("the delta method for a ratio needs non-zero value and base")
    r = value / base
    se = abs(r) * math.hypot(value_se / value, base_se / base)
    half = z_value(confidence) * se
    return Interval(r, r - half, r + half, "unpaired delta method (stderrs)", n)


def mcnemar_exact(x: Sequence[float], y: Sequence[float]) -> tuple[int, int, float]:
    """Exact McNemar test of paired 0/1 outcomes (McNemar 1947; the exact conditional form, Fagerland,
    Lydersen & Laake 2013, BMC Med Res Methodol 13:91).

    ``b`` = items the scheme gets right and the baseline wrong, ``c`` = the reverse. Under the null
    hypothesis (same accuracy) ``b ~ Binomial(b + c, 1/2)``; the p-value is the two-sided exact binomial
    test's, ``scipy.stats.binomtest(b, b + c, 0.5).pvalue`` (for p = 1/2: ``min(1, 2 · P(X <= min(b, c)))``),
    and 1 when there is no discordant pair.

    Returns:
        ``(b, c, p_value)``; the test's n is the number of pairs ``len(x)`` (``b + c`` of them discordant).

    Raises:
        TooFewItems: fewer than 2 pairs.
        ValueError: lengths differ, or a score is not 0/1.
    """
    _check_pairs(x, y)
    b = c = 0
    for a, r in zip(x, y):
        if a not in (0, 1) or r not in (0, 1):
            raise ValueError(f"McNemar needs 0/1 outcomes, got {a!r} and {r!r}")
        if a == 1 and r == 0:
            b += 1
        elif a == 0 and r == 1:
            c += 1
    if b + c == 0:
        return b, c, 1.0
    return b, c, float(sps.binomtest(b, b + c, 0.5).pvalue)


# --- paired bootstrap -------------------------------------------------------------------------------

# scipy.stats.bootstrap's signature for a vectorized statistic: ``stat(*columns, axis=-1)``, each column of
# shape (..., n) -> one value per leading index
StatFn = Callable[..., np.ndarray]

# resampled values held at once (per column): bounds the memory of scipy's index arrays for large n
_BATCH_CELLS = 2_000_000


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
    """Percentile bootstrap of a statistic of per-item rows, resampling whole items (rows) with replacement
    (Efron & Tibshirani 1993, ch. 13): ``scipy.stats.bootstrap(columns, stat, paired=True,
    method="percentile")``.

    A resample on which ``stat`` is not finite (a ratio whose resampled denominator is 0) is left out and the
    percentiles are taken over the others (``numpy.quantile``, the same linear interpolation as scipy's).

    Args:
        columns: k columns of n values each (e.g. ``[x, y]``).
        stat: ``stat(*columns, axis=-1) -> values``, vectorized over the leading axes (scipy's convention);
            ``stat`` of the original columns is the point estimate.
        samples: number of bootstrap resamples B.
        seed: seed of numpy's default generator (PCG64) handed to scipy; the same inputs and seed give the
            same interval.
        confidence: two-sided coverage.
        method: the name the interval carries.
        unit: what one row is (``item``, ``document``, ``window``), for the message and :meth:`Interval.describe`.

    Returns:
        The point estimate (``stat`` on the original data), the percentile interval and n (rows).

    Raises:
        TooFewItems: fewer than 2 rows (every resample would be the one row: a zero-width "interval").
        ValueError: columns of unequal length.
    """
    n = len(columns[0])
    if any(len(c) != n for c in columns):
        raise ValueError("bootstrap columns must be of equal length")
    if n < MIN_ITEMS:
        raise TooFewItems(n, unit)
    data = tuple(np.asarray(c, dtype=float) for c in columns)
    estimate = float(stat(*data, axis=-1))
    # a non-finite resample (NaN percentile, inf in scipy's standard error) is handled below
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
    """Paired bootstrap interval of ``mean(x) - mean(y)`` (see :func:`paired_bootstrap`): the paired differences
    ``d_i = x_i - y_i`` are resampled, which is resampling the pairs.

    Raises:
        TooFewItems: fewer than 2 pairs.
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
) -> Interval:
    """Paired bootstrap interval of ``sum(x) / sum(y)`` (= ``mean(x) / mean(y)``): recovery / 100,
    or the log perplexity ratio with ``x = ll_base - ll_scheme`` and ``y = words``.

    Raises:
        TooFewItems: fewer than 2 pairs.
        ValueError: lengths differ, or ``sum(y)`` is 0.
    """
    _check_pairs(x, y, unit)
    if sum(y) == 0:
        raise ValueError("sum of the denominators is 0: the ratio is undefined")
    return paired_bootstrap([x, y], _ratio, samples=samples, seed=seed, confidence=confidence, unit=unit)


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
    """Paired interval of the log token-perplexity ratio over the evaluation windows.

    With per-window summed NLL (nats) ``s_i`` of the scheme and ``b_i`` of the baseline over the same
    ``t_i`` scored tokens, ``log(ppl_scheme / ppl_base) = sum(s_i - b_i) / sum(t_i)``: the mean per-token
    NLL difference, a ratio estimator over windows (Cochran 1977, §6.3), so the windows are the resampled
    units: ``method="bootstrap"`` (:func:`bootstrap_ratio`) or ``"normal"`` (delta method,
    :func:`log_ratio_normal_interval`). ``exp`` of the bounds is the perplexity ratio's interval.

    Args:
        nll_scheme: summed NLL per window, nats, window order, length n.
        nll_base: the baseline's, same windows and order.
        n_tokens: scored tokens per window (the same for both runs: same text, tokenizer and windows).
        method: ``bootstrap`` or ``normal``.
        samples, seed, confidence: as :func:`paired_bootstrap`.

    Returns:
        The interval of the log ratio (nats per token), ``n`` = windows, ``unit="window"``.

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
    """Student's t interval of the mean of ``values`` (Student, "The probable error of a mean", Biometrika 6,
    1908): ``mean ± t_{(1+confidence)/2, n-1} · s / sqrt(n)`` with the sample standard deviation ``s`` (n - 1 in
    the denominator), by ``scipy.stats.t.interval``; zero spread gives the zero-width interval at the mean.

    E.g. values 1 and 3: mean 2, s = sqrt(2), se = 1, t_{0.975, 1} = 12.706205: [-10.706205, 14.706205].

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
    points: list[dict[str, Any]],
    baseline_points: list[dict[str, Any]],
    metric: str = "output_tok_s",
    mode: str = "concurrency",
    higher_is_better: bool = True,
    confidence: float = 0.95,
) -> list[dict[str, Any]]:
    """Per load level, the ratio of a scheme's ``metric`` to the baseline's, paired by repeat index, with a
    Student's t interval and what it establishes.

    Repeat ``r`` of a scheme is paired with repeat ``r`` of the baseline at the same load (same seed, same
    machine, the same position in the sweep), valid points only (:func:`quantverdict.measure.validity.point_valid`).
    On the log ratios ``d_r = ln(x_r / b_r)``: mean ``m``, sample standard deviation ``s``, ``n`` pairs; the
    interval is ``exp(m -+ t_{(1+confidence)/2, n-1} s / sqrt(n))`` (:func:`t_interval` on the logs, so a ratio
    and its inverse get mirrored intervals). One pair gives a ratio without an interval.

    Args:
        points: the scheme's parsed points (``repeat``, load keys, ``metric``).
        baseline_points: the baseline's, from the same plan.
        metric: a point key, e.g. ``output_tok_s`` or ``throughput_tok_s``.
        mode: ``rate`` or ``concurrency`` (the load a level is keyed by).
        higher_is_better: True for throughputs; False for latencies (a ratio below 1 is then "faster").
        confidence: two-sided coverage of the interval.

    Returns:
        Sorted by load: ``{"load", "pairs", "ratios" (by repeat), "ratio" (geometric mean), "low", "high"
        (None under 2 pairs), "verdict"}``; verdict ``faster``, ``slower`` or ``no difference established``
        (the interval holds 1, or fewer than 2 pairs).

    E.g. ratios 1.20, 1.25, 1.22 (n=3): m = 0.2014, s = 0.0205, t_{0.975, 2} = 4.3027: interval 1.162-1.287,
    faster.
    """

    def by_key(ps: list[dict[str, Any]]) -> dict[tuple[float, int], float]:
        out: dict[tuple[float, int], float] = {}
        for p in ps:
            v = p.get(metric)
            if point_valid(p) and isinstance(v, (int, float)) and v > 0:
                out[(load_of(p, mode), int(p.get("repeat") or 0))] = float(v)
        return out

    mine, base = by_key(points), by_key(baseline_points)
    loads = sorted({k[0] for k in mine} | {k[0] for k in base})
    result = []
    for load in loads:
        reps = sorted(r for (ld, r) in mine if ld == load and (ld, r) in base)
        ratios = [mine[(load, r)] / base[(load, r)] for r in reps]
        entry: dict[str, Any] = {"load": load, "pairs": len(ratios), "ratios": ratios, "ratio": None}
        entry.update(low=None, high=None, verdict="no difference established")
        logs = np.log(np.asarray(ratios, dtype=float))
        if ratios:
            entry["ratio"] = float(np.exp(logs.mean()))
        if len(ratios) >= MIN_ITEMS:
            iv = t_interval(logs.tolist(), confidence, unit="repeat")
            low, high = float(np.exp(iv.low)), float(np.exp(iv.high))
            entry.update(low=low, high=high)
            better = low > 1 if higher_is_better else high < 1
            worse = high < 1 if higher_is_better else low > 1
            entry["verdict"] = "faster" if better else "slower" if worse else "no difference established"
        result.append(entry)
    return result


def _check_pairs(x: Sequence[float], y: Sequence[float], unit: str = "item") -> None:
    if len(x) != len(y):
        raise ValueError(f"paired samples differ in length: {len(x)} vs {len(y)}")
    if len(x) < MIN_ITEMS:
        raise TooFewItems(len(x), unit)
