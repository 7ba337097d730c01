"""Samples the GPUs a server runs on, every few tens of milliseconds, until stopped: NVML through ``pynvml``
(``nvidia-ml-py``, requirements/gpu-serve.txt), else ``nvidia-smi --query-gpu ... -lms``.

Runs in the serve environment as ``python -m quantverdict.children.gpu_sampler OUT INTERVAL_MS [DEVICES]``, started
by the orchestrator around a sweep (:mod:`quantverdict.serving.gpu_sampling`) and stopped with SIGTERM. ``OUT``
gets one JSON line per line written: first the header ``{"source": "nvml" | "nvidia-smi" | null, "interval_ms",
"devices", "error"}``, then one sample per device and instant (the keys of :mod:`quantverdict.measure.gpu_samples`),
flushed as written so a kill keeps every sample before it. ``DEVICES``: comma-separated NVML indices or UUIDs
(``GPU-...``); absent: every device.

Per sample, from NVML: ``nvmlDeviceGetPowerUsage`` (mW), ``nvmlDeviceGetClockInfo`` (SM and memory clocks, MHz),
``nvmlDeviceGetTemperature`` (GPU, C), ``nvmlDeviceGetUtilizationRates().gpu`` (percent of the driver's last sample
period, 1/6 s to 1 s by product, in which a kernel ran), ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the driver
loaded) and ``nvmlDeviceGetCurrentClocksEventReasons`` (``...ThrottleReasons`` in older bindings). A call the device
does not support gives None for that key, every sample.

An integer index is NVML's order (PCI bus id), which is CUDA's only with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; on a
machine of one GPU, or with UUIDs, they agree.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import IO, Any

from quantverdict.measure.gpu_samples import parse_query_csv, query_command

_STOP = {"stop": False}


def _on_term(signum: int, frame: FrameType | None) -> None:
    _STOP["stop"] = True


def nvml_reader(devices: list[str] | None) -> tuple[Callable[[], list[dict[str, Any]]], list[str], Callable[[], None]]:
    """A function that reads one sample of each device through NVML, the devices' names (index or UUID as given,
    else every index), and the shutdown call.

    Raises:
        ImportError: ``pynvml`` is not installed.
        pynvml.NVMLError: NVML could not start (no driver) or a device is unknown.
    """
    import pynvml

    pynvml.nvmlInit()
    names = devices or [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
    handles = []
    for d in names:
        if d.startswith("GPU-") or d.startswith("MIG-"):
            h = pynvml.nvmlDeviceGetHandleByUUID(d)
        else:
            h = pynvml.nvmlDeviceGetHandleByIndex(int(d))
        handles.append((pynvml.nvmlDeviceGetIndex(h), h))
    reasons_fn = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons"
    )
    dead: set[str] = set()  # calls the device refused once: not asked again

    def ask(key: str, fn: Callable[[], Any]) -> Any:
        if key in dead:
            return None
        try:
            return fn()
        except pynvml.NVMLError:
            dead.add(key)
            return None

    def read() -> list[dict[str, Any]]:
        out = []
        for index, h in handles:
            t = time.time()
            power = ask(f"{index}power", lambda: pynvml.nvmlDeviceGetPowerUsage(h))
            out.append(
                {
                    "t": t,
                    "gpu": index,
                    "power_w": power / 1000 if power is not None else None,
                    "sm_clock_mhz": ask(f"{index}sm", lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
                    "mem_clock_mhz": ask(
                        f"{index}mem", lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)
                    ),
                    "temperature_c": ask(
                        f"{index}temp", lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
                    ),
                    "util_pct": ask(f"{index}util", lambda: pynvml.nvmlDeviceGetUtilizationRates(h).gpu),
                    "energy_mj": ask(f"{index}energy", lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h)),
                    "throttle_reasons": ask(f"{index}reasons", lambda: int(reasons_fn(h))),
                }
            )
        return out

    return read, names, pynvml.nvmlShutdown


def _write(fh: IO[str], obj: dict[str, Any]) -> None:
    fh.write(json.dumps(obj) + "\n")
    fh.flush()


def sample_nvml(out: IO[str], interval_ms: int, devices: list[str] | None, max_s: float | None = None) -> int:
    """Write the header and NVML samples to ``out`` every ``interval_ms`` until SIGTERM (or ``max_s`` seconds);
    return the number of sampling rounds. Errors as :func:`nvml_reader`."""
    read, names, shutdown = nvml_reader(devices)
    _write(out, {"source": "nvml", "interval_ms": interval_ms, "devices": names})
    rounds = 0
    t_start = time.monotonic()
    next_t = t_start
    try:
        while not _STOP["stop"] and (max_s is None or time.monotonic() - t_start < max_s):
            for s in read():
                _write(out, s)
            rounds += 1
            next_t += interval_ms / 1000
            time.sleep(max(0.0, next_t - time.monotonic()))
    finally:
        shutdown()
    return rounds


def sample_smi(out: IO[str], interval_ms: int, devices: list[str] | None) -> None:
    """The fallback: ``nvidia-smi --query-gpu ... -lms interval_ms`` (:func:`quantverdict.measure.gpu_samples.
    query_command`), each line parsed as it comes and written as a sample, until SIGTERM."""
    proc = subprocess.Popen(query_command(interval_ms, devices), stdout=subprocess.PIPE, text=True)
    _write(out, {"source": "nvidia-smi", "interval_ms": interval_ms, "devices": devices})
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            for s in parse_query_csv(line):
                _write(out, s)
            if _STOP["stop"]:
                break
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main(argv: list[str]) -> int:
    """``OUT INTERVAL_MS [DEVICES]``: sample until SIGTERM; exit 0 (a machine without NVML or nvidia-smi writes a
    header with ``source`` null and the reason)."""
    out_path, interval_ms = Path(argv[0]), int(argv[1])
    devices = [d for d in argv[2].split(",") if d] if len(argv) > 2 and argv[2] else None
    signal.signal(signal.SIGTERM, _on_term)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "w") as out:
        try:
            sample_nvml(out, interval_ms, devices)
            return 0
        except ImportError as exc:
            why = f"pynvml is not installed ({exc})"
        except Exception as exc:  # noqa: BLE001 - pynvml.NVMLError (no driver) and the like: try nvidia-smi
            why = f"NVML failed: {type(exc).__name__}: {exc}"
        try:
            sample_smi(out, interval_ms, devices)
            return 0
        except OSError as exc:
            _write(out, {"source": None, "interval_ms": interval_ms, "devices": devices, "error": f"{why}; {exc}"})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
