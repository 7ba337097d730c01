"""Goodput: the requests per second that meet every latency objective, counted per request.

As ``vllm bench serve --goodput`` computes it (``vllm/benchmarks/serve.py``, ``calculate_metrics``; the
definition of DistServe, Zhong et al. 2024, https://arxiv.org/abs/2401.09670): for each *completed* request

* TTFT = time to its first streamed token (s);
* TPOT = (E2E - TTFT) / (output tokens - 1), its mean inter-token latency; 0 for a request of at most one
  output token ("we regard tpot as 0 for goodput");
* E2E = its whole latency (vLLM's ``e2el``);

a request is *good* when every objective set holds (``value <= objective``, vLLM's ``s >= r``); a failed
request is never good. ``goodput = good requests / benchmark duration`` (the duration every vLLM
throughput divides by). SLO attainment = good / requests sent (failed ones included), the fraction
DistServe plots.

Pure: reads the per-request lists of ``--save-detailed`` (``ttfts``, ``itls``, ``latencies``,
``output_lens``, ``errors``) from the parsed result dict; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from quantverdict.measure.bench_result import completed_requests, e2e_s, has_detailed

OBJECTIVES = ("ttft", "tpot", "e2e")  # vLLM's --goodput keys ttft, tpot, e2el


@dataclass(frozen=True)
class Slo:
    """Per-request latency objectives in ms; None: not an objective. At least one must be set."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def objectives(self) -> dict[str, float]:
        """``{"ttft": ms, "tpot": ms, "e2e": ms}`` for the objectives set, in that order."""
        values = {"ttft": self.ttft_ms, "tpot": self.tpot_ms, "e2e": self.e2e_ms}
        return {k: float(v) for k, v in values.items() if v is not None}

    def describe(self) -> str:
        """``TTFT <= 2,000 ms and TPOT <= 200 ms``."""
        names = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E"}
        return " and ".join(f"{names[k]} <= {v:,.0f} ms" for k, v in self.objectives().items())


@dataclass(frozen=True)
class RequestLatency:
    """One completed request's latencies in seconds (vLLM's definitions, module docstring)."""

    ttft_s: float
    tpot_s: float
    e2e_s: float
    output_tokens: int

    def value(self, objective: str) -> float:
        """The latency an objective (``ttft``, ``tpot``, ``e2e``) judges, in ms."""
        return 1000.0 * {"ttft": self.ttft_s, "tpot": self.tpot_s, "e2e": self.e2e_s}[objective]


@dataclass(frozen=True)
class Goodput:
    """Per-request SLO attainment of one benchmark run.

    ``sent``: requests in the result (completed + failed); ``completed``; ``good``: completed requests meeting
    every objective; ``missed``: per objective, completed requests over it (a request can miss several);
    ``goodput_rps = good / duration_s``; ``attainment_pct = 100 · good / sent``.
    """

    sent: int
    completed: int
    good: int
    duration_s: float
    objectives: dict[str, float]
    missed: dict[str, int] = field(default_factory=dict)

    @property
    def goodput_rps(self) -> float:
        return self.good / self.duration_s

    @property
    def attainment_pct(self) -> float:
        return 100.0 * self.good / self.sent if self.sent else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Flat keys for a sweep point: ``goodput_rps``, ``slo_attainment_pct``, ``good_requests``,
        ``slo_requests`` (sent), ``slo_completed``, ``slo_duration_s``, ``slo_missed`` ({objective: count})."""
        return {
            "goodput_rps": self.goodput_rps,
            "slo_attainment_pct": self.attainment_pct,
            "good_requests": self.good,
            "slo_requests": self.sent,
            "slo_completed": self.completed,
            "slo_duration_s": self.duration_s,
            "slo_missed": dict(self.missed),
        }


def request_latencies(result: dict[str, Any]) -> list[RequestLatency | None]:
    """Each request's latencies, in the result's order; None for a failed one.

    A request failed by the rule of :func:`quantverdict.measure.bench_result.completed_requests` (an
    ``errors`` entry, else no output token), as vLLM's ``success`` flag.

    Raises:
        ValueError: the result lacks the per-request lists of ``--save-detailed``.
    """
    if not has_detailed(result):
        raise ValueError(
            "no per-request data: the result lacks the --save-detailed lists (start_times, ttfts, itls, output_lens)"
        )
    done = set(completed_requests(result))
    lats = e2e_s(result)
    out: list[RequestLatency | None] = []
    for i in range(len(result["ttfts"])):
        if i not in done:
            out.append(None)
            continue
        tokens = int(result["output_lens"][i])
        ttft, e2e = float(result["ttfts"][i]), lats[i]
        tpot = (e2e - ttft) / (tokens - 1) if tokens > 1 else 0.0
        out.append(RequestLatency(ttft, tpot, e2e, tokens))
    return out


def goodput(result: dict[str, Any], slo: Slo) -> Goodput:
    """Per-request SLO attainment and goodput of one ``vllm bench serve --save-detailed`` result.

    Args:
        result: the parsed result JSON (needs ``duration`` and the per-request lists).
        slo: the objectives (ms).

    Returns:
        :class:`Goodput` (good requests, attainment %, goodput req/s = good / ``duration``).

    Raises:
        ValueError: no objective set, no per-request data, or a duration <= 0.
    """
    objectives = slo.objectives()
    if not objectives:
        raise ValueError("goodput needs at least one objective (ttft_ms, tpot_ms or e2e_ms)")
    duration = float(result["duration"])
    if duration <= 0:
        raise ValueError(f"benchmark duration {duration} s must be > 0")
    reqs = request_latencies(result)
    done = [r for r in reqs if r is not None]
    missed = {k: sum(1 for r in done if r.value(k) > v) for k, v in objectives.items()}
    good = sum(1 for r in done if all(r.value(k) <= v for k, v in objectives.items()))
    return Goodput(len(reqs), len(done), good, duration, objectives, missed)
