"""How much of a sweep point's prompt set repeats inside itself: the prefix-cache hits the point's own prompts
allow, apart from the reuse the measurement method must not cause.

vLLM's random dataset (``vllm/benchmarks/datasets/datasets.py``, ``RandomDataset``, the same code in vLLM
0.26 and 0.32) builds prompt ``i`` from consecutive allowed token ids starting at ``(offset_i + i) mod V``
with ``offset_i`` drawn uniformly from the tokenizer's vocabulary (``V`` allowed ids). Two requests whose
starts coincide send the same tokens, and the prefix cache serves the second from the first: a birthday
collision, expected for about ``n^2 / (2 V)`` of ``n`` requests. With SmolLM2's tokenizer (49,152 ids) a 30-s
window at 2,600 requests repeats ~70 prompts, ~2.6% of its prompt tokens; the same seed gives the same
repeats to every scheme of a grid. Those hits are the dataset's, not reuse across points or from a
warm-up, and :func:`quantverdict.measure.server_metrics.server_checks` judges only the hits beyond them.

Pure (standard library only).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# a prompt is a repeat when its first KEY_CHARS characters equal an earlier prompt's: prompts that start at
# the same token share these (vLLM may append a few random tokens at the end when re-tokenizing changes
# the length, so whole strings can differ), prompts with different starts differ in their first token
KEY_CHARS = 64


def prompt_repeats(prompts: Iterable[tuple[Any, int]], key_chars: int = KEY_CHARS) -> dict[str, int]:
    """Count the requests whose prompt starts like an earlier one's, and their prompt tokens.

    Args:
        prompts: ``(prompt, prompt_len)`` per request in send order (vLLM's ``SampleRequest.prompt`` and
            ``.prompt_len``); a prompt that is not a string (a batch, a multimodal request) is never a repeat.
        key_chars: characters compared (:data:`KEY_CHARS`).

    Returns:
        ``{"requests", "prompt_tokens", "repeated_requests", "repeated_tokens"}``: ``repeated_tokens`` sums
        the whole ``prompt_len`` of each repeat, an upper bound on the hits its repeats can produce (vLLM
        serves at most the full KV blocks of the shared part, never the last token). Not seen: prefixes of a
        block or a few that two prompts share while their first 64 characters differ (measured on the H200:
        +32 to +128 tokens per point, <= 0.02% of the tokens looked up); they count against the 1% limit.

    E.g. prompts ``"abc", "xyz", "abc"`` of 10, 10 and 10 tokens: 3 requests, 30 tokens, 1 repeat, 10 tokens.
    """
    seen: set[str] = set()
    n = total = rep_n = rep_tok = 0
    for prompt, length in prompts:
        n += 1
        total += int(length)
        if not isinstance(prompt, str):
            continue
        key = prompt[:key_chars]
        if key in seen:
            rep_n += 1
            rep_tok += int(length)
        else:
            seen.add(key)
    return {"requests": n, "prompt_tokens": total, "repeated_requests": rep_n, "repeated_tokens": rep_tok}


def expected_repeats(n: int, vocab: int) -> float:
    """Expected number of the ``n`` requests whose start id equals an earlier one's, starts uniform over
    ``vocab`` ids: ``n - vocab * (1 - (1 - 1/vocab)^n)`` (``n`` minus the expected number of distinct
    starts; ``~ n^2 / (2 vocab)`` while ``n << vocab``).

    E.g. n = 2,600, vocab = 49,152: 67.5 (``n^2 / 2V`` = 68.8).

    Raises:
        ValueError: ``vocab < 1`` or ``n < 0``.
    """
    if vocab < 1 or n < 0:
        raise ValueError(f"need vocab >= 1 and n >= 0, got vocab={vocab}, n={n}")
    return n - vocab * (1.0 - (1.0 - 1.0 / vocab) ** n)
