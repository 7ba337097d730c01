"""What a sweep point's traffic was: the distribution of the prompt and output lengths actually sent, and the
prefix-cache hit rate a shared-prefix workload is built to have.

Pure (the standard library, numpy and pydantic).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from quantverdict.measure.points import LengthDist, SweepPoint

LENGTH_PERCENTILES = (1, 50, 90, 99)


def length_distribution(lengths: Sequence[int]) -> dict[str, float] | None:
    """``min``, ``p1``, ``p50``, ``p90``, ``p99``, ``max`` and ``mean`` of per-request token counts (vLLM's
    ``input_lens`` / ``output_lens`` of a ``--save-detailed`` result), percentiles interpolated linearly between
    the closest ranks (``numpy.percentile``'s default, as vLLM's own latency percentiles), rounded to 0.01; None for
    no request.

    E.g. 1, 2, ..., 100: min 1, p1 1.99, p50 50.5, p90 90.1, p99 99.01, max 100, mean 50.5.
    """
    if not lengths:
        return None
    arr = np.asarray(lengths, dtype=float)
    out = {"min": float(arr.min())}
    out |= {f"p{p}": round(float(np.percentile(arr, p)), 2) for p in LENGTH_PERCENTILES}
    out |= {"max": float(arr.max()), "mean": round(float(arr.mean()), 2)}
    return out


def expected_prefix_hit_rate(requests: int, num_prefixes: int, prefix_len: int, input_len: int) -> float | None:
    """The share of prompt tokens a shared-prefix point is built to serve from the prefix cache: of ``requests``
    prompts of ``input_len`` tokens in ``num_prefixes`` groups, each group's first prompt computes its
    ``prefix_len``-token prefix and every other reuses it, so ``(requests - num_prefixes) x prefix_len`` of
    ``requests x input_len`` tokens hit. An upper bound of the measured rate: vLLM serves whole KV blocks only
    (16 tokens on a GPU, 128 on CPU), so a prefix of 160 tokens hits 128 with 128-token blocks; a request
    scheduled before its group's prefix is computed hits less. None without requests.

    E.g. 4 requests, 1 prefix of 160 tokens, 224 in: 3 x 160 / (4 x 224) = 480 / 896 = 0.5357.
    """
    if requests <= 0 or input_len <= 0:
        return None
    shared = max(0, requests - num_prefixes) * prefix_len
    return shared / (requests * input_len)


def shared_prefix_tokens(dataset: Mapping[str, Any] | None, requests: int) -> int | None:
    """Prompt tokens a shared-prefix point of ``requests`` prompts shares on purpose, ``(requests - num_prefixes) x
    prefix_len`` (``dataset``: the sweep client's spec ``dataset``); None for another kind.

    E.g. 12 requests, 4 prefixes of 128 tokens: 8 x 128 = 1,024.
    """
    if not dataset or dataset.get("kind") != "shared_prefix":
        return None
    return max(0, requests - int(dataset["num_prefixes"])) * int(dataset["prefix_len"])


def add_workload(
    point: SweepPoint,
    input_lens: Sequence[int] | None,
    output_lens: Sequence[int] | None,
    dataset: Mapping[str, Any] | None,
    input_len: int,
) -> SweepPoint:
    """Complete a parsed point with its traffic; updates ``point`` in place.

    Adds ``input_len_dist`` and ``output_len_dist`` (:func:`length_distribution` of vLLM's per-request
    ``input_lens``/``output_lens``) and, for a shared-prefix ``dataset``, ``workload_prefix_hit_rate`` (the
    measured ``prefix_cache_hit_rate``, read as the workload's property) and ``workload_prefix_hit_rate_expected``
    (:func:`expected_prefix_hit_rate` over the requests in the result, ``input_len`` tokens each).
    """
    if input_lens:
        point.input_len_dist = LengthDist.model_validate(length_distribution(input_lens))
    if output_lens:
        point.output_len_dist = LengthDist.model_validate(length_distribution(output_lens))
    if dataset and dataset.get("kind") == "shared_prefix":
        n = len(input_lens) if input_lens else int(point.num_prompts or 0)
        point.workload_prefix_hit_rate = point.prefix_cache_hit_rate
        point.workload_prefix_hit_rate_expected = expected_prefix_hit_rate(
            n, int(dataset["num_prefixes"]), int(dataset["prefix_len"]), input_len
        )
    return point
