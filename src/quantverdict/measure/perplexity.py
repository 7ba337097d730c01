"""Token perplexity over a long text in fixed windows, and the perplexity family from one log-likelihood.

Standard library only and pure: the evaluate stage (serve environment) runs the model and sums the
negative log-likelihoods; the arithmetic lives here so that unit tests can check it by hand.

Two conventions, both from the same window rule (Hugging Face, "Perplexity of fixed-length models";
GPTQ, Frantar et al. 2022, ``datautils.py``/``llama_eval``):

* ``stride == seq_len``: non-overlapping windows ``[0, L), [L, 2L), ...`` — what quantization papers
  (GPTQ, AWQ, SmoothQuant) quote. The first token of each window has no context inside its window and
  is context only, so a window of ``L`` tokens scores ``L - 1`` targets: tokens ``0, L, 2L, ...`` are
  never targets, and ``n_tokens`` counts only the scored ones: ``n - ceil(n / L)`` for ``n`` tokens
  (a last window of a single token scores nothing and is left out).
* ``stride < seq_len``: a window of ``L`` tokens starts every ``stride`` tokens and scores only the
  tokens that no earlier window scored (its last ``stride`` tokens), each with at least
  ``L - stride`` tokens of context. Every token but the very first is scored exactly once.

Token perplexity depends on the tokenizer: it is comparable between quantization schemes of one
model, never between models, and never with lm-eval's document-level ``word_perplexity``.
"""

from __future__ import annotations

import math

__all__ = ["family_check", "perplexities", "scored_slices", "window_plan"]


def window_plan(n_tokens: int, seq_len: int, stride: int) -> list[tuple[int, int, int]]:
    """Windows for scoring ``n_tokens`` tokens with a causal LM of context ``seq_len``.

    Window ``(begin, end, n_scored)`` feeds tokens ``[begin, end)`` to the model and scores the last
    ``n_scored`` of them (token ``t`` predicted from tokens ``begin..t-1``). Token 0 of the text is
    never a target. A window is never scored twice for the same token; the last window may be shorter
    than ``seq_len``.

    Rule: windows begin at ``0, stride, 2*stride, ...``; ``end = min(begin + seq_len, n_tokens)``;
    ``n_scored = end - max(previous_end, begin + 1)``; stop after the window that reaches the end.

    Example (hand-worked): ``n_tokens=10, seq_len=4, stride=4`` -> ``[(0, 4, 3), (4, 8, 3), (8, 10, 1)]``
    (tokens 0, 4, 8 are context only); ``stride=2`` -> ``[(0, 4, 3), (2, 6, 2), (4, 8, 2), (6, 10, 2)]``
    (tokens 1..9 each scored once).

    Args:
        n_tokens: length of the token sequence (>= 2).
        seq_len: window length in tokens (>= 2).
        stride: tokens between window starts, ``1 <= stride <= seq_len``.

    Returns:
        The windows in order; ``sum(n_scored)`` is the number of targets.

    Raises:
        ValueError: a bad length or stride.
    """
    if n_tokens < 2:
        raise ValueError(f"n_tokens={n_tokens}: need at least 2 tokens to score one")
    if seq_len < 2:
        raise ValueError(f"seq_len={seq_len} must be >= 2")
    if not 1 <= stride <= seq_len:
        raise ValueError(f"stride={stride} must be in 1..seq_len ({seq_len})")
    plan: list[tuple[int, int, int]] = []
    prev_end = 0
    for begin in range(0, n_tokens, stride):
        end = min(begin + seq_len, n_tokens)
        n_scored = end - max(prev_end, begin + 1)
        if n_scored > 0:
            plan.append((begin, end, n_scored))
        prev_end = end
        if end == n_tokens:
            break
    return plan


def scored_slices(begin: int, end: int, n_scored: int) -> tuple[slice, slice]:
    """Which logits score which tokens in one window of :func:`window_plan`, in window coordinates.

    The window feeds tokens ``[begin, end)``; its last ``n_scored`` tokens are the targets, each
    predicted by the logits of the position before it (causal LM: logits at ``t - 1`` score token
    ``t``). With ``w = end - begin``: targets ``[w - n_scored, w)``, logits ``[w - n_scored - 1, w - 1)``.

    Returns:
        ``(logit_positions, target_positions)``, two slices of equal length ``n_scored``.

    Raises:
        ValueError: ``n_scored`` not in ``1..w - 1`` (the first token of a window has no logits before it).
    """
    w = end - begin
    if not 1 <= n_scored <= w - 1:
        raise ValueError(f"n_scored={n_scored} must be in 1..{w - 1} for a window of {w} tokens")
    return slice(w - n_scored - 1, w - 1), slice(w - n_scored, w)


def perplexities(
    nll_sum_nats: float,
    n_tokens: int | None = None,
    n_words: int | None = None,
    n_bytes: int | None = None,
) -> dict[str, float]:
    """Perplexities from one summed negative log-likelihood, normalized by different units.

    ``token_perplexity = exp(nll / n_tokens)``, ``word_perplexity = exp(nll / n_words)``,
    ``byte_perplexity = exp(nll / n_bytes)``, ``bits_per_byte = nll / (n_bytes * ln 2)``
    (the definitions of lm-eval's ``weighted_perplexity`` and ``bits_per_byte`` aggregations, which
    divide the summed log-likelihood of all documents by their summed word / UTF-8 byte counts).
    A unit that is ``None`` is left out of the result.

    Args:
        nll_sum_nats: summed negative log-likelihood in nats (``-sum(log p)``, >= 0).
        n_tokens: number of scored tokens.
        n_words: number of words (lm-eval: ``len(re.split(r"\\s+", original_text))``).
        n_bytes: number of UTF-8 bytes of the original text.

    Returns:
        ``{"token_perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte"}``, those whose
        unit was given.

    Raises:
        ValueError: a count that is not positive.
    """
    out: dict[str, float] = {}
    for key, count in (("token_perplexity", n_tokens), ("word_perplexity", n_words), ("byte_perplexity", n_bytes)):
        if count is None:
            continue
        if count <= 0:
            raise ValueError(f"{key}: the count must be positive, got {count}")
        out[key] = math.exp(nll_sum_nats / count)
    if n_bytes is not None:
        out["bits_per_byte"] = nll_sum_nats / (n_bytes * math.log(2))
    return out


def family_check(
    loglikelihood_sum: float, n_words: int, n_bytes: int, reported: dict[str, float | None], rel_tol: float = 1e-6
) -> dict[str, object]:
    """Recompute word and byte perplexity from one summed log-likelihood and compare with reported ones.

    ``word_perplexity = exp(-loglikelihood_sum / n_words)``, ``byte_perplexity = exp(-loglikelihood_sum /
    n_bytes)``, ``bits_per_byte = -loglikelihood_sum / (n_bytes ln 2)`` (lm-eval's ``weighted_perplexity``
    and ``bits_per_byte``). A reported value that disagrees by more than ``rel_tol`` means the numbers
    did not come from the same sum over the same documents.

    Args:
        loglikelihood_sum: summed log-likelihood of the documents, nats (<= 0).
        n_words: their summed word counts.
        n_bytes: their summed UTF-8 byte counts.
        reported: ``{"word_perplexity", "byte_perplexity", "bits_per_byte"}`` as reported (None: not checked).
        rel_tol: allowed relative difference.

    Returns:
        ``{"recomputed": {...}, "max_rel_diff": float | None, "ok": bool | None}`` (None: nothing to compare).
    """
    mine = perplexities(-loglikelihood_sum, n_words=n_words, n_bytes=n_bytes)
    diffs = []
    for key, v in mine.items():
        r = reported.get(key)
        if r is None or not math.isfinite(r):
            continue
        diffs.append(abs(r - v) / max(abs(v), 1e-300) if v else abs(r))
    worst = max(diffs) if diffs else None
    return {"recomputed": mine, "max_rel_diff": worst, "ok": None if worst is None else worst <= rel_tol}
