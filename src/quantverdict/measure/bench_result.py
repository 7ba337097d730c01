"""One sweep point read from ``vllm bench serve --save-result --save-detailed`` JSON: recomputed latencies,
steady-state rates, saturation and validity.

No I/O, so that it is unit-tested on hand-written results. vLLM's JSON is validated where it is read
(:class:`VllmBenchResult`, the sweep client's sidecar :class:`ClientSidecar`); a point comes back as the record's
typed point (:class:`quantverdict.measure.points.SweepPoint`), units in its field names (``ttft_ms_p99``,
``output_tok_s``).

Validity of a point (:func:`parse_result`, from the per-request lists that ``--save-detailed`` writes:
``start_times``, ``ttfts``, ``itls``, ``latencies``, ``output_lens``, ``errors``):

* **output length**: with ``--ignore-eos`` every request must return ``output_len`` tokens;
  ``short_requests`` counts those that did not (failed ones included), and a point whose output tokens
  fall under ``OUTPUT_VALID_FRACTION`` (90%) of those requested is *invalid*
  (:mod:`quantverdict.measure.validity`).
* **request count**: the result must hold exactly ``num_prompts`` requests. vLLM runs its
  ``--num-warmups`` requests before the timed run and leaves them out of every list and rate; a result
  with more entries would mix them in, and is invalid.
* **latencies, recomputed** per request: TTFT; TPOT = (E2E - TTFT) / (n - 1) for n > 1 output tokens;
  ITL = the gaps between streamed chunks after the first (the TTFT is never one of them: a request's
  ``ttft + sum(itl)`` must equal its E2E, else the point is invalid); E2E. Percentiles are numpy's
  default (linear interpolation, :func:`quantverdict.measure.sweep.percentile`). vLLM's own numbers are
  kept as ``vllm_*``.
* **saturation** (open loop, finite rate): :func:`quantverdict.measure.validity.saturation`, decided here once
  per point (completion pace over arrival pace, from the per-request times) and stored in the point; every
  reader takes that decision (:func:`quantverdict.measure.validity.point_saturation`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field

from quantverdict.measure.points import Block, SweepPoint, as_point
from quantverdict.measure.server_metrics import server_checks
from quantverdict.measure.sweep import percentile
from quantverdict.measure.sweep_plan import METRICS, PERCENTILES, format_rate
from quantverdict.measure.sweep_plan import SweepPoint as PlannedPoint
from quantverdict.measure.validity import (
    ITL_SUM_TOLERANCE_S,
    OUTPUT_VALID_FRACTION,
    describe_saturation,
    point_saturation,
    saturation,
)

# vLLM's metric name -> ours (E2EL is vLLM's "end-to-end latency"; we call it E2E)
_METRIC_KEYS = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e"}
STEADY_MIN_COMPLETIONS = 3  # fewer completions inside the steady window: no steady-state rate
# a steady window shorter than this many request lifetimes (the median E2E) gives no steady-state rate: a closed
# loop of requests of one length started together finishes them together, so its completions come in waves and a
# short window sees a wave's phase, not a rate. Measured on an H200 (8B shape, 128 in / 1,024 out, c=256, 512
# requests = two waves): bf16 windows of 0.7-1.2 s (0.04-0.07 lifetimes of 17-19 s) counted 255
# completions each, 216-350 req/s against a whole-run 13.7 req/s; W4A16's of 20-27 s (1.0-1.6 lifetimes) gave
# 10,371-13,814 output tok/s, a 33% spread, where its whole-run repeats spread 8%. Windows of >= 2.87 lifetimes
# (every other GPU point) agree with the whole run within the ramp-up and drain it leaves out (e.g. 2,048 in /
# 128 out, c=256: 1,979-2,057 steady against 2,106-2,111 whole-run output tok/s)
STEADY_MIN_LIFETIMES = 2.0


class VllmBenchResult(Block):
    """``vllm bench serve --save-result --save-detailed`` JSON (``vllm/benchmarks/serve.py``): the keys read here
    typed, the others kept as written. Totals and rates over the run (``duration`` s, ``request_throughput`` req/s,
    ``*_throughput`` tok/s), vLLM's latency statistics ``<stat>_<metric>_ms`` (``mean``, ``p50``/``p90``/``p99`` of
    ``ttft``, ``tpot``, ``itl``, ``e2el``), and per request (``--save-detailed``; seconds): ``start_times``,
    ``ttfts``, ``itls`` (gaps between streamed chunks), ``latencies`` (vLLM 0.32; 0.26 saves none),
    ``output_lens``, ``errors`` (empty for a completed request)."""

    completed: int | None = None
    duration: float | None = None
    failed: int | None = None
    request_throughput: float | None = None
    output_throughput: float | None = None
    total_token_throughput: float | None = None
    total_input_tokens: int | None = None
    total_output_tokens: int | None = None
    max_concurrent_requests: int | None = None
    start_times: list[float] | None = None
    ttfts: list[float | None] | None = None
    itls: list[list[float] | None] | None = None
    latencies: list[float | None] | None = None
    output_lens: list[int] | None = None
    input_lens: list[int] | None = None
    errors: list[str | None] | None = None

    def has_failed(self) -> bool:
        """Whether the result holds ``failed`` (vLLM's count of failed requests; older results lack it)."""
        return "failed" in self.model_fields_set

    def stat_ms(self, stat: str, metric: str) -> float | None:
        """vLLM's ``<stat>_<metric>_ms`` (``stat`` ``mean`` or ``p50``..., ``metric`` one of ``METRICS``), None
        where the result lacks it."""
        value = getattr(self, f"{stat}_{metric}_ms", None)
        return None if value is None else float(value)

    def detailed(self) -> list[list[Any]] | None:
        """The per-request lists ``has_detailed`` checks, or None where one the result holds is not a list."""
        keys = (*_DETAILED, "latencies") if "latencies" in self.model_fields_set else _DETAILED
        lists = [v for v in (getattr(self, k) for k in keys) if isinstance(v, list)]
        return lists if len(lists) == len(keys) else None


class ClientWarmup(Block):
    """``warmup`` of a sidecar: the unmeasured requests the client sent before the point (0: a later repeat)."""

    requests: int | None = None


class PromptRepeats(Block):
    """``prompt_repeats`` of a sidecar: the point's own repeated prompt tokens (the prefix cache may serve them)."""

    repeated_tokens: int | None = None


class ClientSidecar(Block):
    """``<point>.qv.json``, written by the one-process sweep client (``children/sweep_client.py``) beside vLLM's
    result: seeds, the warm-up wave, attempts, its wall time for the point (s), vLLM's ``/metrics`` counters before
    and after (name -> value) and the point's repeated prompt tokens."""

    seed: int | None = None
    warmup_seed: int | None = None
    warmup: ClientWarmup | None = None
    attempts: list[Any] = Field(default_factory=list)
    wall_s: float | None = None
    counters_before: dict[str, float] | None = None
    counters_after: dict[str, float] | None = None
    prompt_repeats: PromptRepeats | None = None


# a vLLM result typed, or its JSON as read (validated by the function it is given to: pydantic.ValidationError)
VllmResult = VllmBenchResult | Mapping[str, Any]


def _dist_ms(values_s: Sequence[float]) -> dict[str, float | None]:
    """``mean`` and ``p50/p90/p99`` of a list in seconds, in ms (percentile of seconds x 1000, as vLLM)."""
    if not values_s:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    return {
        "mean": statistics.fmean(values_s) * 1000.0,
        **{f"p{p}": percentile(values_s, p) * 1000.0 for p in PERCENTILES},
    }


# --- per-request data -------------------------------------------------------------------------------

_DETAILED = ("start_times", "ttfts", "itls", "output_lens")


def has_detailed(result: VllmResult) -> bool:
    """True when ``result`` holds the per-request lists of ``--save-detailed``, all of one length (``latencies``
    too where it is there: vLLM 0.26 does not save it, see :func:`e2e_s`)."""
    lists = VllmBenchResult.of(result).detailed()
    return lists is not None and len({len(v) for v in lists}) == 1


def e2e_s(result: VllmResult) -> list[float]:
    """Each request's E2E latency (s), in the result's order: vLLM's ``latencies`` list where the result has it
    (vLLM 0.32 saves it with ``--save-detailed``), else TTFT + the sum of its ITL gaps (vLLM 0.26 saves ``ttfts``
    and ``itls`` but no ``latencies``). The two are one quantity: in ``endpoint_request_func.py`` the TTFT is the
    first chunk's time after sending, each ITL the gap to the next chunk, and the latency the last chunk's time
    after sending (:func:`parse_result` checks that they agree where both are saved, ``itl_sum_max_err_ms``).
    A failed request (no chunk) gets 0.0, as vLLM records it."""
    r = VllmBenchResult.of(result)
    ttfts, lats = r.ttfts or [], r.latencies
    if lats is not None and len(lats) == len(ttfts):
        return [float(x or 0.0) for x in lats]
    return [float(t or 0.0) + sum(float(x) for x in gaps or []) for t, gaps in zip(ttfts, r.itls or [])]


def completed_requests(result: VllmResult) -> list[int]:
    """Indices of the requests vLLM counted as completed (its ``success`` flag), from ``--save-detailed`` lists:
    the one failed-request rule of the package (percentiles here, goodput in :mod:`.goodput`).

    A request failed when its ``errors`` entry is non-empty (vLLM gives a failed one 0 tokens and an error
    string), or, without an ``errors`` list of the requests' length, when it has no output token."""
    r = VllmBenchResult.of(result)
    n, errors, lens = len(r.ttfts or []), r.errors, r.output_lens or []
    if errors is not None and len(errors) == n:
        return [i for i in range(n) if not errors[i]]
    return [i for i in range(n) if lens[i]]


def latency_samples(result: VllmResult) -> dict[str, list[float]]:
    """The latency samples (seconds) of the completed requests, pooled per metric for its percentiles, from
    ``--save-detailed`` lists (one request at a time: :func:`quantverdict.measure.goodput.request_latencies`).

    Definitions of ``vllm/benchmarks/serve.py`` (``calculate_metrics``) and
    ``benchmarks/lib/endpoint_request_func.py``: TTFT = first streamed chunk - request sent; ITL = the
    gaps between later chunks (the first chunk's wait is the TTFT, never an ITL); E2E = last chunk -
    request sent; TPOT = (E2E - TTFT) / (n - 1) over requests with n > 1 output tokens.

    Returns:
        ``{"ttft": [...], "tpot": [...], "itl": [...] (all requests' gaps, flattened), "e2e": [...]}``.
    """
    r = VllmBenchResult.of(result)
    ok = completed_requests(r)
    ttfts = [float(t or 0.0) for t in r.ttfts or []]
    lats, lens, itls = e2e_s(r), r.output_lens or [], r.itls or []
    return {
        "ttft": [ttfts[i] for i in ok],
        "tpot": [(lats[i] - ttfts[i]) / (lens[i] - 1) for i in ok if lens[i] > 1],
        "itl": [float(x) for i in ok for x in itls[i] or []],
        "e2e": [lats[i] for i in ok],
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


def steady_state(result: VllmResult, closed_loop: bool = False) -> dict[str, Any]:
    """Rates in the steady-state window, ramp-up and drain excluded.

    Window ``(c1, aN]``: from the first completion ``c1`` (before it the server was still filling:
    ramp-up) to the last request sent ``aN`` (after it no request arrives and the server drains). Inside
    it, an open loop receives requests at its offered rate and a closed loop holds exactly its
    concurrency in flight. Counted in the window: completions after the first (``steady_completions``),
    requests sent (``steady_arrivals``) and output tokens streamed (chunk times ``start + TTFT +
    cumulative ITL``; a chunk carries ``n / chunks`` tokens when vLLM bundled tokens). A burst (all
    requests sent at once) or a run whose first request finishes after the last is sent has no window; in a
    ``closed_loop`` a window shorter than ``STEADY_MIN_LIFETIMES`` median E2Es has no rates
    (:func:`steady_too_short`: its completions come in waves; an open loop's arrivals are spread, and an
    overloaded one's lifetimes grow with its queue while its completions keep the server's pace).

    Returns:
        ``steady_window_s``, ``steady_completions``, ``steady_arrivals``, ``steady_rps`` (completions /
        window), ``steady_arrival_rps`` (requests sent / window), ``steady_output_tok_s``; the rates are
        None with ``steady_reason`` when the window is empty, (closed loop) shorter than ``STEADY_MIN_LIFETIMES``
        request lifetimes, or holds fewer than ``STEADY_MIN_COMPLETIONS`` completions.
    """
    none = dict(_STEADY_NONE)
    r = VllmBenchResult.of(result)
    ok = completed_requests(r)
    starts, lats, ttfts, itls, lens = r.start_times or [], e2e_s(r), r.ttfts or [], r.itls or [], r.output_lens or []
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
        times = _token_times(float(starts[i]), float(ttfts[i] or 0.0), itls[i] or [])
        per_chunk = lens[i] / len(times)
        tokens += per_chunk * sum(1 for t in times if c1 < t <= a_last)
    out = {**none, "steady_window_s": width, "steady_completions": comps, "steady_arrivals": arrs}
    short = steady_too_short(width, statistics.median(float(lats[i]) for i in ok)) if closed_loop else None
    if short:
        out["steady_reason"] = short
        return out
    if comps < STEADY_MIN_COMPLETIONS:
        out["steady_reason"] = (
            f"only {comps} completion(s) in the steady window ({width:.3g} s); need {STEADY_MIN_COMPLETIONS}"
        )
        return out
    out.update(steady_rps=comps / width, steady_arrival_rps=arrs / width, steady_output_tok_s=tokens / width)
    return out


def steady_too_short(window_s: float, e2e_p50_s: float | None) -> str | None:
    """Why a steady window of ``window_s`` seconds gives no steady-state rate, or None when it is long enough:
    it must span ``STEADY_MIN_LIFETIMES`` request lifetimes (``e2e_p50_s``, the median E2E in seconds; None or
    0: no lifetime to compare, the window stands)."""
    if not e2e_p50_s or window_s >= STEADY_MIN_LIFETIMES * e2e_p50_s:
        return None
    return (
        f"steady window {window_s:.3g} s is shorter than {STEADY_MIN_LIFETIMES:g} request lifetimes "
        f"(E2E p50 {e2e_p50_s:.3g} s): it sees the phase of the load's waves, not a rate"
    )


def recorded_window_too_short(point: SweepPoint | Mapping[str, Any]) -> str | None:
    """:func:`steady_too_short` for a recorded point: a closed-loop point's stored ``steady_window_s`` against its
    ``e2e_ms_p50``; None for an open-loop point, a point without a window, or one whose window is long enough."""
    pt = as_point(point)
    window, e2e = pt.steady_window_s, pt.e2e_ms_p50
    if pt.concurrency is None or window is None or e2e is None:
        return None
    return steady_too_short(window, e2e / 1000.0)


def rebase_steady(point: SweepPoint) -> SweepPoint:
    """A recorded point with :func:`recorded_window_too_short` applied, for records measured before the rule:
    when it holds, the steady rates become None, ``steady_reason`` says why (checked first, as
    :func:`steady_state` does) and ``throughput_rps`` / ``throughput_tok_s`` are the whole-run ``achieved_rps`` /
    ``output_tok_s`` (``throughput_basis`` ``whole_run``): a copy. Any other point is returned as it is (the same
    object)."""
    short = recorded_window_too_short(point)
    if short is None:
        return point
    steady = {"steady_rps": None, "steady_arrival_rps": None, "steady_output_tok_s": None, "steady_reason": short}
    whole = {"throughput_rps": point.achieved_rps, "throughput_tok_s": point.output_tok_s}
    return point.model_copy(update=steady | whole | {"throughput_basis": "whole_run"})


def _sent_rps(result: VllmBenchResult) -> float | None:
    """Realized arrival rate: (requests - 1) / (last sent - first sent); None for a burst."""
    starts = result.start_times or []
    span = max(starts) - min(starts) if starts else 0.0
    return (len(starts) - 1) / span if len(starts) > 1 and span > 0 else None


# --- one point --------------------------------------------------------------------------------------


def parse_result(
    result: VllmResult,
    point: PlannedPoint,
    num_prompts: int,
    output_len: int | None,
    warmup_requests: int = 0,
) -> SweepPoint:
    """One point's numbers and validity from ``vllm bench serve --save-result --save-detailed`` JSON.

    Source of the definitions: ``vllm/benchmarks/serve.py`` (``calculate_metrics``): TTFT is the
    time to the first streamed token; TPOT = (E2E - TTFT) / (output tokens - 1) per request;
    ITL the gaps between streamed chunks after the first; E2E the request latency; throughputs divide
    by the benchmark duration (first request sent to last response; warm-up requests run before it and
    are in none of the lists), so ``achieved_rps`` = completed / duration_s. With the per-request lists
    the latency percentiles are recomputed here (:func:`latency_samples`,
    :func:`quantverdict.measure.sweep.percentile`) and vLLM's own values kept as
    ``vllm_<metric>_ms_<stat>``; without them vLLM's values are used.

    Args:
        result: the result JSON, as read or typed.
        point: the point it was run for.
        num_prompts: requests sent (``--num-prompts``).
        output_len: output tokens asked per request (``--random-output-len``; exact with ``--ignore-eos``); None
            where each request asks its own (a prompts file's ``output_tokens``): then ``output_tokens_requested``,
            ``short_requests`` and ``output_valid`` are None.
        warmup_requests: ``--num-warmups`` passed to the client (recorded; vLLM excludes them).

    Returns:
        The point (the record's :class:`~quantverdict.measure.points.SweepPoint`): offered_rate_rps (float or
        ``"inf"``), concurrency, repeat, completed, failed,
        duration_s, achieved_rps, output_tok_s, total_tok_s, input_tokens_total, output_tokens_total,
        output_tokens_requested, peak_concurrent_requests, warmup_requests; for each of
        ttft/tpot/itl/e2e ``<m>_ms_mean`` and ``<m>_ms_p50/p90/p99`` (None when absent) and
        ``vllm_<m>_ms_*``; ``metrics_source`` (``recomputed``/``vllm``), ``vllm_max_rel_diff``;
        ``requests_in_result``, ``short_requests``, ``output_valid``, ``itl_sum_max_err_ms``,
        ``itl_per_token`` (one token per streamed chunk); ``sent_rps``; the :func:`steady_state` keys;
        ``throughput_rps``/``throughput_tok_s`` (steady-state when the window has rates, else whole-run);
        the :func:`quantverdict.measure.validity.saturation` keys; ``valid`` and ``invalid_reasons``.

        ``peak_concurrent_requests`` is vLLM's ``max_concurrent_requests``: the most requests active at
        any time within one 1-second bucket (``vllm/benchmarks/serve.py``), so requests that finish and
        start in the same second both count; it reaches about twice ``--max-concurrency`` at high
        request rates (512 at c=256, 128-192 at c=64 on the H200) without the client exceeding the limit.

    Raises:
        KeyError: the JSON lacks ``completed`` or ``duration`` (not a vLLM bench result).
        pydantic.ValidationError: a value of the wrong type (:class:`VllmBenchResult`).
    """
    r = VllmBenchResult.of(result)
    if r.completed is None or r.duration is None:
        raise KeyError("completed" if r.completed is None else "duration")
    out: dict[str, Any] = {
        "point": point.name,
        "offered_rate_rps": point.offered_rate_rps,
        "concurrency": point.concurrency,
        "repeat": point.repeat,
        "num_prompts": num_prompts,
        "warmup_requests": warmup_requests,
        "completed": r.completed,
        "failed": r.failed if r.has_failed() else num_prompts - r.completed,
        "duration_s": r.duration,
        "achieved_rps": r.request_throughput,
        "output_tok_s": r.output_throughput,
        "total_tok_s": r.total_token_throughput,
        "input_tokens_total": r.total_input_tokens,
        "output_tokens_total": r.total_output_tokens,
        "output_tokens_requested": None if output_len is None else num_prompts * output_len,
        "peak_concurrent_requests": r.max_concurrent_requests,
    }
    for metric in METRICS:
        key = _METRIC_KEYS[metric]
        out[f"vllm_{key}_ms_mean"] = r.stat_ms("mean", metric)
        for p in PERCENTILES:
            out[f"vllm_{key}_ms_p{p}"] = r.stat_ms(f"p{p}", metric)
    reasons: list[str] = []
    detailed = has_detailed(r)
    if detailed:
        out["metrics_source"] = "recomputed"
        lat = latency_samples(r)
        diffs = []
        for metric in METRICS:
            key = _METRIC_KEYS[metric]
            for stat, v in _dist_ms(lat[key]).items():
                out[f"{key}_ms_{stat}"] = v
                theirs = out[f"vllm_{key}_ms_{stat}"]
                if v is not None and theirs is not None and max(abs(v), abs(theirs)) > 0:
                    diffs.append(abs(v - theirs) / max(abs(v), abs(theirs)))
        out["vllm_max_rel_diff"] = max(diffs) if diffs else None
        ok = completed_requests(r)
        lens, ttfts, itls = r.output_lens or [], r.ttfts or [], r.itls or []
        out["requests_in_result"] = len(lens)
        out["short_requests"] = None if output_len is None else sum(1 for n in lens if n < output_len)
        saved = "latencies" in r.model_fields_set  # else E2E is TTFT + sum(ITL) by construction (e2e_s)
        lats = e2e_s(r)
        errs = [abs(float(ttfts[i] or 0.0) + sum(itls[i] or []) - lats[i]) for i in ok] if saved else []
        out["itl_sum_max_err_ms"] = max(errs) * 1000.0 if errs else None
        out["e2e_source"] = "vllm latencies" if saved else "ttft + sum(itl) (no latencies in the result)"
        out["itl_per_token"] = all(len(itls[i] or []) == lens[i] - 1 for i in ok)
        out["sent_rps"] = _sent_rps(r)
        steady = steady_state(r, closed_loop=point.concurrency is not None)
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
    use_steady = steady["steady_rps"] is not None
    out["throughput_rps"] = steady["steady_rps"] if use_steady else out["achieved_rps"]
    out["throughput_tok_s"] = steady["steady_output_tok_s"] if use_steady else out["output_tok_s"]
    out["throughput_basis"] = "steady_window" if use_steady else "whole_run"
    out.update(
        saturation(
            point.offered_rate_rps,
            point.concurrency,
            request_times(r) if detailed else None,
            completed=out["completed"],
            duration_s=out["duration_s"],
            e2e_ms_p50=out["e2e_ms_p50"],
        )
    )
    got, want = out["output_tokens_total"], out["output_tokens_requested"]
    out["output_valid"] = None if got is None or want is None else bool(got >= OUTPUT_VALID_FRACTION * want)
    if out["output_valid"] is False:
        reasons.append(
            f"{got:,} of {want:,} requested output tokens ({100 * got / want:.0f}% < "
            f"{100 * OUTPUT_VALID_FRACTION:.0f}%): requests ended early"
        )
    if out["completed"] == 0:
        reasons.append("no request completed")
    out["valid"] = not reasons
    out["invalid_reasons"] = reasons
    errors = [e for e in r.errors or [] if e]
    if errors:
        out["error_samples"] = sorted(set(errors))[:3]
    return SweepPoint.model_validate(out)


def request_times(result: VllmResult) -> dict[str, list[float | None]] | None:
    """Per-request send and finish times in seconds from the first request sent, rounded to 0.1 ms:
    ``{"start_s": [...], "end_s": [...]}`` (end = start + E2E; None for a failed request), in the result's
    order; None without ``--save-detailed`` lists."""
    r = VllmBenchResult.of(result)
    if not has_detailed(r):
        return None
    starts = r.start_times or []
    t0 = min(starts) if starts else 0.0
    ok = set(completed_requests(r))
    lats = e2e_s(r)
    return {
        "start_s": [round(s - t0, 4) for s in starts],
        "end_s": [round(s - t0 + lats[i], 4) if i in ok else None for i, s in enumerate(starts)],
    }


def add_client_side(
    out: SweepPoint,
    side: ClientSidecar | Mapping[str, Any],
    min_duration_s: float = 0.0,
    shared_tokens: int | None = None,
) -> SweepPoint:
    """Complete a parsed point (:func:`parse_result`) with what the one-process sweep client recorded beside
    vLLM's result (``<point>.qv.json``, :mod:`quantverdict.children.sweep_client`); updates ``out`` in place.

    Adds ``seed``, ``warmup_seed``, ``warmup_requests`` (the unmeasured requests of the point's level's warm-up
    wave, when the sidecar says: sent right before the point, or with ``bench.prefetch_prompts`` before the
    sweep; 0 for a later repeat), ``attempts``, ``client_wall_s`` (the client's time for the point: its warm-up
    wave unless that ran before the sweep, cache resets, counter reads, dataset sampling, the measured run),
    ``client_overhead_s`` (wall minus the measured window ``duration_s``), ``min_duration_s`` and ``window_met``
    (``duration_s >= min_duration_s``),
    and the server's counters (:func:`quantverdict.measure.server_metrics.server_checks`, with the point's own
    repeated prompts from ``side["prompt_repeats"]``). Prefix-cache hits beyond those repeats above 1% of the
    tokens looked up, or a server token count 5% away from the client's, make the point invalid (``valid``
    and ``invalid_reasons`` updated).

    Args:
        out: the parsed point; needs ``duration_s``, ``input_tokens_total``, ``output_tokens_total``.
        side: the sidecar (:class:`ClientSidecar`, or its JSON as read).
        min_duration_s: the configured minimum window (``bench.min_duration_s``).
        shared_tokens: prompt tokens the workload shares on purpose (a shared-prefix point's
            :func:`quantverdict.measure.workload.shared_prefix_tokens`): hits up to this many are the traffic's,
            judged like the point's own repeated prompts (the larger of the two is left out of the excess).

    Raises:
        pydantic.ValidationError: a sidecar value of the wrong type.
    """
    sc = ClientSidecar.of(side)
    duration = float(out.duration_s or 0.0)
    out.seed, out.warmup_seed = sc.seed, sc.warmup_seed
    if sc.warmup is not None and sc.warmup.requests is not None:
        out.warmup_requests = sc.warmup.requests  # sent by the client before the point (0: a later repeat)
    out.attempts = len(sc.attempts) or None
    out.client_wall_s = sc.wall_s
    out.client_overhead_s = None if sc.wall_s is None else round(sc.wall_s - duration, 3)
    out.min_duration_s = min_duration_s
    out.window_met = duration >= min_duration_s
    repeated = sc.prompt_repeats.repeated_tokens if sc.prompt_repeats is not None else None
    if shared_tokens is not None:
        repeated = max(repeated or 0, shared_tokens)
    if sc.counters_before is not None and sc.counters_after is not None:
        checks = server_checks(
            sc.counters_before, sc.counters_after, out.input_tokens_total, out.output_tokens_total, repeated
        )
        reasons = checks.pop("server_invalid_reasons")
        for key, value in checks.items():
            setattr(out, key, value)
        if reasons:
            out.invalid_reasons = [*(out.invalid_reasons or []), *reasons]
            out.valid = False
    return out


def summary_line(p: SweepPoint, index: int, total: int) -> str:
    """One progress line for a finished point (values rounded for reading, not for records)."""

    def f(v: float | None, nd: int = 1) -> str:
        return "-" if v is None else f"{v:.{nd}f}"

    load = f"C={p.concurrency}" if p.concurrency is not None else f"rate={format_rate(p.load('rate'))}"
    tags = ""
    if p.prefix_cache_hit_rate is not None:
        tags += f", prefix-cache hits {100 * p.prefix_cache_hit_rate:.1f}%"
        if p.prompt_repeat_rate is not None:
            tags += f" ({100 * p.prompt_repeat_rate:.1f}% of prompt tokens repeat inside the point)"
    sat = point_saturation(p)
    if sat["saturated"]:
        tags += f" SATURATED ({describe_saturation(sat)})"
    if p.valid is False:
        tags += " INVALID (" + "; ".join(p.invalid_reasons or []) + ")"
    return (
        f"point {index}/{total} {load} r{p.repeat}: {p.completed}/{p.num_prompts} ok, "
        f"{f(p.achieved_rps, 2)} req/s, {f(p.output_tok_s)} out tok/s, "
        f"TTFT p50 {f(p.ttft_ms_p50, 0)} ms, TPOT p50 {f(p.tpot_ms_p50, 1)} ms, "
        f"E2E p99 {f(p.e2e_ms_p99, 0)} ms ({f(p.duration_s)} s){tags}"
    )
