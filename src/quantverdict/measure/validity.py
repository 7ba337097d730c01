"""Whether a sweep point's numbers count: its output length (valid) and whether the server kept up with its
offered rate (saturated), also for records written before those keys existed.

* **output length**: with ``--ignore-eos`` every request must return ``output_len`` tokens; a point
  whose output tokens fall under ``OUTPUT_VALID_FRACTION`` (90%) of those requested is *invalid*: kept in
  the record, flagged, never averaged into a summary or a ceiling (the other reasons a point is invalid
  are found where its result is read, :func:`quantverdict.measure.bench_result.parse_result`).
* **saturation** (open loop, finite rate): one rule, :func:`saturation`, decided once per point when its
  result is read and stored in the point (``saturated``, ``saturation_ratio``, ``saturation_basis``); the
  live log, the record's per-load summary and ceiling, the grid table and the review all read that stored
  decision (:func:`point_saturation`). A record written before the rule gets it from
  :func:`older_point_saturation`, the one place that derives it. An infinite rate (a burst: a capacity
  probe) and a closed loop (no offered rate) are never marked saturated.

Pure (standard library; a point is typed by :mod:`quantverdict.measure.points`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from quantverdict.measure.points import SweepPoint, as_point
from quantverdict.measure.sweep_plan import is_inf_rate

SATURATION_FRACTION = 0.9  # completion pace < 0.9 x arrival pace: the server did not keep up (saturation)
OUTPUT_VALID_FRACTION = 0.9  # output tokens < 0.9 x requested: the point is invalid
# |TTFT + sum(ITL) - E2E| above this for any request: its ITL list is not the gaps after the first token
ITL_SUM_TOLERANCE_S = 1e-4
VLLM_AGREEMENT_TOLERANCE = 0.01  # our recomputed percentiles vs vLLM's: relative difference flagged above 1%


# the bases a point's stored decision may have under the rule of :func:`saturation`; any other (``steady_window``,
# ``whole_run``, ``unknown``: records written before it) is derived again by :func:`older_point_saturation`
ARRIVAL_PACE = "arrival_pace"  # per-request send and finish times
ESTIMATED_PACE = "estimated_pace"  # no per-request times: the whole run less one request lifetime
RULE_BASES = (ARRIVAL_PACE, ESTIMATED_PACE, "too_few_requests", "burst", "closed_loop")


class Saturation(TypedDict):
    """A point's saturation decision (:func:`saturation`), as the point stores it: ``saturated`` (None where it
    cannot be decided), ``saturation_ratio`` (completion pace over arrival pace, None without one) and
    ``saturation_basis`` (one of ``RULE_BASES``, or an older record's basis)."""

    saturated: bool | None
    saturation_ratio: float | None
    saturation_basis: str | None


def _pace(times: list[float]) -> float | None:
    """Events per second between the first and the last of ``times``: ``(n - 1) / (last - first)``; None for
    fewer than two events or no time between them."""
    if len(times) < 2 or max(times) <= min(times):
        return None
    return (len(times) - 1) / (max(times) - min(times))


def saturation(
    offered_rate_rps: float | str | None,
    concurrency: int | None,
    request_times: Mapping[str, Sequence[float | None]] | None,
    *,
    completed: int | None,
    duration_s: float | None,
    e2e_ms_p50: float | None,
) -> Saturation:
    """Did the server keep up with an open-loop point's offered rate? The one saturation rule of the package.

    Rule: ``saturation_ratio`` = the pace at which requests completed over the pace at which they were sent;
    ``saturated`` when it is under ``SATURATION_FRACTION`` (0.9). A server that keeps up finishes each request
    about one request lifetime after it was sent, so its completions follow the arrivals at their pace (ratio
    about 1, above 1 when it drains a batch at once); one that cannot queues them and completes at its own
    capacity, below the arrival pace (ratio = capacity / offered rate).

    Basis, in order:

    * ``arrival_pace`` (per-request times, ``--save-detailed``): completion pace = (completions - 1) / (last
      finish - first finish), arrival pace = (requests - 1) / (last sent - first sent), both from the same
      requests, so the ramp-up (nothing finishes during the first lifetime), the drain (nothing is sent
      during the last) and the Poisson noise of the realized arrivals all cancel.
    * ``estimated_pace`` (no per-request times: older results): (completed - 1) / (duration - E2E p50)
      over the offered rate; the duration less one typical lifetime stands for the span of the completions.
      A queue raises the E2E p50, so this reads a saturated point somewhat high (conservative: it calls fewer
      points saturated than the per-request pace).
    * ``too_few_requests``: neither can be measured (fewer than two completions, or no time between them);
      ``saturated`` None.

    Why not achieved / offered over the whole run (vLLM's ``request_throughput``): the whole run counts the
    ramp-up and the drain, so a short run reads low however idle the server: SmolLM2 w8a8 on a Xeon at 1 req/s
    sent 8 requests over 6.58 s and they finished over 6.66 s (ratio 0.99), but its whole run of 9.83 s gives
    0.81 req/s, while the same server completed 2.55 req/s in a burst (``docs/results/cpu-records``). Nor
    completions over arrivals inside the steady window (first completion to last request sent): on a short
    run it holds a handful of each, whose counts move the ratio by 10-20% (0.76 at 6 req/s on an H200 that
    completed 33 req/s in a burst, ``docs/results/gpu-crossmodel-qwen3.5``).

    Args:
        offered_rate_rps: the point's rate in req/s (``inf``, ``"inf"`` or, as older records wrote it, None for a
            burst).
        concurrency: the closed loop's concurrency; None in an open loop.
        request_times: :func:`quantverdict.measure.bench_result.request_times` (``start_s``, ``end_s`` with None
            for a failed request), or None without per-request data.
        completed: requests completed (``completed``).
        duration_s: the benchmark duration, first request sent to last response (``duration_s``).
        e2e_ms_p50: the median request latency in ms (``e2e_ms_p50``).

    Returns:
        ``{"saturated": bool | None, "saturation_ratio": float | None, "saturation_basis": str}``; basis one of
        ``RULE_BASES``.

    E.g. 8 requests sent at 0, .25, ..., 1.75 s (arrival pace 4 req/s) finishing at 3, 4.5, ..., 13.5 s
    (completion pace 7 / 10.5 s = 0.667 req/s): ratio 0.167, saturated.
    """
    if concurrency is not None:
        return Saturation(saturated=None, saturation_ratio=None, saturation_basis="closed_loop")
    if offered_rate_rps is None or is_inf_rate(offered_rate_rps):
        return Saturation(saturated=None, saturation_ratio=None, saturation_basis="burst")
    ratio: float | None = None
    basis = ARRIVAL_PACE
    if request_times:
        sent = _pace(_known(request_times, "start_s"))
        done = _pace(_known(request_times, "end_s"))
        ratio = done / sent if sent and done else None
    if ratio is None and completed and duration_s and e2e_ms_p50 is not None:
        span = float(duration_s) - float(e2e_ms_p50) / 1000.0
        if completed >= 2 and span > 0:
            ratio, basis = (completed - 1) / span / float(offered_rate_rps), ESTIMATED_PACE
    if ratio is None:
        return Saturation(saturated=None, saturation_ratio=None, saturation_basis="too_few_requests")
    return Saturation(saturated=ratio < SATURATION_FRACTION, saturation_ratio=ratio, saturation_basis=basis)


def _known(request_times: Mapping[str, Sequence[float | None]], key: str) -> list[float]:
    """The times of ``request_times[key]`` (``start_s`` or ``end_s``) that are known (a failed request's end is
    None); [] where the key is missing."""
    return [float(t) for t in request_times[key] if t is not None] if key in request_times else []


def describe_saturation(decision: Saturation) -> str:
    """A point's decision (:func:`point_saturation`) in words, for the live log and the review: ``completions at
    0.17x the arrival pace`` (basis ``arrival_pace``), ``completions at 0.50x the offered rate (estimated: no
    per-request times)`` (``estimated_pace``); ``""`` without a ratio."""
    ratio = decision["saturation_ratio"]
    if not isinstance(ratio, (int, float)):
        return ""
    if decision["saturation_basis"] == ESTIMATED_PACE:
        return f"completions at {ratio:.2f}x the offered rate (estimated: no per-request times)"
    return f"completions at {ratio:.2f}x the arrival pace"


def point_valid(p: SweepPoint | Mapping[str, Any]) -> bool:
    """A parsed point's ``valid``; for older records (no key): output tokens >= 90% of those requested
    and at least one request completed.

    Args:
        p: the point, typed or as the record's JSON holds it (:func:`quantverdict.measure.points.as_point`).
    """
    pt = as_point(p)
    if pt.has("valid"):
        return bool(pt.valid)
    want, got = pt.output_tokens_requested, pt.output_tokens_total
    if want and got is not None and got < OUTPUT_VALID_FRACTION * want:
        return False
    return pt.completed != 0


def point_saturation(p: SweepPoint | Mapping[str, Any]) -> Saturation:
    """A recorded point's saturation decision, as :func:`saturation` stored it when the point was read
    (``{"saturated", "saturation_ratio", "saturation_basis"}``); a point recorded before that rule (its basis not
    in ``RULE_BASES``) gets it from :func:`older_point_saturation`. What every reader of a point's saturation
    calls: the live log, the per-load summary and the ceiling, the grid table, the review."""
    pt = as_point(p)
    if pt.saturation_basis in RULE_BASES and pt.has("saturated"):
        return Saturation(
            saturated=pt.saturated, saturation_ratio=pt.saturation_ratio, saturation_basis=pt.saturation_basis
        )
    return older_point_saturation(pt)


def point_saturated(p: SweepPoint | Mapping[str, Any]) -> bool | None:
    """:func:`point_saturation`'s ``saturated``: True, False, or None (burst, closed loop, not measurable)."""
    return point_saturation(p)["saturated"]


def older_point_saturation(p: SweepPoint | Mapping[str, Any]) -> Saturation:
    """The saturation decision of a point recorded before :func:`saturation` was the rule: the same rule on the
    numbers the record keeps (``request_times`` where it saved them, else ``completed``, ``duration_s`` and
    ``e2e_ms_p50``). Its stored ``saturated`` (whole-run achieved / offered, or completions over arrivals in the
    steady window) is not read: it rests on another basis. The one function that derives the decision for older
    records."""
    pt = as_point(p)
    return saturation(
        pt.offered_rate_rps,
        pt.concurrency,
        pt.request_times,
        completed=pt.completed,
        duration_s=pt.duration_s,
        e2e_ms_p50=pt.e2e_ms_p50,
    )
