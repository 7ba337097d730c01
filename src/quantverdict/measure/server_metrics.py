"""What the server counted during one sweep point, from its ``/metrics`` counters read before and after:
the prefix-cache hit rate and the prompt and generation tokens, beside the client's totals.

vLLM's counters (``vllm/v1/metrics/loggers.py``, vLLM 0.32): ``vllm:prefix_cache_queries`` and
``vllm:prefix_cache_hits`` (tokens looked up in / served from the prefix cache as requests are scheduled),
``vllm:prompt_tokens`` (every prompt token, cached or computed), ``vllm:generation_tokens``,
``vllm:num_preemptions``. The client (:mod:`quantverdict.children.sweep_client`) reads them, summed over
their label sets, as ``{name: value}``.

A point is **invalid** when

* its prefix-cache hits *beyond the point's own repeated prompts* are above ``MAX_PREFIX_HIT_RATE`` (1%) of
  the tokens looked up: such hits mean the point re-sent prompts the server had seen before it (the same
  seed as an earlier point, a warm-up of measured prompts, no cache reset), and its TTFT and throughput are
  flattered. vLLM's random dataset repeats some prompts inside one point (start ids collide,
  :mod:`quantverdict.measure.prompt_repeats`: ~2.6% of the prompt tokens of 2,600 requests with a
  49,152-id tokenizer); the client counts them per point (``repeated_tokens``) and they are subtracted.
  Without that count (records before it) the whole hit rate is judged;
* the server's prompt or generation tokens differ from the client's totals by more than
  ``MAX_TOKEN_REL_DIFF`` (5%): the server did not run the requested shape (a tokenizer that re-tokenizes
  the decoded random prompt to a different length), or preempted requests were prefilled again (the
  reason names the preemptions when there were any).

Pure (standard library only).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from quantverdict.measure.points import SweepPoint, as_point

MAX_PREFIX_HIT_RATE = 0.01
MAX_TOKEN_REL_DIFF = 0.05

_KEYS = {
    "prefix_cache_queries": "vllm:prefix_cache_queries",
    "prefix_cache_hits": "vllm:prefix_cache_hits",
    "server_prompt_tokens": "vllm:prompt_tokens",
    "server_generation_tokens": "vllm:generation_tokens",
    "server_preemptions": "vllm:num_preemptions",
}


def deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, int | None]:
    """``after - before`` of each counter, under the record's names (``prefix_cache_queries``,
    ``prefix_cache_hits``, ``server_prompt_tokens``, ``server_generation_tokens``, ``server_preemptions``);
    None for a counter missing from either read."""
    out: dict[str, int | None] = {}
    for key, name in _KEYS.items():
        a, b = after.get(name), before.get(name)
        out[key] = None if a is None or b is None else int(round(a - b))
    return out


def hit_rate(hits: int | None, queries: int | None) -> float | None:
    """``hits / queries`` (tokens served from the prefix cache / tokens looked up); 0.0 when nothing was
    queried, None when a counter is missing."""
    if hits is None or queries is None:
        return None
    return hits / queries if queries > 0 else 0.0


def rel_diff(server: int | None, client: int | None) -> float | None:
    """``|server - client| / client``; None when either is missing or the client counted nothing."""
    if server is None or client is None or client <= 0:
        return None
    return abs(server - client) / client


def excess_hits(hits: int | None, repeated_tokens: int | None) -> int | None:
    """Prefix-cache hits the point's own repeats cannot explain: ``max(0, hits - repeated_tokens)``; ``hits``
    when the repeats were not counted, None when the hits are unknown. E.g. 19,088 hits, 18,688 repeated
    tokens: 400."""
    if hits is None:
        return None
    return hits if repeated_tokens is None else max(0, hits - int(repeated_tokens))


def server_checks(
    before: dict[str, float],
    after: dict[str, float],
    client_input_tokens: int | None,
    client_output_tokens: int | None,
    repeated_tokens: int | None = None,
) -> dict[str, Any]:
    """The point's server-side numbers and the reasons they make it invalid.

    Args:
        before: counters read after the warm-up and the cache reset, just before the measured run.
        after: counters read after the run (settled).
        client_input_tokens: the client's ``total_input_tokens`` (vLLM's result JSON).
        client_output_tokens: the client's ``total_output_tokens``.
        repeated_tokens: prompt tokens of the point's requests that repeat an earlier request of the same point
            (:func:`quantverdict.measure.prompt_repeats.prompt_repeats`); None: not counted.

    Returns:
        The :func:`deltas` keys, ``prefix_cache_hit_rate`` (all hits / tokens looked up),
        ``prompt_repeat_tokens``, ``prompt_repeat_rate`` (repeated / client prompt tokens),
        ``prefix_cache_excess_hit_rate`` (:func:`excess_hits` / tokens looked up: the judged one),
        ``prompt_tokens_rel_diff``,
        ``generation_tokens_rel_diff`` (None where a number is missing) and ``server_invalid_reasons``
        (list of str, empty when the point passes).

    E.g. 4,096 tokens queried and 2,048 hit: rate 0.5 > 0.01, invalid. 686,080 queried, 19,088 hit, 18,688
    of them repeats inside the point: excess 400, 0.06%, valid. Client 4,096 prompt tokens, server 4,300:
    4.98% <= 5%, valid.
    """
    d = deltas(before, after)
    out: dict[str, Any] = dict(d)
    out["prefix_cache_hit_rate"] = hit_rate(d["prefix_cache_hits"], d["prefix_cache_queries"])
    out["prompt_repeat_tokens"] = repeated_tokens
    out["prompt_repeat_rate"] = (
        repeated_tokens / client_input_tokens if repeated_tokens is not None and client_input_tokens else None
    )
    excess = excess_hits(d["prefix_cache_hits"], repeated_tokens)
    rate = hit_rate(excess, d["prefix_cache_queries"])
    out["prefix_cache_excess_hit_rate"] = rate
    out["prompt_tokens_rel_diff"] = rel_diff(d["server_prompt_tokens"], client_input_tokens)
    out["generation_tokens_rel_diff"] = rel_diff(d["server_generation_tokens"], client_output_tokens)
    reasons = []
    if rate is not None and rate > MAX_PREFIX_HIT_RATE:
        if repeated_tokens is None:
            reasons.append(
                f"prefix-cache hit rate {100 * rate:.1f}% > {100 * MAX_PREFIX_HIT_RATE:g}% on random prompts "
                f"({d['prefix_cache_hits']:,} of {d['prefix_cache_queries']:,} tokens; the point's own repeated "
                "prompts were not counted): prompts were served from the cache"
            )
        else:
            reasons.append(
                f"prefix-cache hits beyond the point's own repeated prompts {100 * rate:.1f}% > "
                f"{100 * MAX_PREFIX_HIT_RATE:g}% ({d['prefix_cache_hits']:,} hits, {repeated_tokens:,} repeated "
                f"prompt tokens, {d['prefix_cache_queries']:,} looked up): prompts sent before the point were "
                "served from the cache"
            )
    for what, diff, server, client in (
        ("prompt", out["prompt_tokens_rel_diff"], d["server_prompt_tokens"], client_input_tokens),
        ("generation", out["generation_tokens_rel_diff"], d["server_generation_tokens"], client_output_tokens),
    ):
        if diff is not None and diff > MAX_TOKEN_REL_DIFF:
            pre = d["server_preemptions"]
            why = (
                f"{pre:,} preemption(s): a preempted request is prefilled again and counted again"
                if pre
                else "the server did not run the requested shape"
            )
            reasons.append(
                f"the server counted {server:,} {what} tokens, the client {client:,} "
                f"({100 * diff:.1f}% > {100 * MAX_TOKEN_REL_DIFF:g}%): {why}"
            )
    out["server_invalid_reasons"] = reasons
    return out


def cache_summary(points: Sequence[SweepPoint | Mapping[str, Any]]) -> str | None:
    """One sentence on the prefix-cache hits of a sweep's points (parsed, with :func:`server_checks`' keys), or
    None when no point has the server's counters (records from before the counters were kept). A shared-prefix
    workload's points (``workload_prefix_hit_rate_expected``) are described as such: their hits are the traffic's.

    E.g. hits of 1.5% and 2.8% with 1.6% and 3.0% of the prompt tokens repeated inside their points and none
    beyond: "prefix-cache hits at most 2.8% of the prompt tokens looked up per point; at most 3.0% of a
    point's prompt tokens repeat inside it (vLLM's random dataset), and the hits beyond those repeats are at
    most 0.00% (limit 1%)".
    """
    typed = [as_point(p) for p in points]
    rates = [v for p in typed if (v := p.number("prefix_cache_hit_rate")) is not None]
    if not rates:
        return None
    built = [v for p in typed if (v := p.number("workload_prefix_hit_rate_expected")) is not None]
    if built:  # a shared-prefix workload: the hits are the traffic's, by design
        return (
            f"a shared-prefix workload: prefix-cache hits {100 * min(rates):.1f}-{100 * max(rates):.1f}% of the prompt "
            f"tokens looked up per point, built for at most {100 * max(built):.1f}% (whole KV blocks only are "
            "served); only hits beyond the shared prefixes count against the "
            f"{100 * MAX_PREFIX_HIT_RATE:g}% limit on reuse across points"
        )
    text = f"prefix-cache hits at most {100 * max(rates):.1f}% of the prompt tokens looked up per point"
    repeats = [v for p in typed if (v := p.number("prompt_repeat_rate")) is not None]
    excess = [v for p in typed if (v := p.number("prefix_cache_excess_hit_rate")) is not None]
    limit = f"limit {100 * MAX_PREFIX_HIT_RATE:g}%"
    if repeats and len(repeats) == len(rates):
        text += (
            f"; at most {100 * max(repeats):.1f}% of a point's prompt tokens repeat inside it (vLLM's random "
            f"dataset), and the hits beyond those repeats are at most {100 * max(excess, default=0.0):.2f}% ({limit})"
        )
    else:
        text += f" (repeats inside a point not counted for every point; {limit})"
    return text
