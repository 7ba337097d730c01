"""KL divergence of a scheme's next-token distributions to its baseline's, per token and over windows.

Pure numpy: the evaluate child computes log-probabilities (hf backend: the full vocabulary; server backend:
vLLM ``prompt_logprobs`` top-k) and hands them here. The statistics are those of llama.cpp's
``llama-perplexity --kl-divergence`` (ggml-org/llama.cpp, ``tools/perplexity/perplexity.cpp``, read at commit
050fc7f3: the ``log_softmax(..., kl_divergence_result &)`` overload per token, ``kl_divergence()`` for the
summary):

* ``KLD = sum_v P(v) (ln P(v) - ln Q(v))`` per scored token, P the baseline, Q the scheme, natural log (nats);
* "Same top p": the share of tokens whose most likely next token (argmax, first index on ties) is the same
  under P and Q -- here ``top1_agreement_pct``;
* ``Δp = Q(correct) - P(correct)``, the change of the probability of the token that actually follows;
  "RMS Δp" is ``sqrt(mean(Δp²))``, reported in percent;
* mean, median, 99th percentile and maximum of the per-token KLD; llama.cpp's percentile interpolates
  linearly at ``fraction * (n - 1)`` of the sorted values, which is ``numpy.percentile(method="linear")``
  (Hyndman & Fan type 7), used here.

Deliberate differences from llama.cpp: (1) llama.cpp stores the baseline's
log-probabilities as 16-bit codes floored at ``max - 16`` and skips terms with ``ln P <= -16``; here the full
form sums every term in float64 and the compact form is the top-k one of :class:`TopK`, whose KLD is a lower
bound (:func:`topk_token_stats`); (2) the windows are the project's (``measure.perplexity.window_plan``), not
llama.cpp's "score the second half of each chunk"; (3) llama.cpp's ``±`` is the per-token standard error
(tokens treated as independent); here the interval is over windows (:func:`summarize`), because tokens of
one window share their context and are not independent; (4) llama.cpp prints no summary under 100 tokens;
here any number of tokens is summarized and ``n_tokens`` is part of the result.

Wiring: hf backend -- per window, ``token_stats(base_lp, scheme_lp, targets)`` from full log-probabilities, or,
with a top-k baseline cache, ``topk_token_stats(cached, scheme_at_ids(scheme_lp, cached.ids, targets))``;
server backend -- ``topk_token_stats(base_topk, scheme_topk)`` from both sides' ``prompt_logprobs``; then
``summarize(per_window).to_dict()``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from quantverdict.measure import stats

__all__ = [
    "KldSummary",
    "TokenStats",
    "TopK",
    "concat_token_stats",
    "scheme_at_ids",
    "summarize",
    "token_stats",
    "topk_from_full",
    "topk_kld_bounds",
    "topk_token_stats",
]

NORM_TOL = 1e-3  # |ln sum_v exp(logprob_v)| allowed for a row of "log-probabilities" (catches raw logits)
MIN_REST_MASS = 1e-7  # floor of a scheme rest mass derived as 1 - sum (float32 log-probs: ~1e-7 rounding)
PERCENTILE_METHOD: Final = "linear"  # numpy.percentile method; = llama.cpp's percentile lambda


@dataclass(frozen=True)
class TokenStats:
    """Per-token comparison of a scheme with its baseline over one window (or any run of scored tokens).

    All arrays have shape ``[n_tokens]``, float64 unless stated.

    Attributes:
        kld: KL(P_baseline ‖ P_scheme) per token, nats. Exact from :func:`token_stats`; a lower bound from
            :func:`topk_token_stats`. Rounding can leave values of about ``-1e-12`` for identical rows; they
            are kept, not clamped (llama.cpp prints its negative minimum too).
        top1_agree: bool, the baseline's and the scheme's most likely next token are the same.
        p_base_correct: probability of the target token under the baseline, in [0, 1].
        p_scheme_correct: probability of the target token under the scheme, in [0, 1].
        kld_exact: True when ``kld`` is the full-vocabulary KL, False when it is the top-k lower bound.
        top_k: the baseline's k for the top-k form, None for the full form.
    """

    kld: np.ndarray
    top1_agree: np.ndarray
    p_base_correct: np.ndarray
    p_scheme_correct: np.ndarray
    kld_exact: bool = True
    top_k: int | None = None

    def __post_init__(self) -> None:
        n = len(self.kld)
        for name in ("top1_agree", "p_base_correct", "p_scheme_correct"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"TokenStats.{name} has {len(getattr(self, name))} values, kld has {n}")

    @property
    def n_tokens(self) -> int:
        """Number of scored tokens."""
        return len(self.kld)

    @property
    def delta_p(self) -> np.ndarray:
        """``Δp = p_scheme(correct) - p_baseline(correct)`` per token, ``[n_tokens]`` (llama.cpp's ``p - p_base``)."""
        return np.asarray(self.p_scheme_correct - self.p_base_correct, dtype=np.float64)


def concat_token_stats(parts: Sequence[TokenStats]) -> TokenStats:
    """Join per-token results computed in row chunks (to bound memory) into one window's :class:`TokenStats`.

    Raises:
        ValueError: no parts, or parts of different forms (``kld_exact``, ``top_k``).
    """
    if not parts:
        raise ValueError("concat_token_stats: no parts")
    forms = {(p.kld_exact, p.top_k) for p in parts}
    if len(forms) > 1:
        raise ValueError(f"concat_token_stats: parts mix forms (kld_exact, top_k): {sorted(forms, key=str)}")
    return TokenStats(
        kld=np.concatenate([np.asarray(p.kld, dtype=np.float64) for p in parts]),
        top1_agree=np.concatenate([np.asarray(p.top1_agree, dtype=bool) for p in parts]),
        p_base_correct=np.concatenate([np.asarray(p.p_base_correct, dtype=np.float64) for p in parts]),
        p_scheme_correct=np.concatenate([np.asarray(p.p_scheme_correct, dtype=np.float64) for p in parts]),
        kld_exact=parts[0].kld_exact,
        top_k=parts[0].top_k,
    )


@dataclass(frozen=True)
class TopK:
    """A compact form of next-token log-probabilities: the top-k ids and what is needed beside them.

    What is stored, per scored token (``n`` rows, natural log, float64 or a compact float dtype):

    * ``ids`` ``[n, k]`` int: distinct token ids per row (any order). For a baseline: its k most likely
      tokens. For a scheme: either its own top-k (server backend) or the baseline's ids plus one column
      holding the scheme's own most likely token outside them (:func:`scheme_at_ids`, hf backend). The
      row's argmax over these columns must be the distribution's argmax over the whole vocabulary
      (true for both forms), so that top-1 agreement is exact.
    * ``logprobs`` ``[n, k]``: ``ln p`` at ``ids``.
    * ``rest_logprob`` ``[n]`` or None: ``ln`` of the mass outside ``ids`` (``logsumexp`` of the other
      log-probabilities, ``-inf`` when ``ids`` cover the vocabulary). None when not known (vLLM returns
      no rest mass): it is then derived as ``1 - sum(exp(logprobs))``.
    * ``target_logprob`` ``[n]``: ``ln p`` of the token that actually follows (vLLM's prompt log-probs
      always include it, whether or not it is in the top-k).

    A baseline cache stores these four arrays and ``k``: ``n · (k ids + k log-probs + 2 floats)`` against
    ``n · vocab`` floats for the full form. vLLM may answer ``k + 1`` entries (the prompt token added when it
    is not in the top-k); any set of distinct ids keeps :func:`topk_token_stats` a lower bound, but
    :func:`topk_kld_bounds`'s upper bound needs the baseline's columns to be exactly its top-k.

    Raises:
        ValueError: inconsistent shapes or a row with a repeated id.
    """

    ids: np.ndarray
    logprobs: np.ndarray
    target_logprob: np.ndarray
    rest_logprob: np.ndarray | None = None

    def __post_init__(self) -> None:
        ids = np.asarray(self.ids)
        lp = np.asarray(self.logprobs)
        if ids.ndim != 2 or ids.shape != lp.shape or ids.shape[1] < 1:
            raise ValueError(f"TopK: ids {ids.shape} and logprobs {lp.shape} must both be [n, k] with k >= 1")
        n = ids.shape[0]
        if np.asarray(self.target_logprob).shape != (n,):
            raise ValueError(f"TopK: target_logprob must be [{n}], got {np.asarray(self.target_logprob).shape}")
        if self.rest_logprob is not None and np.asarray(self.rest_logprob).shape != (n,):
            raise ValueError(f"TopK: rest_logprob must be [{n}], got {np.asarray(self.rest_logprob).shape}")
        srt = np.sort(ids, axis=1)
        if np.any(srt[:, 1:] == srt[:, :-1]):
            raise ValueError("TopK: a row repeats a token id")

    @property
    def k(self) -> int:
        """Number of columns."""
        return int(np.asarray(self.ids).shape[1])


def _logsumexp(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """``ln sum exp(x)`` along ``axis``, shifted by the maximum; ``-inf`` for an all ``-inf`` row."""
    m = np.max(x, axis=axis, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(x - m_safe), axis=axis, keepdims=True)) + m_safe
    return np.asarray(np.squeeze(out, axis=axis), dtype=np.float64)


def _check_full(name: str, logprobs: np.ndarray, norm_tol: float, renormalize: bool = False) -> np.ndarray:
    lp = np.asarray(logprobs, dtype=np.float64)
    if lp.ndim != 2 or lp.shape[1] < 1:
        raise ValueError(f"{name}: expected [n_tokens, vocab] log-probabilities, got shape {lp.shape}")
    if np.any(np.isnan(lp)) or np.any(lp == np.inf):
        raise ValueError(f"{name}: NaN or +inf in the log-probabilities")
    if renormalize and lp.shape[0]:
        lp = lp - _logsumexp(lp)[:, None]
    worst = float(np.max(np.abs(_logsumexp(lp)))) if lp.shape[0] else 0.0
    if worst > norm_tol:
        raise ValueError(
            f"{name}: rows are not log-probabilities (|ln sum exp| up to {worst:.3g} > {norm_tol:g}); "
            "apply log_softmax to the logits first"
        )
    return lp


def _check_targets(target_ids: np.ndarray, n: int, vocab: int) -> np.ndarray:
    t = np.asarray(target_ids)
    if t.shape != (n,) or not np.issubdtype(t.dtype, np.integer):
        raise ValueError(f"target_ids must be [{n}] integers, got shape {t.shape} dtype {t.dtype}")
    if n and (t.min() < 0 or t.max() >= vocab):
        raise ValueError(f"target_ids must be in 0..{vocab - 1}")
    return t.astype(np.int64)


def token_stats(
    base_logprobs: np.ndarray,
    scheme_logprobs: np.ndarray,
    target_ids: np.ndarray,
    *,
    norm_tol: float = NORM_TOL,
    renormalize: bool = False,
) -> TokenStats:
    """Exact per-token KLD, top-1 agreement and probabilities of the correct token, full vocabulary.

    ``kld[t] = sum_v P[t,v] (ln P[t,v] - ln Q[t,v])`` (terms with ``P = 0`` are 0; ``P > 0 = Q`` gives
    ``+inf``); ``top1_agree[t] = argmax P[t] == argmax Q[t]``; ``p_*_correct[t] = exp(ln ·[t, target[t]])``.
    Computed in float64 whatever the input dtype (a float16/bfloat16 cache is upcast first). Memory: about
    four float64 copies of ``[n_tokens, vocab]`` (2.5 GB for 512 tokens of a 152k vocabulary): call it on row
    chunks and join them with :func:`concat_token_stats`.

    Args:
        base_logprobs: baseline log-probabilities (``log_softmax`` of the logits), ``[n_tokens, vocab]``, nats.
        scheme_logprobs: the scheme's, same shape and same scored positions.
        target_ids: the token that follows each position, ``[n_tokens]`` ints in ``0..vocab-1``.
        norm_tol: largest allowed ``|ln sum_v exp(row)|`` per row.
        renormalize: subtract each row's ``logsumexp`` (in float64) before use: for a baseline cached in
            float16/bfloat16, whose rounding leaves rows off by more than ``norm_tol``. Raw logits would pass
            too, so the caller sets it only for its own cache.

    Returns:
        :class:`TokenStats` with ``kld_exact=True``.

    Raises:
        ValueError: shapes differ, NaN/+inf, a row that is not normalized (raw logits), bad target ids.
    """
    p = _check_full("base_logprobs", base_logprobs, norm_tol, renormalize)
    q = _check_full("scheme_logprobs", scheme_logprobs, norm_tol, renormalize)
    if p.shape != q.shape:
        raise ValueError(f"base_logprobs {p.shape} and scheme_logprobs {q.shape} differ in shape")
    n, vocab = p.shape
    t = _check_targets(target_ids, n, vocab)
    pp = np.exp(p)
    with np.errstate(invalid="ignore"):
        terms = np.where(pp > 0, pp * (p - q), 0.0)
    kld = np.sum(terms, axis=1)
    rows = np.arange(n)
    return TokenStats(
        kld=kld,
        top1_agree=np.argmax(p, axis=1) == np.argmax(q, axis=1),
        p_base_correct=pp[rows, t],
        p_scheme_correct=np.exp(q[rows, t]),
        kld_exact=True,
        top_k=None,
    )


def topk_from_full(logprobs: np.ndarray, k: int, target_ids: np.ndarray, *, norm_tol: float = NORM_TOL) -> TopK:
    """The baseline's compact form from its full log-probabilities (what the hf backend caches).

    Keeps the k largest log-probabilities per row (ties: the lower id first), the ``ln`` of the mass of
    all other tokens (``logsumexp`` over them, exact rather than ``1 - sum``), and the target's log-prob.
    Storage per token: ``k`` ids + ``k`` log-probs + 2 floats, against ``vocab`` floats for the full form.

    Args:
        logprobs: ``[n_tokens, vocab]`` log-probabilities, nats.
        k: number of tokens kept, ``1 <= k <= vocab``.
        target_ids: ``[n_tokens]`` ints.
        norm_tol: as in :func:`token_stats`.

    Returns:
        :class:`TopK` with ``ids``/``logprobs`` sorted by decreasing probability and ``rest_logprob`` set.

    Raises:
        ValueError: bad shapes, k out of range, rows that are not log-probabilities.
    """
    lp = _check_full("logprobs", logprobs, norm_tol)
    n, vocab = lp.shape
    if not 1 <= k <= vocab:
        raise ValueError(f"k={k} must be in 1..vocab ({vocab})")
    t = _check_targets(target_ids, n, vocab)
    order = _top_k_ids(lp, k)
    top = np.take_along_axis(lp, order, axis=1)
    rest = lp.copy()
    np.put_along_axis(rest, order, -np.inf, axis=1)
    return TopK(ids=order, logprobs=top, target_logprob=lp[np.arange(n), t], rest_logprob=_logsumexp(rest))


def _top_k_ids(lp: np.ndarray, k: int) -> np.ndarray:
    """Per row, the ids of the k largest values sorted by decreasing value, ties by lower id first: the
    first k columns of ``np.argsort(-lp, kind="stable")``, found with a partition in O(n · vocab) instead of a
    full sort (a 256 × 49,152 block: 2.4 s sorted on the 2-core CPU)."""
    n = lp.shape[0]
    kth = -np.partition(-lp, k - 1, axis=1)[:, k - 1 : k]  # [n, 1] the k-th largest value
    above = lp > kth
    tie = lp == kth
    need = k - above.sum(axis=1, keepdims=True)  # how many of the tied values the top-k takes: the lowest ids
    if np.array_equal(need, tie.sum(axis=1, keepdims=True)):  # no tie straddles the k-th place (the usual case)
        chosen = above | tie
    else:
        chosen = above | (tie & (np.cumsum(tie, axis=1) <= need))
    ids = np.nonzero(chosen)[1].reshape(n, k)  # ascending ids per row
    vals = np.take_along_axis(lp, ids, axis=1)
    return np.take_along_axis(ids, np.argsort(-vals, axis=1, kind="stable"), axis=1)


def scheme_at_ids(
    scheme_logprobs: np.ndarray, base_ids: np.ndarray, target_ids: np.ndarray, *, norm_tol: float = NORM_TOL
) -> TopK:
    """The scheme's side for the top-k comparison when its full log-probabilities are at hand (hf backend).

    Columns: the baseline's ``k`` ids, then one more: the scheme's most likely token among the *other*
    ids (so the row argmax over the ``k + 1`` columns is the scheme's argmax over the vocabulary).
    ``rest_logprob`` is the exact ``logsumexp`` over the ids in neither.

    Args:
        scheme_logprobs: ``[n_tokens, vocab]`` log-probabilities of the scheme, nats.
        base_ids: the baseline's :attr:`TopK.ids`, ``[n_tokens, k]``, ``k < vocab``.
        target_ids: ``[n_tokens]`` ints.
        norm_tol: as in :func:`token_stats`.

    Returns:
        :class:`TopK` with ``k + 1`` columns.

    Raises:
        ValueError: bad shapes or ids, ``k >= vocab``, rows that are not log-probabilities.
    """
    lp = _check_full("scheme_logprobs", scheme_logprobs, norm_tol)
    n, vocab = lp.shape
    ids = np.asarray(base_ids)
    if ids.ndim != 2 or ids.shape[0] != n or not 1 <= ids.shape[1] < vocab:
        raise ValueError(f"base_ids must be [{n}, k] with 1 <= k < vocab ({vocab}), got {ids.shape}")
    if ids.min() < 0 or ids.max() >= vocab:
        raise ValueError(f"base_ids must be in 0..{vocab - 1}")
    t = _check_targets(target_ids, n, vocab)
    ids = ids.astype(np.int64)
    other = lp.copy()
    np.put_along_axis(other, ids, -np.inf, axis=1)
    extra = np.argmax(other, axis=1)
    cols = np.concatenate([ids, extra[:, None]], axis=1)
    np.put_along_axis(other, extra[:, None], -np.inf, axis=1)
    return TopK(
        ids=cols,
        logprobs=np.take_along_axis(lp, cols, axis=1),
        target_logprob=lp[np.arange(n), t],
        rest_logprob=_logsumexp(other),
    )


@dataclass(frozen=True)
class _Lumped:
    """The coarse distributions of :func:`topk_token_stats`: known columns S and one rest bucket."""

    kld: np.ndarray  # [n] lower bound
    p_rest: np.ndarray  # [n] baseline mass outside S
    q_rest: np.ndarray  # [n] scheme mass outside S
    p_out_max: np.ndarray  # [n] upper bound of any single baseline probability outside S


def _lumped(base: TopK, scheme: TopK, min_rest_mass: float) -> _Lumped:
    b_ids = np.asarray(base.ids)
    s_ids = np.asarray(scheme.ids)
    if b_ids.shape[0] != s_ids.shape[0]:
        raise ValueError(f"base has {b_ids.shape[0]} rows, scheme {s_ids.shape[0]}")
    bp = np.asarray(base.logprobs, dtype=np.float64)
    sq = np.asarray(scheme.logprobs, dtype=np.float64)
    match = b_ids[:, :, None] == s_ids[:, None, :]  # [n, kb, ks], at most one True per (row, kb) and (row, ks)
    in_s = match.any(axis=2)  # [n, kb]: base column also known for the scheme
    s_in = match.any(axis=1)  # [n, ks]: scheme column also known for the baseline
    q_at_b = np.where(in_s, np.sum(np.where(match, sq[:, None, :], 0.0), axis=2), 0.0)  # ln q at base cols in S
    p = np.exp(bp)
    q = np.exp(sq)
    known = np.where(in_s, p * (bp - q_at_b), 0.0).sum(axis=1)
    if base.rest_logprob is not None:
        p_rest = np.exp(np.asarray(base.rest_logprob, dtype=np.float64)) + np.where(in_s, 0.0, p).sum(axis=1)
    else:
        p_rest = np.clip(1.0 - np.where(in_s, p, 0.0).sum(axis=1), 0.0, None)
    if scheme.rest_logprob is not None:
        q_rest = np.exp(np.asarray(scheme.rest_logprob, dtype=np.float64)) + np.where(s_in, 0.0, q).sum(axis=1)
    else:
        q_rest = np.maximum(1.0 - np.where(s_in, q, 0.0).sum(axis=1), min_rest_mass)
    with np.errstate(divide="ignore", invalid="ignore"):
        rest_term = np.where(p_rest > 0, p_rest * (np.log(p_rest) - np.log(q_rest)), 0.0)
    # any baseline token outside S: an unmatched base column, or a token outside the base top-k, whose
    # probability is at most the smallest stored one
    p_out_max = np.maximum(np.where(in_s, 0.0, p).max(axis=1), p.min(axis=1))
    return _Lumped(kld=known + rest_term, p_rest=p_rest, q_rest=q_rest, p_out_max=p_out_max)


def _top_id(tk: TopK) -> np.ndarray:
    """Per row, the id of the largest log-probability, the lowest id among equal ones: ``np.argmax`` over the
    full vocabulary (first index on ties) whatever the column order. Ties are common: log-probabilities of a
    bf16 model's logits repeat (on SmolLM2-135M, 1 % of tokens had two equally likely top tokens)."""
    ids = np.asarray(tk.ids).astype(np.int64)
    lp = np.asarray(tk.logprobs)
    top = lp == lp.max(axis=1, keepdims=True)
    return np.asarray(np.where(top, ids, np.iinfo(np.int64).max).min(axis=1))


def topk_token_stats(base: TopK, scheme: TopK, *, min_rest_mass: float = MIN_REST_MASS) -> TokenStats:
    """Per-token statistics from the compact top-k forms; the KLD is a lower bound of the true KLD.

    Buckets per token: every id known on both sides (the set S = ``base.ids ∩ scheme.ids``) is its own
    bucket; all other tokens form one "rest" bucket with masses ``P_rest = 1 - sum_S P`` and
    ``Q_rest = 1 - sum_S Q`` (from ``rest_logprob`` plus the unmatched columns when stored, else as
    ``1 - sum``, the scheme's floored at ``min_rest_mass``; flooring Q_rest upward only lowers the rest
    term, so the bound stays a lower bound). The result is the KL of these coarse distributions:
    ``KL_S = sum_{v in S} P_v ln(P_v/Q_v) + P_rest ln(P_rest/Q_rest)``.

    Lower bound, proof. By the log-sum inequality, ``sum_{v in R} P_v ln(P_v/Q_v) >= P_R ln(P_R/Q_R)`` for
    the rest set R; adding the identical terms of S gives ``KL(P‖Q) >= KL_S`` (equivalently: merging
    tokens is a channel, and KL cannot grow through a channel, the data-processing inequality). The gap is
    exactly ``KL - KL_S = P_rest · KL(P_R/P_rest ‖ Q_R/Q_rest) >= 0`` (chain rule of KL); it vanishes when the
    scheme spreads its rest mass like the baseline and is at most ``P_rest`` times a log-ratio bound
    (:func:`topk_kld_bounds`).

    Top-1 agreement is exact: each side's argmax over its columns is its argmax over the vocabulary
    (:class:`TopK`), ties going to the lowest id as in :func:`token_stats` (:func:`_top_id`). ``p_*_correct``
    come from ``target_logprob`` and are exact.

    Args:
        base: the baseline's :class:`TopK` (its own top-k).
        scheme: the scheme's :class:`TopK`, same rows (its own top-k, or :func:`scheme_at_ids`).
        min_rest_mass: floor of a scheme rest mass derived as ``1 - sum`` (rounding of float32 log-probs).

    Returns:
        :class:`TokenStats` with ``kld_exact=False`` and ``top_k = base.k``.

    Raises:
        ValueError: the two forms have different numbers of rows.
    """
    lumped = _lumped(base, scheme, min_rest_mass)
    b_top, s_top = _top_id(base), _top_id(scheme)
    return TokenStats(
        kld=lumped.kld,
        top1_agree=b_top == s_top,
        p_base_correct=np.exp(np.asarray(base.target_logprob, dtype=np.float64)),
        p_scheme_correct=np.exp(np.asarray(scheme.target_logprob, dtype=np.float64)),
        kld_exact=False,
        top_k=base.k,
    )


def topk_kld_bounds(
    base: TopK,
    scheme: TopK,
    scheme_min_logprob: np.ndarray | None = None,
    *,
    min_rest_mass: float = MIN_REST_MASS,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-token interval ``[lower, upper]`` that holds the true KLD, from the compact forms.

    ``lower = KL_S`` of :func:`topk_token_stats`. The gap ``P_rest · KL(a ‖ b)`` with ``a = P_R/P_rest``,
    ``b = Q_R/Q_rest`` is at most ``P_rest · max_v ln(a_v/b_v)`` (a KL is an ``a``-weighted mean of the
    log-ratios). Every baseline probability outside S is at most ``p_out`` (the largest unmatched base
    column, or the smallest stored one for tokens outside the top-k), so ``a_v <= min(1, p_out/P_rest)``;
    every scheme probability is at least ``q_min = exp(scheme_min_logprob)``, so ``b_v >= q_min/Q_rest``:
    ``upper = lower + P_rest · max(0, ln(min(1, p_out/P_rest) · Q_rest / q_min))``.
    Without ``q_min`` the gap has no bound (a scheme can give a tail token any small probability):
    ``upper = +inf`` where ``P_rest > 0``.

    Args:
        base: the baseline's :class:`TopK`.
        scheme: the scheme's :class:`TopK`, same rows.
        scheme_min_logprob: ``[n]`` the scheme's smallest log-probability over the vocabulary (hf backend:
            ``scheme_logprobs.min(axis=-1)``), or None (server backend: unknown).
        min_rest_mass: as in :func:`topk_token_stats`.

    Returns:
        ``(lower, upper)``, two ``[n]`` float64 arrays in nats, ``lower <= KL(P‖Q) <= upper``.

    Raises:
        ValueError: rows differ, or ``scheme_min_logprob`` has the wrong shape.
    """
    lumped = _lumped(base, scheme, min_rest_mass)
    n = lumped.kld.shape[0]
    if scheme_min_logprob is None:
        gap = np.where(lumped.p_rest > 0, np.inf, 0.0)
        return lumped.kld, lumped.kld + gap
    qmin_log = np.asarray(scheme_min_logprob, dtype=np.float64)
    if qmin_log.shape != (n,):
        raise ValueError(f"scheme_min_logprob must be [{n}], got {qmin_log.shape}")
    with np.errstate(divide="ignore", invalid="ignore"):
        a_max = np.minimum(1.0, lumped.p_out_max / lumped.p_rest)
        log_ratio = np.log(a_max) + np.log(lumped.q_rest) - qmin_log
        gap = np.where(lumped.p_rest > 0, lumped.p_rest * np.maximum(0.0, log_ratio), 0.0)
    return lumped.kld, lumped.kld + gap


@dataclass(frozen=True)
class KldSummary:
    """KLD, top-1 agreement and Δp of a scheme against its baseline over the scored windows.

    Attributes:
        mean_kld: mean per-token KLD over all scored tokens, nats.
        median_kld: median per-token KLD, nats.
        p99_kld: 99th percentile per-token KLD, nats (``numpy.percentile``, method ``"linear"``).
        max_kld: largest per-token KLD, nats.
        top1_agreement_pct: share of tokens with the same most likely next token, percent (llama.cpp "Same top p").
        rms_delta_p_pct: ``100 · sqrt(mean(Δp²))``, percent points of probability (llama.cpp "RMS Δp").
        mean_delta_p_pct: ``100 · mean(Δp)``, percent points (llama.cpp "Mean Δp"; negative: the scheme
            gives the correct token less probability).
        n_tokens: scored tokens.
        n_windows: windows (the unit the interval resamples).
        kld_exact: False when the KLDs are top-k lower bounds.
        top_k: the baseline's k for the top-k form, None for the full vocabulary.
        confidence: two-sided coverage of the intervals.
        mean_kld_ci_low, mean_kld_ci_high: interval of ``mean_kld`` over windows, None with < 2 windows.
        top1_agreement_pct_ci_low, top1_agreement_pct_ci_high: same for ``top1_agreement_pct``.
        interval_method: how the intervals were made, or None.
        interval_note: why there is no interval, or None.
    """

    mean_kld: float
    median_kld: float
    p99_kld: float
    max_kld: float
    top1_agreement_pct: float
    rms_delta_p_pct: float
    mean_delta_p_pct: float
    n_tokens: int
    n_windows: int
    kld_exact: bool
    top_k: int | None
    confidence: float
    mean_kld_ci_low: float | None
    mean_kld_ci_high: float | None
    top1_agreement_pct_ci_low: float | None
    top1_agreement_pct_ci_high: float | None
    interval_method: str | None
    interval_note: str | None

    def to_dict(self) -> dict[str, object]:
        """The fields as a flat JSON-ready dict, keyed by field name."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def summarize(
    windows: Sequence[TokenStats],
    *,
    confidence: float = 0.95,
    samples: int = 10_000,
    seed: int = 0,
) -> KldSummary:
    """Summary statistics of per-token comparisons over windows, with intervals over windows.

    Point estimates pool all tokens (as llama.cpp does): ``mean_kld = sum kld / n_tokens``; median, p99 and
    max of the pooled per-token KLDs (``numpy.percentile(..., method="linear")``, llama.cpp's
    interpolation); ``top1_agreement_pct = 100 · agreeing / n_tokens``; ``rms_delta_p_pct =
    100 · sqrt(sum Δp² / n_tokens)``.

    Interval: paired percentile bootstrap over windows (:func:`quantverdict.measure.stats.bootstrap_ratio`):
    tokens of one window share context, so whole windows are resampled, each resample's statistic the
    token-weighted ratio ``sum S_w / sum n_w`` (S_w the window's KLD sum or agreeing count, n_w its tokens). Under 2
    windows the interval fields are None and ``interval_note`` says so; with few windows (< ~10) the interval is
    too narrow (``n_windows`` says how many).

    Args:
        windows: one :class:`TokenStats` per window, all of the same form (full or top-k with the same k).
        confidence: two-sided coverage, in (0, 1).
        samples: bootstrap resamples (>= 1).
        seed: seed of the generator.

    Returns:
        :class:`KldSummary`.

    Raises:
        ValueError: no tokens; windows of mixed form; a non-finite KLD (the scheme gives probability 0 to a
            token the baseline does not); bad ``confidence`` or ``samples``.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence} must be in (0, 1)")
    if samples < 1:
        raise ValueError(f"samples={samples} must be >= 1")
    ws = [w for w in windows if w.n_tokens > 0]
    if not ws:
        raise ValueError("no scored tokens: cannot summarize KL divergence")
    forms = {(w.kld_exact, w.top_k) for w in ws}
    if len(forms) > 1:
        raise ValueError(f"windows mix forms (kld_exact, top_k): {sorted(forms, key=str)}")
    kld = np.concatenate([np.asarray(w.kld, dtype=np.float64) for w in ws])
    bad = int(np.sum(~np.isfinite(kld)))
    if bad:
        raise ValueError(
            f"KL divergence is not finite for {bad} token(s): "
            "the scheme gives probability 0 where the baseline does not"
        )
    agree = np.concatenate([np.asarray(w.top1_agree, dtype=bool) for w in ws])
    dp = np.concatenate([w.delta_p for w in ws])
    n = kld.shape[0]
    kld_exact, top_k = ws[0].kld_exact, ws[0].top_k

    n_w = np.array([w.n_tokens for w in ws], dtype=np.float64)
    kld_w = np.array([float(np.sum(w.kld)) for w in ws])
    agree_w = np.array([float(np.sum(w.top1_agree)) for w in ws])
    ci_kld: tuple[float | None, float | None] = (None, None)
    ci_agree: tuple[float | None, float | None] = (None, None)
    method: str | None = None
    note: str | None = None
    if len(ws) < 2:
        note = f"{len(ws)} window: no interval over windows (needs >= 2)"
    else:

        def interval(sums: np.ndarray) -> tuple[float | None, float | None]:
            iv = stats.bootstrap_ratio(
                sums.tolist(), n_w.tolist(), samples=samples, seed=seed, confidence=confidence, unit="window"
            )
            return iv.low, iv.high

        ci_kld, ci_agree = interval(kld_w), interval(100.0 * agree_w)
        method = f"paired percentile bootstrap over {len(ws)} windows ({samples} resamples, seed {seed})"

    return KldSummary(
        mean_kld=float(np.sum(kld) / n),
        median_kld=float(np.percentile(kld, 50.0, method=PERCENTILE_METHOD)),
        p99_kld=float(np.percentile(kld, 99.0, method=PERCENTILE_METHOD)),
        max_kld=float(np.max(kld)),
        top1_agreement_pct=100.0 * float(np.sum(agree)) / n,
        rms_delta_p_pct=100.0 * math.sqrt(float(np.sum(dp * dp)) / n),
        mean_delta_p_pct=100.0 * float(np.sum(dp)) / n,
        n_tokens=n,
        n_windows=len(ws),
        kld_exact=kld_exact,
        top_k=top_k,
        confidence=confidence,
        mean_kld_ci_low=ci_kld[0],
        mean_kld_ci_high=ci_kld[1],
        top1_agreement_pct_ci_low=ci_agree[0],
        top1_agreement_pct_ci_high=ci_agree[1],
        interval_method=method,
        interval_note=note,
    )
