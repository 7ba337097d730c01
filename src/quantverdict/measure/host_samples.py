"""What the host did during a measured window: the CPU load of the sweep client and of the vLLM server's processes
(by role), the host's total CPU utilization, and vLLM's scheduler (requests running and waiting, KV cache usage),
sampled by :mod:`quantverdict.serving.host_sampling` and summarized per window.

A *sample* is one dict per instant: ``t`` (Unix time, s), ``host_cpu_pct`` (busy share of every logical CPU since
the previous sample, 0-100), ``client_cpu_pct`` (the sweep client and its prompt workers, summed; percent of one
core, so 250 is two and a half cores busy), ``server_cpu_pct`` (``{role: percent of one core}``, the server's
processes summed per :data:`ROLES` entry), ``running_requests`` and ``waiting_requests`` (vLLM's
``vllm:num_requests_running`` / ``vllm:num_requests_waiting``, summed over engines), ``kv_cache_usage_pct``
(``vllm:kv_cache_usage_perc``, a fraction in vLLM, times 100; the mean over engines). A CPU value covers the span
from the previous sample to ``t`` (None in the first sample); a gauge is its value at ``t``; a value not read is
None.

The scheduler's gauges come from ``GET /metrics/?name[]=...`` (:func:`metrics_path`) and are read from the Prometheus
text format by :func:`scheduler_state`. vLLM (0.32) answers ``/metrics`` from prometheus_fastapi_instrumentator, the
whole registry (48 kB, 5.8 ms of the API server's CPU per scrape on a 2-core host); the trailing slash reaches its
mount of ``prometheus_client``'s ASGI app, which honours ``name[]`` and answers the three families only (518 bytes,
0.5 ms).

:func:`window_summary` gives a point's medians and 95th percentiles, and, where GPU samples exist, the host's load in
the samples where the GPU was idle against those where it was busy. Pure (standard library and numpy).
"""

from __future__ import annotations

import bisect
import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from pydantic import BaseModel, ConfigDict

from quantverdict.measure.gpu_samples import GpuSample
from quantverdict.measure.points import HostLoad, HostWindow
from quantverdict.measure.sweep import percentile

# the server's processes by role: the API server (the process started, or a ``VLLM::APIServer_N`` of several), the
# engine core (scheduler; on one GPU or CPU it also runs the model unless a worker process does), the model workers
# (``VLLM::Worker``, ``VLLM::Worker_TP0``, ...), and the rest (multiprocessing's resource tracker, compile workers)
ROLES = ("api_server", "engine_core", "worker", "other")

# vLLM's scheduler gauges (vllm/v1/metrics/loggers.py, vLLM 0.32) -> sample keys
GAUGES = {
    "vllm:num_requests_running": "running_requests",
    "vllm:num_requests_waiting": "waiting_requests",
    "vllm:kv_cache_usage_perc": "kv_cache_usage_pct",
}
# the host's CPU time fields that are not busy time (psutil.cpu_times on Linux); guest time is already in user
_IDLE_FIELDS = ("idle", "iowait")
_GUEST_FIELDS = ("guest", "guest_nice")
P95 = 95.0  # the upper percentile of a window's CPU load


def metrics_path() -> str:
    """``/metrics`` restricted to :data:`GAUGES` (``prometheus_client``'s ``name[]`` query parameter)."""
    return "/metrics/?" + urlencode([("name[]", name) for name in GAUGES])


def server_role(name: str, cmdline: Sequence[str], is_root: bool) -> str:
    """The :data:`ROLES` entry of one of the server's processes, from its name (``/proc/PID/comm``: vLLM sets
    ``VLLM::EngineCore`` / ``VLLM::Worker...`` with setproctitle) and command line; ``is_root``: the process the
    orchestrator started (the API server). E.g. ``("VLLM::EngineCore", [...], False)`` -> ``engine_core``."""
    text = " ".join([name, *cmdline[:1]])
    if "EngineCore" in text:
        return "engine_core"
    if "VLLM::Worker" in text:
        return "worker"
    if is_root or "APIServer" in text:
        return "api_server"
    return "other"


def _labels_end(line: str, start: int) -> int:
    """The index just past the ``}`` that closes the label set opened at ``line[start] == "{"`` (label values are
    quoted and may hold ``}``, ``"`` escaped as ``\\"``); -1 when it is not closed."""
    quoted = escaped = False
    for i in range(start + 1, len(line)):
        c = line[i]
        if escaped:
            escaped = False
        elif c == "\\":
            escaped = True
        elif c == '"':
            quoted = not quoted
        elif c == "}" and not quoted:
            return i + 1
    return -1


def parse_samples(text: str, names: Iterable[str]) -> dict[str, list[float]]:
    """The values of the named series in Prometheus text exposition format (``name{labels} value [timestamp]``),
    one per label set, in order; a name without a line is left out, a value that is not a number skipped.

    E.g. ``vllm:num_requests_running{engine="0",model_name="m"} 3.0`` -> ``{"vllm:num_requests_running": [3.0]}``.
    """
    wanted = set(names)
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        cut = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        if cut <= 0 or line[:cut] not in wanted:
            continue
        rest_at = _labels_end(line, cut) if line[cut] == "{" else cut
        if rest_at < 0:
            continue
        fields = line[rest_at:].split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if not math.isnan(value):
            out.setdefault(line[:cut], []).append(value)
    return out


def scheduler_state(text: str) -> dict[str, float | None]:
    """``running_requests``, ``waiting_requests`` (summed over engines) and ``kv_cache_usage_pct`` (vLLM's fraction
    times 100, the mean over engines) from ``/metrics`` text; None for a gauge the server did not export."""
    found = parse_samples(text, GAUGES)
    out: dict[str, float | None] = {}
    for name, key in GAUGES.items():
        values = found.get(name)
        if not values:
            out[key] = None
        elif key == "kv_cache_usage_pct":
            out[key] = 100 * math.fsum(values) / len(values)
        else:
            out[key] = math.fsum(values)
    return out


def host_busy_pct(before: Mapping[str, float], after: Mapping[str, float]) -> float | None:
    """The busy share (%) of every logical CPU between two reads of the host's CPU times (``psutil.cpu_times()``
    as a dict, s): ``100 * (1 - d(idle + iowait) / d(total))``, total the sum of the fields less guest time (Linux
    counts it in user already), as ``psutil.cpu_percent`` computes it; None when no time passed.

    E.g. user 10 -> 13, system 2 -> 3, idle 50 -> 54, iowait 1 -> 1: total +8, idle +4, busy 50.0%.
    """

    def total(t: Mapping[str, float]) -> float:
        return math.fsum(v for k, v in t.items() if k not in _GUEST_FIELDS)

    def idle(t: Mapping[str, float]) -> float:
        return math.fsum(t.get(k, 0.0) for k in _IDLE_FIELDS)

    d_total = total(after) - total(before)
    if d_total <= 0:
        return None
    busy = d_total - (idle(after) - idle(before))
    return min(100.0, max(0.0, 100 * busy / d_total))


def read_samples(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A host sampler's file (:mod:`quantverdict.serving.host_sampling`): its first line, the header (``source``,
    ``interval_ms``, ``cores``, ``server_pid``, ``metrics_url``), and its samples; a line cut by a kill is skipped.
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
        if i == 0 and isinstance(obj, dict) and "source" in obj:
            header = obj
        elif isinstance(obj, dict):
            samples.append(obj)
    return header, samples


class HostSample(BaseModel):
    """One sample (the module's keys); a value not read is None."""

    model_config = ConfigDict(extra="ignore")

    t: float | None = None
    host_cpu_pct: float | None = None
    client_cpu_pct: float | None = None
    server_cpu_pct: dict[str, float] | None = None
    running_requests: float | None = None
    waiting_requests: float | None = None
    kv_cache_usage_pct: float | None = None

    @property
    def server_total_pct(self) -> float | None:
        """The server's processes summed over roles (percent of one core); None when not read."""
        return math.fsum(self.server_cpu_pct.values()) if self.server_cpu_pct is not None else None


def _mean(xs: Sequence[float]) -> float | None:
    return math.fsum(xs) / len(xs) if xs else None


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _p95(xs: Sequence[float]) -> float | None:
    return percentile(xs, P95) if xs else None


def _numbers(samples: Iterable[HostSample], key: str) -> list[float]:
    return [float(v) for s in samples if isinstance(v := getattr(s, key), (int, float))]


def _server_totals(samples: Iterable[HostSample]) -> list[float]:
    return [v for s in samples if (v := s.server_total_pct) is not None]


def _by_role(samples: Sequence[HostSample], stat: str) -> dict[str, float] | None:
    """Per role seen in the samples, the median (``stat="median"``) or 95th percentile of its CPU percent; a role
    absent from a sample counts as 0 there (its processes had not started or had ended)."""
    rows = [s.server_cpu_pct for s in samples if s.server_cpu_pct is not None]
    roles = sorted({r for row in rows for r in row}, key=lambda r: (ROLES.index(r) if r in ROLES else len(ROLES), r))
    if not roles:
        return None
    fn = _median if stat == "median" else _p95
    return {r: v for r in roles if (v := fn([row.get(r, 0.0) for row in rows])) is not None}


def _load(samples: Sequence[HostSample]) -> HostLoad:
    return HostLoad(
        samples=len(samples),
        client_cpu_pct_median=_median(_numbers(samples, "client_cpu_pct")),
        server_cpu_pct_median=_median(_server_totals(samples)),
        server_cpu_pct_median_by_role=_by_role(samples, "median"),
        host_cpu_pct_median=_median(_numbers(samples, "host_cpu_pct")),
        running_requests_median=_median(_numbers(samples, "running_requests")),
        waiting_requests_median=_median(_numbers(samples, "waiting_requests")),
    )


def gpu_state_at(t: float, gpu_series: Mapping[int, Sequence[tuple[float, float]]], within_s: float) -> bool | None:
    """Whether the GPU(s) were idle at ``t``: True when the nearest utilization sample of every device, each
    within ``within_s`` of ``t``, is 0 (no kernel ran in NVML's sample period); False when a device's is above 0;
    None when a device has no sample that near, or there is no device. ``gpu_series``: per device,
    ``(t, util_pct)`` sorted by time."""
    if not gpu_series:
        return None
    idle = True
    for series in gpu_series.values():
        i = bisect.bisect_left(series, t, key=lambda tu: tu[0])
        near = [series[j] for j in (i - 1, i) if 0 <= j < len(series)]
        if not near:
            return None
        near_t, util = min(near, key=lambda tu: abs(tu[0] - t))
        if abs(near_t - t) > within_s:
            return None
        if util > 0:
            idle = False
    return idle


def window_summary(
    samples: Iterable[HostSample | Mapping[str, Any]],
    t0: float,
    t1: float,
    cores: int | None = None,
    gpu: Iterable[GpuSample | Mapping[str, Any]] | None = None,
) -> HostWindow:
    """What the host did in the measured window ``[t0, t1]`` (Unix s) of one point.

    Args:
        samples: every host sample of the sweep (:class:`HostSample`, or its keys as :func:`read_samples` gives
            them), any order.
        t0, t1: the window's start and end.
        cores: the host's logical CPUs (the sampler's header), recorded beside the percentages.
        gpu: the sweep's GPU samples (:mod:`quantverdict.measure.gpu_samples`), or None where the GPU was not
            sampled.

    Returns:
        The record's :class:`~quantverdict.measure.points.HostWindow`: ``window_unix_s``, ``samples`` (in the
        window), ``interval_ms`` (median spacing), ``cores``; ``client_cpu_pct_mean`` / ``_median`` / ``_p95`` and
        ``server_cpu_pct_mean`` / ``_median`` / ``_p95`` (percent of one core; the server's summed over its processes;
        the mean times the window is the CPU time used, where the median of a mostly idle process is 0) with
        ``server_cpu_pct_median_by_role`` / ``server_cpu_pct_p95_by_role`` (:data:`ROLES`); ``host_cpu_pct_median``
        / ``_p95`` (percent of all cores); ``running_requests_median`` / ``_min`` / ``_max``,
        ``waiting_requests_median`` / ``_min`` / ``_max``, ``kv_cache_usage_pct_median`` / ``_max``; and where GPU
        samples exist, ``gpu_idle`` and ``gpu_busy`` (:class:`~quantverdict.measure.points.HostLoad`: the same
        medians over the host samples whose nearest GPU samples, within the larger of the two intervals, were all
        idle, resp. had a kernel running; :func:`gpu_state_at`). Percentiles: numpy's linear method
        (:func:`quantverdict.measure.sweep.percentile`). With no sample in the window ``samples`` is 0 and
        ``not_measured`` says so.
    """
    typed = [s if isinstance(s, HostSample) else HostSample.model_validate(s) for s in samples]
    inside = sorted((s for s in typed if s.t is not None and t0 <= s.t <= t1), key=lambda s: s.t or 0.0)
    out: dict[str, Any] = {"window_unix_s": [t0, t1], "samples": len(inside), "cores": cores}
    if not inside:
        out["not_measured"] = "no host sample in the measured window"
        return HostWindow.model_validate(out)
    times = [s.t for s in inside if s.t is not None]
    steps = [b - a for a, b in zip(times, times[1:])]
    interval = statistics.median(steps) if steps else None
    out["interval_ms"] = round(interval * 1000, 1) if interval else None
    client, server, host = _numbers(inside, "client_cpu_pct"), _server_totals(inside), _numbers(inside, "host_cpu_pct")
    out["client_cpu_pct_mean"], out["server_cpu_pct_mean"] = _mean(client), _mean(server)
    out["client_cpu_pct_median"], out["client_cpu_pct_p95"] = _median(client), _p95(client)
    out["server_cpu_pct_median"], out["server_cpu_pct_p95"] = _median(server), _p95(server)
    out["server_cpu_pct_median_by_role"] = _by_role(inside, "median")
    out["server_cpu_pct_p95_by_role"] = _by_role(inside, "p95")
    out["host_cpu_pct_median"], out["host_cpu_pct_p95"] = _median(host), _p95(host)
    for key in ("running_requests", "waiting_requests"):
        xs = _numbers(inside, key)
        out[f"{key}_median"] = _median(xs)
        out[f"{key}_min"], out[f"{key}_max"] = (min(xs), max(xs)) if xs else (None, None)
    kv = _numbers(inside, "kv_cache_usage_pct")
    out["kv_cache_usage_pct_median"], out["kv_cache_usage_pct_max"] = _median(kv), max(kv) if kv else None
    if gpu is not None:
        series: dict[int, list[tuple[float, float]]] = {}
        gpu_steps: list[float] = []
        for g in (x if isinstance(x, GpuSample) else GpuSample.model_validate(x) for x in gpu):
            if g.t is not None and g.util_pct is not None:
                series.setdefault(g.gpu or 0, []).append((g.t, g.util_pct))
        for ss in series.values():
            ss.sort()
            gpu_steps += [b[0] - a[0] for a, b in zip(ss, ss[1:])]
        within = max(interval or 0.0, statistics.median(gpu_steps) if gpu_steps else 0.0)
        if series and within > 0:
            states = [(s, gpu_state_at(s.t, series, within)) for s in inside if s.t is not None]
            out["gpu_idle"] = _load([s for s, idle in states if idle is True])
            out["gpu_busy"] = _load([s for s, idle in states if idle is False])
    return HostWindow.model_validate(out)
