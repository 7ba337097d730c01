"""What the GPU did during a measured window: samples of power, clocks, temperature, utilization and the energy counter,
read from NVML (:mod:`quantverdict.children.gpu_sampler`) or parsed from ``nvidia-smi`` text, and summarized per window.

A *sample* is one dict per device and instant: ``t`` (Unix time, s), ``gpu`` (NVML index), ``power_w``,
``sm_clock_mhz``, ``mem_clock_mhz``, ``temperature_c``, ``util_pct`` (NVML's GPU utilization: the percent of its
last sample period in which a kernel ran), ``energy_mj`` (NVML's energy counter since the driver loaded, Volta and
newer) and ``throttle_reasons`` (NVML's clocks-event reason bitmask); a value the source lacks is None.

The text formats (``nvidia-smi`` of drivers 535-580):

* ``nvidia-smi --query-gpu=timestamp,index,power.draw,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu,
  clocks_throttle_reasons.active --format=csv,noheader,nounits -lms 100``: one line per device per interval,
  ``2026/12/04 10:15:02.113, 0, 689.42, 1755, 3201, 61, 100, 0x0000000000000004`` (local time; ``[N/A]`` where a
  value is not available): :func:`parse_query_csv`.
* ``nvidia-smi dmon -s pucm [-o DT]``: two ``#`` header lines (names, units), then one line per device per second,
  ``-`` where a value is not available: :func:`parse_dmon`.

:func:`window_summary` gives a point's energy per output token, the fraction of samples in which no kernel ran and
the flags of a throttled or drifting window. Pure (standard library).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from quantverdict.measure.points import GpuWindow

# nvidia-smi --query-gpu fields, in the order :func:`query_command` asks for them
QUERY_FIELDS = (
    "timestamp",
    "index",
    "power.draw",
    "clocks.sm",
    "clocks.mem",
    "temperature.gpu",
    "utilization.gpu",
    "clocks_throttle_reasons.active",
)
_QUERY_KEYS = {
    "timestamp": "t",
    "index": "gpu",
    "power.draw": "power_w",
    "clocks.sm": "sm_clock_mhz",
    "clocks.mem": "mem_clock_mhz",
    "temperature.gpu": "temperature_c",
    "utilization.gpu": "util_pct",
    "clocks_throttle_reasons.active": "throttle_reasons",
}
# nvidia-smi dmon column names -> sample keys (pclk: the processor, i.e. SM, clock; sm: SM utilization, %)
_DMON_KEYS = {
    "gpu": "gpu",
    "pwr": "power_w",
    "gtemp": "temperature_c",
    "sm": "util_pct",
    "mclk": "mem_clock_mhz",
    "pclk": "sm_clock_mhz",
}
_NA = {"", "-", "N/A", "[N/A]", "[Not Supported]", "Not Supported", "[Unknown Error]"}

# NVML's clocks-event (formerly clocks-throttle) reason bits, nvml.h: nvmlClocksEventReason* / nvmlClocksThrottleReason*
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# the reasons that lower the clock below what the load asks for: the power limit, thermal and hardware slowdowns
LIMITING_REASONS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
# a window is throttled when a limiting reason is active in at least this share of its busy samples
THROTTLED_SHARE = 0.1
# a window drifts when the median busy SM clock of its last third differs from its first third's by more than this
DRIFT_REL = 0.05


def query_command(interval_ms: int, devices: Sequence[str] | None = None) -> list[str]:
    """The ``nvidia-smi`` command line that prints :data:`QUERY_FIELDS` every ``interval_ms`` (the fallback sampler
    where ``pynvml`` is missing; ``devices``: ``--id`` indices or UUIDs)."""
    cmd = [
        "nvidia-smi",
        f"--query-gpu={','.join(QUERY_FIELDS)}",
        "--format=csv,noheader,nounits",
        f"-lms={interval_ms}",
    ]
    if devices:
        cmd.append(f"--id={','.join(devices)}")
    return cmd


def _number(text: str) -> float | None:
    text = text.strip()
    if text in _NA:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def parse_timestamp(text: str) -> float | None:
    """``nvidia-smi``'s ``timestamp`` (``2026/12/04 10:15:02.113``, local time) as Unix seconds; None if unreadable."""
    text = text.strip()
    head, _, frac = text.partition(".")
    try:
        whole = time.mktime(time.strptime(head, "%Y/%m/%d %H:%M:%S"))
    except ValueError:
        return None
    return whole + (float(f"0.{frac}") if frac.isdigit() else 0.0)


def parse_query_csv(text: str, fields: Sequence[str] = QUERY_FIELDS) -> list[dict[str, Any]]:
    """Samples from ``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits`` output.

    Args:
        text: the lines as printed (a header line, if ``noheader`` was left out, is skipped).
        fields: the ``--query-gpu`` fields in their order (default :data:`QUERY_FIELDS`); unknown fields are kept
            under their own name as numbers.

    Returns:
        One sample per line (the module's keys; ``throttle_reasons`` from its hex bitmask); lines with another
        number of columns are skipped.
    """
    out = []
    for line in text.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) != len(fields) or cols[0] == fields[0]:
            continue
        sample: dict[str, Any] = {}
        for name, value in zip(fields, cols):
            key = _QUERY_KEYS.get(name, name)
            if name == "timestamp":
                sample[key] = parse_timestamp(value)
            elif name.startswith("clocks_throttle_reasons") or name.startswith("clocks_event_reasons"):
                sample[key] = int(value, 16) if value.lower().startswith("0x") else None
            elif name == "index":
                sample[key] = int(value) if value.isdigit() else None
            else:
                sample[key] = _number(value)
        out.append(sample)
    return out


def parse_dmon(text: str) -> list[dict[str, Any]]:
    """Samples from ``nvidia-smi dmon`` output (any ``-s`` selection; ``-o D``/``-o T``/``-o DT`` add date and time
    columns, then ``t`` is set from them, local time).

    The first ``#`` line names the columns, the second gives units; both repeat every so often and are skipped.
    Columns other than those mapped (``gpu``, ``pwr``, ``gtemp``, ``sm``, ``mclk``, ``pclk``) are kept under their
    own names as numbers; ``-`` is None.
    """
    names: list[str] | None = None
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            cols = line.lstrip("#").split()
            if cols and cols[0] in ("gpu", "Date"):  # the names line; the units line starts with Idx or YYYYMMDD
                names = cols
            continue
        if names is None or not line.strip():
            continue
        vals = line.split()
        if len(vals) != len(names):
            continue
        row = dict(zip(names, vals))
        sample: dict[str, Any] = {}
        for name, value in row.items():
            if name in ("Date", "Time"):
                continue
            key = _DMON_KEYS.get(name, name)
            sample[key] = int(value) if name == "gpu" and value.isdigit() else _number(value)
        if "Date" in row and "Time" in row:
            try:
                sample["t"] = time.mktime(time.strptime(f"{row['Date']} {row['Time']}", "%Y%m%d %H:%M:%S"))
            except ValueError:
                sample["t"] = None
        out.append(sample)
    return out


def reason_names(mask: int) -> list[str]:
    """The names of the bits set in an NVML clocks-event reason bitmask (:data:`THROTTLE_REASONS`), unknown bits
    as hex."""
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    rest = mask & ~sum(THROTTLE_REASONS)
    return names + ([hex(rest)] if rest else [])


def read_samples(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A sampler's file (:mod:`quantverdict.children.gpu_sampler`): its first line, the header (``source``,
    ``interval_ms``, ``devices``, or ``error``), and its samples; a line cut by a kill is skipped.
    ``({}, [])`` when the file is absent."""
    if not path.is_file():
        return {}, []
    header: dict[str, Any] = {}
    samples = []
    for i, line in enumerate(path.read_text().splitlines()):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if i == 0 and "source" in obj:
            header = obj
        elif isinstance(obj, dict):
            samples.append(obj)
    return header, samples


class GpuSample(BaseModel):
    """One sample (the module's keys): a value the source lacks is None; other keys a source adds are kept."""

    model_config = ConfigDict(extra="allow")

    t: float | None = None
    gpu: int | None = None
    power_w: float | None = None
    energy_mj: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    temperature_c: float | None = None
    util_pct: float | None = None
    throttle_reasons: int | None = None


def _mean(xs: Sequence[float]) -> float | None:
    return math.fsum(xs) / len(xs) if xs else None


def _counter_delta(series: list[tuple[float, float]], t0: float, t1: float) -> float | None:
    """Growth of a monotone counter over ``[t0, t1]`` from the samples in it, scaled from the span of those samples to
    the whole window (the samples are at most one interval from either end)."""
    inside = [(t, v) for t, v in series if t0 <= t <= t1]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    span = inside[-1][0] - inside[0][0]
    return (inside[-1][1] - inside[0][1]) * (t1 - t0) / span


def _power_integral(series: list[tuple[float, float]], t0: float, t1: float) -> float | None:
    """Joules over ``[t0, t1]`` by the trapezoid rule on the power samples in it, scaled as :func:`_counter_delta`."""
    inside = [(t, p) for t, p in series if t0 <= t <= t1]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    joules = math.fsum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in zip(inside, inside[1:]))
    return joules * (t1 - t0) / (inside[-1][0] - inside[0][0])


def window_summary(
    samples: Iterable[GpuSample | Mapping[str, Any]], t0: float, t1: float, output_tokens: int | None
) -> GpuWindow:
    """What the GPU(s) did in the measured window ``[t0, t1]`` (Unix s) of one point.

    Args:
        samples: every sample of the sweep (:class:`GpuSample`, or its keys as :func:`read_samples` gives them), any
            order, any devices.
        t0, t1: the window's start and end.
        output_tokens: the point's generated tokens (``output_tokens_total``), for the energy per token.

    Returns:
        The record's :class:`~quantverdict.measure.points.GpuWindow`: ``window_unix_s`` ``[t0, t1]``, ``samples`` (in
        the window, all devices), ``interval_ms`` (median spacing of one device's samples), ``energy_j`` (summed over
        devices: NVML's energy counter where every device has one, ``energy_source`` ``"energy_counter"``, else the
        trapezoid integral of power, ``"power_integral"``), ``energy_per_output_token_j``, ``output_tok_per_j``,
        ``power_w_mean`` / ``power_w_max`` (over the samples of every device, not summed across devices),
        ``sm_clock_mhz_mean`` / ``sm_clock_mhz_min`` and ``sm_clock_busy_mhz_median`` (samples with utilization > 0),
        ``mem_clock_mhz_mean``, ``temperature_c_max``, ``util_pct_mean``, ``idle_fraction`` (share of samples with
        utilization 0: no kernel ran in the sample period), ``idle_longest_s`` (the longest run of consecutive idle
        samples of one device, times the interval), ``throttle_reasons`` (every reason seen, :func:`reason_names`),
        ``limited_fraction`` (busy samples with a :data:`LIMITING_REASONS` bit), ``throttled`` (``limited_fraction >=``
        :data:`THROTTLED_SHARE`), ``sm_clock_drift_rel`` and ``drifting`` (median busy SM clock of the window's last
        third against its first third, beyond :data:`DRIFT_REL`). Values without samples are None; with no sample in the
        window at all, ``samples`` is 0 and ``not_measured`` says so.
    """
    typed = [s if isinstance(s, GpuSample) else GpuSample.model_validate(s) for s in samples]
    timed = sorted(
        ((s.t, s) for s in typed if s.t is not None and t0 <= s.t <= t1), key=lambda ts: (ts[1].gpu or 0, ts[0])
    )
    inside = [s for _, s in timed]
    out: dict[str, Any] = {"window_unix_s": [t0, t1], "samples": len(inside)}
    if not inside:
        out["not_measured"] = "no GPU sample in the measured window"
        return GpuWindow.model_validate(out)
    by_gpu: dict[int, list[tuple[float, GpuSample]]] = {}
    for t, s in timed:
        by_gpu.setdefault(s.gpu or 0, []).append((t, s))
    steps = [b[0] - a[0] for ss in by_gpu.values() for a, b in zip(ss, ss[1:])]
    interval = statistics.median(steps) if steps else None
    out["interval_ms"] = round(interval * 1000, 1) if interval else None

    def vals(key: str, among: Iterable[GpuSample] = inside) -> list[float]:
        return [float(v) for s in among if isinstance(v := getattr(s, key), (int, float))]

    energies = []
    for ss in by_gpu.values():
        e = _counter_delta([(t, s.energy_mj) for t, s in ss if s.energy_mj is not None], t0, t1)
        energies.append(e / 1000 if e is not None else None)
    if energies and all(e is not None for e in energies):
        out["energy_j"], out["energy_source"] = math.fsum(e for e in energies if e is not None), "energy_counter"
    else:
        integrals = [
            _power_integral([(t, s.power_w) for t, s in ss if s.power_w is not None], t0, t1) for ss in by_gpu.values()
        ]
        ok = [j for j in integrals if j is not None]
        out["energy_j"] = math.fsum(ok) if ok and len(ok) == len(integrals) else None
        out["energy_source"] = "power_integral" if out["energy_j"] is not None else None
    energy = out["energy_j"]
    out["energy_per_output_token_j"] = energy / output_tokens if energy and output_tokens else None
    out["output_tok_per_j"] = output_tokens / energy if energy and output_tokens else None
    power, sm, util = vals("power_w"), vals("sm_clock_mhz"), vals("util_pct")
    out["power_w_mean"], out["power_w_max"] = _mean(power), max(power) if power else None
    out["sm_clock_mhz_mean"], out["sm_clock_mhz_min"] = _mean(sm), min(sm) if sm else None
    busy = [s for s in inside if s.util_pct is not None and s.util_pct > 0]
    busy_sm = vals("sm_clock_mhz", busy)
    out["sm_clock_busy_mhz_median"] = statistics.median(busy_sm) if busy_sm else None
    out["mem_clock_mhz_mean"] = _mean(vals("mem_clock_mhz"))
    temps = vals("temperature_c")
    out["temperature_c_max"] = max(temps) if temps else None
    out["util_pct_mean"] = _mean(util)
    out["idle_fraction"] = sum(1 for u in util if u == 0) / len(util) if util else None
    longest = 0
    for ss in by_gpu.values():
        run = 0
        for _, s in ss:
            run = run + 1 if s.util_pct == 0 else 0
            longest = max(longest, run)
    out["idle_longest_s"] = round(longest * interval, 3) if interval is not None and util else None
    masks = [s.throttle_reasons for s in inside if s.throttle_reasons is not None]
    seen = 0
    for m in masks:
        seen |= m
    out["throttle_reasons"] = reason_names(seen) if masks else None
    busy_masks = [s.throttle_reasons for s in busy if s.throttle_reasons is not None]
    out["limited_fraction"] = (
        sum(1 for m in busy_masks if m & LIMITING_REASONS) / len(busy_masks) if busy_masks else None
    )
    out["throttled"] = out["limited_fraction"] >= THROTTLED_SHARE if out["limited_fraction"] is not None else None
    drift = None
    if len(busy) >= 6:
        third = (t1 - t0) / 3
        first = vals("sm_clock_mhz", [s for s in busy if s.t is not None and s.t < t0 + third])
        last = vals("sm_clock_mhz", [s for s in busy if s.t is not None and s.t >= t1 - third])
        if first and last:
            drift = statistics.median(last) / statistics.median(first) - 1
    out["sm_clock_drift_rel"] = drift
    out["drifting"] = abs(drift) > DRIFT_REL if drift is not None else None
    return GpuWindow.model_validate(out)
