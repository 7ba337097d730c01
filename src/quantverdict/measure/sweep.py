"""Pure helpers of the serving sweep: which points to run, how to read vLLM's result JSON, and whether a
point's numbers can be trusted.

No I/O and no third-party import but numpy, so that they are unit-tested on hand-written results (and the
review, which reads records, uses the same code).

A *point* is one run of ``vllm bench serve``: an offered load (open loop: a Poisson request rate,
``inf`` = all requests at t=0; closed loop: a fixed number of requests in flight) and a repeat
index. Its parsed form keeps units in key names (``ttft_ms_p99``, ``output_tok_s``).

Validity of a point (:func:`parse_result`, from the per-request lists that ``--save-detailed`` writes:
``start_times``, ``ttfts``, ``itls``, ``latencies``, ``output_lens``, ``errors``):

* **output length**: with ``--ignore-eos`` every request must return ``output_len`` tokens;
  ``short_requests`` counts those that did not (failed ones included), and a point whose output tokens
  fall under ``OUTPUT_VALID_FRACTION`` (90%) of those requested is *invalid*: kept in the record,
  flagged, never averaged into a summary or a ceiling.
* **request count**: the result must hold exactly ``num_prompts`` requests. vLLM runs its
  ``--num-warmups`` requests before the timed run and leaves them out of every list and rate; a result
  with more entries would mix them in, and is invalid.
* **latencies, recomputed** per request: TTFT; TPOT = (E2E - TTFT) / (n - 1) for n > 1 output tokens;
  ITL = the gaps between streamed chunks after the first (the TTFT is never one of them: a request's
  ``ttft + sum(itl)`` must equal its E2E, else the point is invalid); E2E. Percentiles are numpy's
  default (linear interpolation, :func:`percentile`). vLLM's own numbers are kept as ``vllm_*``.
* **saturation** (open loop, finite rate): a point whose achieved rate is under ``SATURATION_FRACTION``
  (90%) of the offered rate did not reach its target and is *saturated*. The comparison is made in the
  steady-state window when there is one (:func:`steady_state`), else over the whole run. An infinite
  rate (a burst: a capacity probe) and a closed loop (no offered rate) are never marked saturated.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from quantverdict.measure import aggregate

INF = "inf"  # how an infinite offered rate is written everywhere (vLLM's own result JSON does the same)
METRICS = ("ttft", "tpot", "itl", "e2el")  # passed to --percentile-metrics
PERCENTILES = (50, 90, 99)  # passed to --metric-percentiles
# vLLM's metric name -> ours (E2EL is vLLM's "end-to-end latency"; we call it E2E)
_METRIC_KEYS = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e"}

SATURATION_FRACTION = 0.9  # achieved < 0.9 x offered: the point did not reach its target
OUTPUT_VALID_FRACTION = 0.9  # output tokens < 0.9 x requested: the point is invalid
STEADY_MIN_COMPLETIONS = 3  # fewer completions inside the steady window: no steady-state rate
# |TTFT + sum(ITL) - E2E| above this for any request: its ITL list is not the gaps after the first token
ITL_SUM_TOLERANCE_S = 1e-4
VLLM_AGREEMENT_TOLERANCE = 0.01  # our recomputed percentiles vs vLLM's: relative difference flagged above 1%
# per load level: median and spread (min, max) over the valid repeats
SUMMARY_METRICS = (
    "achieved_rps",
    "output_tok_s",
    "steady_rps",
    "steady_output_tok_s",
    "throughput_rps",
    "throughput_tok_s",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "itl_ms_p50",
    "itl_ms_p99",
    "tpot_ms_p50",
    "e2e_ms_p50",
    "e2e_ms_p99",
)


def prompts_for(num_prompts: int, prompts_per_concurrency: int | None, concurrency: int | None) -> int:
    """Requests sent at one point: ``max(num_prompts, prompts_per_concurrency * concurrency)`` in a
    concurrency sweep with ``prompts_per_concurrency`` set, else ``num_prompts``.

    E.g. num_prompts 16, 4 per concurrency: c=1 -> 16, c=64 -> 256, c=256 -> 1024 (four full waves).
    """
    if prompts_per_concurrency and concurrency:
        return max(num_prompts, prompts_per_concurrency * concurrency)
    return num_prompts


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


def is_inf_rate(rate: Any) -> bool:
    """True for an infinite offered rate (``"inf"``, ``float("inf")``, or None as older records wrote it)."""
    return rate is None or rate == INF or (isinstance(rate, float) and math.isinf(rate))


# --- percentiles ------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """``numpy.percentile(values, q)`` with numpy's default ``method="linear"`` (Hyndman & Fan type 7).

    Sorted values ``x[0..n-1]``; rank ``r = (q / 100) * (n - 1)``; result
    ``x[floor(r)] + (x[floor(r) + 1] - x[floor(r)]) * (r - floor(r))``. vLLM's ``calculate_metrics``
    calls ``np.percentile`` the same way, so its percentiles and ours agree on the same list.

    Args:
        values: the sample (any order, >= 1 value).
        q: percentile in [0, 100].

    Raises:
        ValueError: empty ``values`` or ``q`` outside [0, 100].
    """
    if not len(values):
        raise ValueError("percentile of an empty list")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q={q} must be in [0, 100]")
    return float(np.percentile(np.asarray(values, dtype=float), q))


def _dist_ms(values_s: Sequence[float]) -> dict[str, float | None]:
    """``mean`` and ``p50/p90/p99`` of a list in seconds, in ms (percentile of seconds x 1000, as vLLM)."""
    if not values_s:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    return {
        "mean": statistics.fmean(values_s) * 1000.0,
        **{f"p{p}": percentile(values_s, p) * 1000.0 for p in PERCENTILES},
    }


# --- per-request data -------------------------------------------------------------------------------

_DETAILED = ("start_times", "ttfts", "itls", "latencies", "output_lens")


def has_detailed(result: dict[str, Any]) -> bool:
    """True when ``result`` holds the per-request lists of ``--save-detailed``, all of one length."""
    lists = [v for v in (result.get(k) for k in _DETAILED) if isinstance(v, list)]
    return len(lists) == len(_DETAILED) and len({len(v) for v in lists}) == 1


def _successful(result: dict[str, Any]) -> list[int]:
    """Indices of the requests vLLM counted as completed: no error (vLLM gives a failed one 0 tokens and
    an error string)."""
    n = len(result["ttfts"])
    errors = result.get("errors")
    if isinstance(errors, list) and len(errors) == n:
        return [i for i in range(n) if not errors[i]]
    return [i for i in range(n) if result["output_lens"][i]]


def request_latencies(result: dict[str, Any]) -> dict[str, list[float]]:
    """Per-request latencies (seconds) of the completed requests, from ``--save-detailed`` lists.

    Definitions of ``vllm/benchmarks/serve.py`` (``calculate_metrics``) and
    ``benchmarks/lib/endpoint_request_func.py``: TTFT = first streamed chunk - request sent; ITL = the
    gaps between later chunks (the first chunk's wait is the TTFT, never an ITL); E2E = last chunk -
    request sent; TPOT = (E2E - TTFT) / (n - 1) over requests with n > 1 output tokens.

    Returns:
        ``{"ttft": [...], "tpot": [...], "itl": [...] (all requests' gaps, flattened), "e2e": [...]}``.
    """
    ok = _successful(result)
    ttfts, lats, lens, itls = result["ttfts"], result["latencies"], result["output_lens"], result["itls"]
    return {
        "ttft": [float(ttfts[i]) for i in ok],
        "tpot": [(float(lats[i]) - float(ttfts[i])) / (int(lens[i]) - 1) for i in ok if int(lens[i]) > 1],
        "itl": [float(x) for i in ok for x in itls[i]],
        "e2e": [float(lats[i]) for i in ok],
    }


def _token_times(start: float, ttft: float, itl: Sequence[float]) -> list[float]:
    """Arrival time of each streamed chunk: ``start + ttft``, then each ITL gap added."""
    t = start + ttft
    out = [t]
    for gap in itl:
        t += gap
        out.append(t)
    return out


_STEADY_NONE: dict[str, Any] = {
    "steady_window_s": None,
    "steady_completions": None,
    "steady_arrivals": None,
    "steady_rps": None,
    "steady_arrival_rps": None,
    "steady_output_tok_s": None,
}


def steady_state(result: dict[str, Any]) -> dict[str, Any]:
    """Rates in the steady-state window, ramp-up and drain excluded.

    Window ``(c1, aN]``: from the first completion ``c1`` (before it the server was still filling:
    ramp-up) to the last request sent ``aN`` (after it no request arrives and the server drains). Inside
    it, an open loop receives requests at its offered rate and a closed loop holds exactly its
    concurrency in flight. Counted in the window: completions after the first (``steady_completions``),
    requests sent (``steady_arrivals``) and output tokens streamed (chunk times ``start + TTFT +
    cumulative ITL``; a chunk carries ``n / chunks`` tokens when vLLM bundled tokens). A burst (all
    requests sent at once) or a run whose first request finishes after the last is sent has no window.

    Returns:
        ``steady_window_s``, ``steady_completions``, ``steady_arrivals``, ``steady_rps`` (completions /
        window), ``steady_arrival_rps`` (requests sent / window), ``steady_output_tok_s``; the rates are
        None with ``steady_reason`` when the window is empty or holds fewer than
        ``STEADY_MIN_COMPLETIONS`` completions.
    """
    none = dict(_STEADY_NONE)
    ok = _successful(result)
    starts, lats = result["start_times"], result["latencies"]
    if not ok or not starts:
        return {**none, "steady_reason": "no completed request"}
    c1 = min(float(starts[i]) + float(lats[i]) for i in ok)
    a_last = max(float(s) for s in starts)
    width = a_last - c1
    if width <= 0:
        return {
            **none,
            "steady_reason": "no steady state: every request was sent before the first one completed "
            "(a burst, or too few requests for the offered rate)",
        }
    comps = sum(1 for i in ok if c1 < float(starts[i]) + float(lats[i]) <= a_last)
    arrs = sum(1 for s in starts if c1 < float(s) <= a_last)
    tokens = 0.0
    for i in ok:
        times = _token_times(float(starts[i]), float(result["ttfts"][i]), result["itls"][i])
        per_chunk = int(result["output_lens"][i]) / len(times)
        tokens += per_chunk * sum(1 for t in times if c1 < t <= a_last)
    out = {**none, "steady_window_s": width, "steady_completions": comps, "steady_arrivals": arrs}
    if comps < STEADY_MIN_COMPLETIONS:
        out["steady_reason"] = (
            f"only {comps} completion(s) in the steady window ({width:.3g} s); need {STEADY_MIN_COMPLETIONS}"
        )
        return out
    out.update(steady_rps=comps / width, steady_arrival_rps=arrs / width, steady_output_tok_s=tokens / width)
    return out


def _sent_rps(result: dict[str, Any]) -> float | None:
    """Realized arrival rate: (requests - 1) / (last sent - first sent); None for a burst."""
    starts = [float(s) for s in result["start_times"]]
    span = max(starts) - min(starts) if starts else 0.0
    return (len(starts) - 1) / span if len(starts) > 1 and span > 0 else None


def saturation(point: SweepPoint, achieved_rps: float | None, steady: dict[str, Any]) -> dict[str, Any]:
    """Did an open-loop point reach its offered rate?

    ``saturation_ratio`` = achieved / offered: in the steady window, completions over requests sent there
    (``steady_rps / steady_arrival_rps``: both counted on the same arrivals, so the Poisson noise of a
    short run cancels); without a window, vLLM's whole-run ``completed / duration`` over the configured
    rate (which also counts ramp-up and drain, so a short run reads low). ``saturated`` when the ratio
    is under ``SATURATION_FRACTION``; None for an infinite rate or a closed loop.

    Returns:
        ``{"saturated", "saturation_ratio", "saturation_basis"}``; basis ``steady_window``,
        ``whole_run``, ``closed_loop`` or ``burst``.
    """
    if point.concurrency is not None:
        return {"saturated": None, "saturation_ratio": None, "saturation_basis": "closed_loop"}
    if is_inf_rate(point.offered_rate_rps):
        return {"saturated": None, "saturation_ratio": None, "saturation_basis": "burst"}
    if steady.get("steady_rps") is not None and steady.get("steady_arrival_rps"):
        ratio, basis = steady["steady_rps"] / steady["steady_arrival_rps"], "steady_window"
    elif achieved_rps is not None:
        ratio, basis = achieved_rps / float(point.offered_rate_rps), "whole_run"
    else:
        return {"saturated": None, "saturation_ratio": None, "saturation_basis": "unknown"}
    return {"saturated": ratio < SATURATION_FRACTION, "saturation_ratio": ratio, "saturation_basis": basis}


# --- one point --------------------------------------------------------------------------------------


def parse_result(
    result: dict[str, Any],
    point: SweepPoint,
    num_prompts: int,
    output_len: int,
    warmup_requests: int = 0,
) -> dict[str, Any]:
    """One point's numbers and validity from ``vllm bench serve --save-result --save-detailed`` JSON.

    Source of the definitions: ``vllm/benchmarks/serve.py`` (``calculate_metrics``): TTFT is the
    time to the first streamed token; TPOT = (E2E - TTFT) / (output tokens - 1) per request;
    ITL the gaps between streamed chunks after the first; E2E the request latency; throughputs divide
    by the benchmark duration (first request sent to last response; warm-up requests run before it and
    are in none of the lists), so ``achieved_rps`` = completed / duration_s. With the per-request lists
    the latency percentiles are recomputed here (:func:`request_latencies`, :func:`percentile`) and
    vLLM's own values kept as ``vllm_<metric>_ms_<stat>``; without them vLLM's values are used.

    Args:
        result: the parsed result JSON.
        point: the point it was run for.
        num_prompts: requests sent (``--num-prompts``).
        output_len: output tokens asked per request (``--random-output-len``; exact with ``--ignore-eos``).
        warmup_requests: ``--num-warmups`` passed to the client (recorded; vLLM excludes them).

    Returns:
        Flat dict: offered_rate_rps (float or ``"inf"``), concurrency, repeat, completed, failed,
        duration_s, achieved_rps, output_tok_s, total_tok_s, input_tokens_total, output_tokens_total,
        output_tokens_requested, peak_concurrent_requests, warmup_requests; for each of
        ttft/tpot/itl/e2e ``<m>_ms_mean`` and ``<m>_ms_p50/p90/p99`` (None when absent) and
        ``vllm_<m>_ms_*``; ``metrics_source`` (``recomputed``/``vllm``), ``vllm_max_rel_diff``;
        ``requests_in_result``, ``short_requests``, ``output_valid``, ``itl_sum_max_err_ms``,
        ``itl_per_token`` (one token per streamed chunk); ``sent_rps``; the :func:`steady_state` keys;
        ``throughput_rps``/``throughput_tok_s`` (steady-state when there is a window, else whole-run);
        the :func:`saturation` keys; ``valid`` and ``invalid_reasons``.

        ``peak_concurrent_requests`` is vLLM's ``max_concurrent_requests``: the most requests active at
        any time within one 1-second bucket (``vllm/benchmarks/serve.py``), so requests that finish and
        start in the same second both count; it reaches about twice ``--max-concurrency`` at high
        request rates (512 at c=256, 128-192 at c=64 on the H200) without the client exceeding the limit.

    Raises:
        KeyError: the JSON lacks ``completed`` or ``duration`` (not a vLLM bench result).
    """
    out: dict[str, Any] = {
        "point": point.name,
        "offered_rate_rps": point.offered_rate_rps,
        "concurrency": point.concurrency,
        "repeat": point.repeat,
        "num_prompts": num_prompts,
        "warmup_requests": warmup_requests,
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
        out[f"vllm_{key}_ms_mean"] = _num(result.get(f"mean_{metric}_ms"))
        for p in PERCENTILES:
            out[f"vllm_{key}_ms_p{p}"] = _num(result.get(f"p{p}_{metric}_ms"))
    reasons: list[str] = []
    detailed = has_detailed(result)
    if detailed:
        out["metrics_source"] = "recomputed"
        lat = request_latencies(result)
        diffs = []
        for metric in METRICS:
            key = _METRIC_KEYS[metric]
            for stat, v in _dist_ms(lat[key]).items():
                out[f"{key}_ms_{stat}"] = v
                theirs = out[f"vllm_{key}_ms_{stat}"]
                if v is not None and theirs is not None and max(abs(v), abs(theirs)) > 0:
                    diffs.append(abs(v - theirs) / max(abs(v), abs(theirs)))
        out["vllm_max_rel_diff"] = max(diffs) if diffs else None
        ok = _successful(result)
        lens = [int(x) for x in result["output_lens"]]
        out["requests_in_result"] = len(lens)
        out["short_requests"] = sum(1 for n in lens if n < output_len)
        errs = [
            abs(float(result["ttfts"][i]) + sum(float(x) for x in result["itls"][i]) - float(result["latencies"][i]))
            for i in ok
        ]
        out["itl_sum_max_err_ms"] = max(errs) * 1000.0 if errs else None
        out["itl_per_token"] = all(len(result["itls"][i]) == lens[i] - 1 for i in ok)
        out["sent_rps"] = _sent_rps(result)
        steady = steady_state(result)
        if len(lens) != num_prompts:
            reasons.append(f"{len(lens)} requests in the result, {num_prompts} sent (warm-up requests mixed in?)")
        if errs and max(errs) > ITL_SUM_TOLERANCE_S:
            reasons.append(
                f"TTFT + sum(ITL) differs from E2E by up to {max(errs) * 1000:.1f} ms: the ITL lists are not "
                "the gaps after the first token"
            )
    else:
        out["metrics_source"] = "vllm"
        for metric in METRICS:
            key = _METRIC_KEYS[metric]
            for stat in ("mean", *(f"p{p}" for p in PERCENTILES)):
                out[f"{key}_ms_{stat}"] = out[f"vllm_{key}_ms_{stat}"]
        out.update(vllm_max_rel_diff=None, requests_in_result=None, short_requests=None)
        out.update(itl_sum_max_err_ms=None, itl_per_token=None, sent_rps=None)
        steady = {**_STEADY_NONE, "steady_reason": "no per-request data (--save-detailed)"}
    out.update(steady)
    use_steady = steady.get("steady_rps") is not None
    out["throughput_rps"] = steady["steady_rps"] if use_steady else out["achieved_rps"]
    out["throughput_tok_s"] = steady["steady_output_tok_s"] if use_steady else out["output_tok_s"]
    out["throughput_basis"] = "steady_window" if use_steady else "whole_run"
    out.update(saturation(point, out["achieved_rps"], steady))
    got, want = out["output_tokens_total"], out["output_tokens_requested"]
    out["output_valid"] = None if got is None else bool(got >= OUTPUT_VALID_FRACTION * want)
    if out["output_valid"] is False:
        reasons.append(
            f"{got:,} of {want:,} requested output tokens ({100 * got / want:.0f}% < "
            f"{100 * OUTPUT_VALID_FRACTION:.0f}%): requests ended early"
        )
    if out["completed"] == 0:
        reasons.append("no request completed")
    out["valid"] = not reasons
    out["invalid_reasons"] = reasons
    errors = [e for e in result.get("errors") or [] if e]
    if errors:
        out["error_samples"] = sorted(set(errors))[:3]
    return out


# --- validity of records written before these keys existed, and summaries ---------------------------


def point_valid(p: dict[str, Any]) -> bool:
    """A parsed point's ``valid``; for older records (no key): output tokens >= 90% of those requested
    and at least one request completed."""
    if "valid" in p:
        return bool(p["valid"])
    want, got = p.get("output_tokens_requested"), p.get("output_tokens_total")
    if want and got is not None and got < OUTPUT_VALID_FRACTION * want:
        return False
    return p.get("completed") != 0


def point_saturated(p: dict[str, Any]) -> bool | None:
    """A parsed point's ``saturated``; for older records: whole-run achieved < 90% of a finite offered rate."""
    if "saturated" in p:
        return p["saturated"]
    if p.get("concurrency") is not None or is_inf_rate(p.get("offered_rate_rps")) or p.get("achieved_rps") is None:
        return None
    return bool(p["achieved_rps"] < SATURATION_FRACTION * float(p["offered_rate_rps"]))


def load_of(p: dict[str, Any], mode: str) -> float:
    """Sort key of a point's load level: its concurrency (closed loop) or offered req/s (inf last)."""
    if mode == "concurrency":
        return float(p.get("concurrency") or 0)
    r = p.get("offered_rate_rps")
    return math.inf if r is None or is_inf_rate(r) else float(r)


def spread(values: Sequence[float]) -> dict[str, Any] | None:
    """``{"median", "min", "max", "n"}`` of the values (median of an even count: mean of the middle two);
    None for an empty list."""
    vals = [float(v) for v in values]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def summarize(points: list[dict[str, Any]], mode: str = "rate") -> list[dict[str, Any]]:
    """One entry per load level: median and spread of each ``SUMMARY_METRICS`` over its valid repeats.

    Invalid points (:func:`point_valid`) are counted and named, never summarized. A level is
    ``saturated`` when most of its valid repeats are (None when none can be: burst or closed loop).

    Args:
        points: parsed points (:func:`parse_result`), any order, repeats included.
        mode: ``rate`` or ``concurrency`` (the load a level is keyed by).

    Returns:
        Sorted by load: ``{"offered_rate_rps", "concurrency", "repeats", "valid_repeats",
        "invalid_points", "saturated_repeats", "saturated", "metrics": {metric: spread or None}}``.
    """
    out = []
    for level in aggregate.levels(points, lambda p: load_of(p, mode), point_valid):
        load, ps, valid = level.load, level.points, level.valid
        sat = [point_saturated(p) for p in valid]
        out.append(
            {
                "offered_rate_rps": INF if math.isinf(load) else ps[0].get("offered_rate_rps"),
                "concurrency": ps[0].get("concurrency"),
                "repeats": len(ps),
                "valid_repeats": len(valid),
                "invalid_points": [str(p.get("point", f"r{p.get('repeat')}")) for p in ps if not point_valid(p)],
                "saturated_repeats": sum(1 for s in sat if s),
                "saturated": aggregate.majority(sat),
                "metrics": {
                    m: spread([p[m] for p in valid if isinstance(p.get(m), (int, float))]) for m in SUMMARY_METRICS
                },
            }
        )
    return out


def _throughput(level: dict[str, Any], key: str, fallback: str) -> dict[str, Any] | None:
    return level["metrics"].get(key) or level["metrics"].get(fallback)


def sustained_ceiling(summary: list[dict[str, Any]], mode: str = "rate") -> dict[str, Any]:
    """The highest throughput the server sustained, with its spread over repeats.

    Definition. Open loop: among the load levels the server could not keep up with (``saturated``)
    and the infinite-rate burst, the one with the highest median ``throughput_tok_s`` (steady-state
    output tok/s when the level had a steady window, else whole-run); ``kind = "saturated"``. If no
    level saturated and there was no burst, the ceiling is above the sweep: the highest valid level is
    reported as ``kind = "lower_bound"``. Closed loop: the concurrency with the highest median
    throughput, ``kind = "closed_loop_max"``. Invalid points never count.

    Returns:
        ``{"kind", "offered_rate_rps", "concurrency", "rps", "rps_min", "rps_max", "output_tok_s",
        "output_tok_s_min", "output_tok_s_max", "repeats"}``, or ``{"kind": "none", "reason"}``.
    """
    valid = [lv for lv in summary if lv["valid_repeats"] > 0 and _throughput(lv, "throughput_tok_s", "output_tok_s")]
    if not valid:
        return {"kind": "none", "reason": "no valid sweep point"}
    if mode == "concurrency":
        cands, kind = valid, "closed_loop_max"
    else:
        cands = [lv for lv in valid if lv["saturated"] or is_inf_rate(lv["offered_rate_rps"])]
        kind = "saturated"
        if not cands:
            cands, kind = valid, "lower_bound"
    best = max(cands, key=lambda lv: (_throughput(lv, "throughput_tok_s", "output_tok_s") or {})["median"])
    tok = _throughput(best, "throughput_tok_s", "output_tok_s") or {}
    rps = _throughput(best, "throughput_rps", "achieved_rps") or {}
    return {
        "kind": kind,
        "offered_rate_rps": best["offered_rate_rps"],
        "concurrency": best["concurrency"],
        "rps": rps.get("median"),
        "rps_min": rps.get("min"),
        "rps_max": rps.get("max"),
        "output_tok_s": tok.get("median"),
        "output_tok_s_min": tok.get("min"),
        "output_tok_s_max": tok.get("max"),
        "repeats": tok.get("n"),
    }


def saturation_overruled(offered_rate_rps: Any, ceiling: dict[str, Any]) -> str | None:
    """Why a finite offered rate cannot be saturated, given the server's sustained ceiling; None when it can.

    A server that sustained ``ceiling["rps"]`` req/s (at the burst or a higher rate) keeps up with any
    offered rate under ``SATURATION_FRACTION`` of it: an achieved rate under 90% of such a rate comes from
    the run being short (ramp-up and drain inside the timed window, and the count of a few requests:
    one completion of 8 is 12.5%), not from the server falling behind. Without this rule a review could
    call w8a8 "saturated at 1 req/s (0.82 achieved)" next to a ceiling of 2.20 req/s.
    """
    rps = ceiling.get("rps")
    if is_inf_rate(offered_rate_rps) or offered_rate_rps is None or not rps or ceiling.get("kind") != "saturated":
        return None
    if float(offered_rate_rps) >= SATURATION_FRACTION * float(rps):
        return None
    where = "the burst" if is_inf_rate(ceiling.get("offered_rate_rps")) else f"{ceiling.get('offered_rate_rps')} req/s"
    return (
        f"not saturated: the server sustained {float(rps):.2f} req/s at {where}, so its shortfall at "
        f"{float(offered_rate_rps):g} req/s is the short run (ramp-up, drain, few requests), not a full server"
    )


def consistent_saturation(summary: list[dict[str, Any]], mode: str = "rate") -> list[dict[str, Any]]:
    """``summary`` (:func:`summarize`) with ``saturated`` cleared on levels whose offered rate is under 90%
    of the sustained ceiling of the others (:func:`saturation_overruled`, reason in ``saturation_note``).
    Closed loops are returned as they are. Use before :func:`sustained_ceiling` and any "saturated" label."""
    if mode != "rate":
        return summary
    ceiling = sustained_ceiling(summary, mode)
    out = []
    for lv in summary:
        note = saturation_overruled(lv["offered_rate_rps"], ceiling) if lv["saturated"] else None
        out.append({**lv, "saturated": False, "saturation_note": note} if note else lv)
    return out


# --- which kernel served the scheme -----------------------------------------------------------------


def kernel_check(label: str, server: dict[str, Any] | None, activation_quantized: bool) -> dict[str, Any]:
    """Whether a scheme's speed is that of its own kernels, from the vLLM server log parse.

    A scheme that quantizes activations (W8A8, FP8_DYNAMIC) but ran on a weight-only or emulated path
    (``server["fallback"]``, see :func:`quantverdict.measure.vllm_log.parse`; e.g. FP8 on a GPU without FP8
    tensor cores runs "Weight-only FP8 compression ... Marlin") is relabelled
    ``"<label> (weight-only fallback)"`` (``"(emulated)"`` for an emulation kernel) and is not
    comparable for speed with the scheme it is named after.

    Args:
        label: the scheme's label (``FP8_DYNAMIC``).
        server: ``vllm_log.parse`` of the server log, or None.
        activation_quantized: whether the scheme quantizes activations.

    Returns:
        ``{"scheme_label", "effective_label", "comparable_for_speed" (True/False, None when unknown),
        "kernels" (["Kernel (method)"]), "reason"}``.
    """
    kernels = [
        f"{k.get('kernel')} ({k.get('method')})" if isinstance(k, dict) else str(k)
        for k in (server or {}).get("kernels") or []
    ]
    out = {"scheme_label": label, "effective_label": label, "kernels": kernels}
    if not server:
        return {**out, "comparable_for_speed": None, "reason": "no vLLM server log parsed: kernel unknown"}
    if server.get("fallback"):
        emulated = any("emulat" in k.lower() for k in kernels) or any(
            "emulat" in line.lower() for line in server.get("fallback_lines") or []
        )
        what = "emulated" if emulated else "weight-only fallback"
        why = "; ".join(server.get("fallback_lines") or []) or ", ".join(kernels) or "fallback reported"
        return {**out, "effective_label": f"{label} ({what})", "comparable_for_speed": False, "reason": why}
    if activation_quantized and not kernels:
        return {
            **out,
            "comparable_for_speed": None,
            "reason": "activation-quantized scheme, but the server log names no linear kernel: kernel unknown",
        }
    why = ", ".join(kernels) if kernels else "unquantized: vLLM's default GEMM"
    return {**out, "comparable_for_speed": True, "reason": why}


def summary_line(p: dict[str, Any], index: int, total: int) -> str:
    """One progress line for a finished point (values rounded for reading, not for records)."""

    def f(v: Any, nd: int = 1) -> str:
        return "-" if v is None else f"{v:.{nd}f}"

    load = f"C={p['concurrency']}" if p["concurrency"] is not None else f"rate={format_rate(p['offered_rate_rps'])}"
    tags = ""
    if p.get("saturated"):
        tags += " SATURATED"
    if p.get("valid") is False:
        tags += " INVALID (" + "; ".join(p.get("invalid_reasons") or []) + ")"
    return (
        f"point {index}/{total} {load} r{p['repeat']}: {p['completed']}/{p['num_prompts']} ok, "
        f"{f(p['achieved_rps'], 2)} req/s, {f(p['output_tok_s'])} out tok/s, "
        f"TTFT p50 {f(p['ttft_ms_p50'], 0)} ms, TPOT p50 {f(p['tpot_ms_p50'], 1)} ms, "
        f"E2E p99 {f(p['e2e_ms_p99'], 0)} ms ({f(p['duration_s'])} s){tags}"
    )
