"""Bytes one decode step moves, the speed ratio they predict between two candidates, and what a target GPU's
memory budget leaves for the KV cache.

Decode is memory-bound: each step reads every weight it multiplies once, plus, for each sequence in the
batch, its KV cache (``context x kv_bytes_per_token``) and, for a hybrid model, its recurrent state. At the
same batch the output-token throughput of two candidates then goes as the inverse of their bytes per step::

    bytes_per_step = weights + sequences * (context_tokens * kv_bytes_per_token + state_bytes_per_sequence)
    predicted ratio (A over B) = bytes_per_step(B) / bytes_per_step(A)

The seed: Qwen3.5-9B AWQ reads 11.21 GB of weights, Qwen3.5-4B fp16 8.61 GB, so the 9B's ceiling should be
8.61 / 11.21 = 1 / 1.30 = 0.77 of the 4B's (measured 821 / 1,092 = 0.75); the parameter count would say
4 / 9 = 1 / 2.25. Standard library only; KV bytes per token and paging are :mod:`quantverdict.measure.kv_cache`.
"""

from __future__ import annotations

import math
from typing import Any

from quantverdict.measure.kv_cache import paged_bytes_per_sequence
from quantverdict.measure.memory import GIB


def decode_step_bytes(
    weight_bytes: float,
    kv_bytes_per_token: float = 0.0,
    sequences: int = 1,
    context_tokens: float = 0.0,
    state_bytes_per_sequence: float = 0.0,
) -> float:
    """Bytes one decode step reads: the weights once, plus each sequence's KV cache and recurrent state.

    Args:
        weight_bytes: bytes of the weights a step reads (vLLM's weights GiB x 2^30, or
            :func:`quantverdict.measure.roofline.decode_read_bytes`).
        kv_bytes_per_token: :func:`quantverdict.measure.kv_cache.kv_bytes_per_token`.
        sequences: sequences in the batch (>= 1).
        context_tokens: mean tokens in each sequence's KV cache at the step (>= 0).
        state_bytes_per_sequence: a hybrid model's recurrent state
            (:func:`quantverdict.measure.kv_cache.state_bytes_per_sequence`), 0 otherwise.

    Raises:
        ValueError: a negative value, ``weight_bytes`` <= 0 or ``sequences`` < 1.
    """
    if weight_bytes <= 0 or sequences < 1 or min(kv_bytes_per_token, context_tokens, state_bytes_per_sequence) < 0:
        raise ValueError(
            f"weight_bytes={weight_bytes} must be > 0, sequences={sequences} >= 1, kv_bytes_per_token="
            f"{kv_bytes_per_token}, context_tokens={context_tokens}, state={state_bytes_per_sequence} >= 0"
        )
    return float(weight_bytes) + sequences * (context_tokens * kv_bytes_per_token + state_bytes_per_sequence)


def predicted_speed_ratio(bytes_candidate: float, bytes_reference: float) -> float:
    """Predicted decode throughput of a candidate over a reference at the same batch:
    ``bytes_reference / bytes_candidate`` (both bytes per step, :func:`decode_step_bytes`).
    E.g. 8.61 GB (4B fp16, reference) / 11.21 GB (9B AWQ, candidate) = 0.768.

    Raises:
        ValueError: a non-positive byte count.
    """
    if bytes_candidate <= 0 or bytes_reference <= 0:
        raise ValueError(f"bytes per step must be > 0, got {bytes_candidate} and {bytes_reference}")
    return bytes_reference / bytes_candidate


def target_kv_budget_bytes(
    memory_gib: float, memory_fraction: float, weights_bytes: float, reserved_bytes: float = 0.0
) -> float:
    """Bytes a target GPU leaves for the KV cache, the way vLLM sizes it (``--gpu-memory-utilization``):
    ``memory_gib x 2^30 x memory_fraction - weights - reserved`` (reserved: activation peak, CUDA graphs,
    non-torch memory, which vLLM measures by profiling). Negative when the weights alone do not fit.
    E.g. an A10G (23,028 MiB = 22.488 GiB) at 0.9: 20.239 GiB; minus 11.21 GiB of weights: 9.029 GiB."""
    return memory_gib * GIB * memory_fraction - weights_bytes - reserved_bytes


def kv_capacity(
    kv_bytes: float,
    kv_bytes_per_token: float,
    request_tokens: int,
    paging: dict[str, Any] | None = None,
    state_bytes_per_sequence: float = 0.0,
) -> dict[str, float]:
    """KV tokens and maximum concurrency of ``request_tokens``-token requests that ``kv_bytes`` hold.

    Without paging: ``tokens = floor(kv_bytes / (kv_bytes_per_token + state / request_tokens))`` and
    ``max_concurrency = tokens / request_tokens`` (vLLM's "Maximum concurrency for N tokens per request").
    A hybrid model (``paging``, :func:`quantverdict.measure.kv_cache.hybrid_paging`): whole sequences,
    ``seqs = floor(kv_bytes / paged_bytes_per_sequence)``, tokens = ``seqs x request_tokens``.
    0 for a budget <= 0. E.g. 1 GiB at 32,768 B/token, 4,096-token requests: 32,768 tokens, 8.0 requests.

    Raises:
        ValueError: ``kv_bytes_per_token`` <= 0 or ``request_tokens`` < 1.
    """
    if kv_bytes_per_token <= 0 or request_tokens < 1:
        raise ValueError(f"kv_bytes_per_token={kv_bytes_per_token} must be > 0, request_tokens={request_tokens} >= 1")
    if kv_bytes <= 0:
        return {"kv_tokens": 0, "max_concurrency": 0.0}
    if paging:
        seqs = math.floor(kv_bytes / paged_bytes_per_sequence(paging, request_tokens))
        return {"kv_tokens": seqs * request_tokens, "max_concurrency": float(seqs)}
    per_token = kv_bytes_per_token + state_bytes_per_sequence / request_tokens
    tokens = math.floor(kv_bytes / per_token)
    return {"kv_tokens": tokens, "max_concurrency": tokens / request_tokens}
