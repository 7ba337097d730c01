"""Whether a sweep point's numbers count: its output length (valid) and whether it reached its offered rate
(saturated), also for records written before those keys existed.

* **output length**: with ``--ignore-eos`` every request must return ``output_len`` tokens; a point
  whose output tokens fall under ``OUTPUT_VALID_FRACTION`` (90%) of those requested is *invalid*: kept in
  the record, flagged, never averaged into a summary or a ceiling (the other reasons a point is invalid
  are found where its result is read, :func:`quantverdict.measure.bench_result.parse_result`).
* **saturation** (open loop, finite rate): a point whose achieved rate is under ``SATURATION_FRACTION``
  (90%) of the offered rate did not reach its target and is *saturated*. The comparison is made in the
  steady-state window when there is one (:func:`quantverdict.measure.bench_result.steady_state`), else
  over the whole run. An infinite rate (a burst: a capacity probe) and a closed loop (no offered rate)
  are never marked saturated.

Pure (standard library only).
"""

from __future__ import annotations

from typing import Any

from quantverdict.measure.sweep_plan import SweepPoint, is_inf_rate

SATURATION_FRACTION = 0.9  # achieved < 0.9 x offered: the point did not reach its target
OUTPUT_VALID_FRACTION = 0.9  # output tokens < 0.9 x requested: the point is invalid
# |TTFT + sum(ITL) - E2E| above this for any request: its ITL list is not the gaps after the first token
ITL_SUM_TOLERANCE_S = 1e-4
VLLM_AGREEMENT_TOLERANCE = 0.01  # our recomputed percentiles vs vLLM's: relative difference flagged above 1%


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
