"""Pure helpers of the serving sweep: which points to run and how to read vLLM's result JSON.

No I/O and no third-party imports, so that they are unit-tested on hand-written results.

A *point* is one run of ``vllm bench serve``: an offered load (open loop: a Poisson request rate,
``inf`` = all requests at t=0; closed loop: a fixed number of requests in flight) and a repeat
index. Its parsed form keeps units in key names (``ttft_ms_p99``, ``output_tok_s``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

INF = "inf"  # how an infinite offered rate is written everywhere (vLLM's own result JSON does the same)
METRICS = ("ttft", "tpot", "itl", "e2el")  # passed to --percentile-metrics
PERCENTILES = (50, 90, 99)  # passed to --metric-percentiles
# vLLM's metric name -> ours (E2EL is vLLM's "end-to-end latency"; we call it E2E)
_METRIC_KEYS = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e"}


@dataclass(frozen=True)
class SweepPoint:
    """One benchmark run: ``offered_rate_rps`` (req/s, or ``"inf"``), ``concurrency`` (None: unlimited)."""

    offered_rate_rps: float | str
    concurrency: int | None
    repeat: int

    @property
    def name(self) -> str:
        """File-name stem: ``rate-1_r0``, ``rate-0.5_r1``, ``rate-inf_r0``, ``conc-16_r0``."""
        if self.concurrency is not None:
            return f"conc-{self.concurrency}_r{self.repeat}"
        return f"rate-{format_rate(self.offered_rate_rps)}_r{self.repeat}"

    @property
    def request_rate_arg(self) -> str:
        """Value for ``vllm bench serve --request-rate``."""
        return format_rate(self.offered_rate_rps)


def normalize_rate(rate: float | int | str) -> float | str:
    """A rate as a float in req/s, or ``"inf"`` for an infinite one.

    Raises:
        ValueError: the rate is not positive.
    """
    if isinstance(rate, str):
        if rate.strip().lower() in ("inf", "+inf", "infinity", ".inf"):
            return INF
        rate = float(rate)
    if math.isinf(rate) and rate > 0:
        return INF
    if not rate > 0:
        raise ValueError(f"request rate must be > 0 req/s or inf, got {rate!r}")
    return float(rate)


def format_rate(rate: float | str) -> str:
    """``1.0 -> "1"``, ``0.5 -> "0.5"``, ``inf -> "inf"`` (``%g``)."""
    rate = normalize_rate(rate)
    return INF if rate == INF else f"{rate:g}"


def plan(mode: str, rates: list[float], concurrencies: list[int], repeats: int) -> list[SweepPoint]:
    """The points of a sweep, in run order: each load level, then each repeat of it.

    Args:
        mode: ``rate`` (open loop, one point per offered rate, ``inf`` allowed) or ``concurrency``
            (closed loop: ``--max-concurrency C`` with ``--request-rate inf``).
        rates: offered request rates, req/s.
        concurrencies: requests in flight.
        repeats: runs per load level (>= 1).

    Raises:
        ValueError: unknown mode, empty list, or repeats < 1.
    """
    if repeats < 1:
        raise ValueError(f"bench.repeats={repeats} must be >= 1")
    if mode == "rate":
        if not rates:
            raise ValueError("bench.rates is empty")
        return [SweepPoint(normalize_rate(r), None, i) for r in rates for i in range(repeats)]
    if mode == "concurrency":
        if not concurrencies:
            raise ValueError("bench.concurrencies is empty")
        return [SweepPoint(INF, int(c), i) for c in concurrencies for i in range(repeats)]
    raise ValueError(f"bench.mode={mode!r} is not allowed; allowed: rate, concurrency")


def _num(value: Any) -> float | None:
    return None if value is None else float(value)


def parse_result(
    result: dict[str, Any],
    point: SweepPoint,
    num_prompts: int,
    output_len: int,
) -> dict[str, Any]:
    """One point's numbers from ``vllm bench serve --save-result`` JSON.

    Source of the definitions: ``vllm/benchmarks/serve.py`` (``calculate_metrics``): TTFT is the
    time to the first streamed token; TPOT = (E2E - TTFT) / (output tokens - 1) per request;
    ITL the gaps between streamed chunks; E2E the request latency; throughputs divide by the
    benchmark duration (first request sent to last response), so ``achieved_rps`` =
    completed / duration_s.

    Args:
        result: the parsed result JSON.
        point: the point it was run for.
        num_prompts: requests sent (``--num-prompts``).
        output_len: output tokens asked per request (``--random-output-len``; exact with ``--ignore-eos``).

    Returns:
        Flat dict: offered_rate_rps (float or ``"inf"``), concurrency, repeat, completed, failed,
        duration_s, achieved_rps, output_tok_s, total_tok_s, input_tokens_total,
        output_tokens_total, output_tokens_requested, peak_concurrent_requests, and for each of
        ttft/tpot/itl/e2e: ``<m>_ms_mean`` and ``<m>_ms_p50/p90/p99`` (None when absent).

    Raises:
        KeyError: the JSON lacks ``completed`` or ``duration`` (not a vLLM bench result).
    """
    out: dict[str, Any] = {
        "point": point.name,
        "offered_rate_rps": point.offered_rate_rps,
        "concurrency": point.concurrency,
        "repeat": point.repeat,
        "num_prompts": num_prompts,
        "completed": int(result["completed"]),
        "failed": int(result.get("failed", num_prompts - int(result["completed"]))),
        "duration_s": float(result["duration"]),
        "achieved_rps": _num(result.get("request_throughput")),
        "output_tok_s": _num(result.get("output_throughput")),
        "total_tok_s": _num(result.get("total_token_throughput")),
        "input_tokens_total": result.get("total_input_tokens"),
        "output_tokens_total": result.get("total_output_tokens"),
        "output_tokens_requested": num_prompts * output_len,
        "peak_concurrent_requests": result.get("max_concurrent_requests"),
    }
    for metric in METRICS:
        key = _METRIC_KEYS[metric]
        out[f"{key}_ms_mean"] = _num(result.get(f"mean_{metric}_ms"))
        for p in PERCENTILES:
            out[f"{key}_ms_p{p}"] = _num(result.get(f"p{p}_{metric}_ms"))
    errors = [e for e in result.get("errors") or [] if e]
    if errors:
        out["error_samples"] = sorted(set(errors))[:3]
    return out


def summary_line(p: dict[str, Any], index: int, total: int) -> str:
    """One progress line for a finished point (values rounded for reading, not for records)."""

    def f(v: Any, nd: int = 1) -> str:
        return "-" if v is None else f"{v:.{nd}f}"

    load = f"C={p['concurrency']}" if p["concurrency"] is not None else f"rate={format_rate(p['offered_rate_rps'])}"
    return (
        f"point {index}/{total} {load} r{p['repeat']}: {p['completed']}/{p['num_prompts']} ok, "
        f"{f(p['achieved_rps'], 2)} req/s, {f(p['output_tok_s'])} out tok/s, "
        f"TTFT p50 {f(p['ttft_ms_p50'], 0)} ms, TPOT p50 {f(p['tpot_ms_p50'], 1)} ms, "
        f"E2E p99 {f(p['e2e_ms_p99'], 0)} ms ({f(p['duration_s'])} s)"
    )
