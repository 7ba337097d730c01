"""The GPU sampler around a sweep, and each point's window summary from its samples.

:func:`sampling` starts :mod:`quantverdict.children.gpu_sampler` in the serve environment (on cuda only) before the
sweep and stops it after; :func:`annotate` then gives every point ``gpu``
(:func:`quantverdict.measure.gpu_samples.window_summary` over the point's measured window) and the ``speed`` section
``gpu_sampling`` (the source, interval and devices, or why nothing was measured). A point's window is the last
attempt's ``[end - duration, end]``: the sweep client stamps ``end_unix_s`` when vLLM's benchmark call returns, and
vLLM's ``duration`` runs from the first request sent to the last completion (the call's tail after it, saving the
result file, is a few ms to a fraction of a second and lies outside it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from quantverdict.config.schema import Config
from quantverdict.measure import gpu_samples
from quantverdict.processes import procs
from quantverdict.processes.envs import StageEnv
from quantverdict.results.record import GpuSampling, Speed, SweepPoint
from quantverdict.results.stage_results import GpuSamplerHeader, PointSidecar

log = logging.getLogger(__name__)

SAMPLES_FILE = "gpu_samples.jsonl"
CHILD = "quantverdict.children.gpu_sampler"
NOT_MEASURED_CPU = "device cpu: no NVML, so energy, clocks, power and GPU idle time are not measured"


@dataclass
class Sampling:
    """Where the sampler of one sweep writes (``path``), or why there is none (``not_measured``)."""

    path: Path | None
    not_measured: str | None = None


def devices_of(cfg: Config) -> list[str]:
    """The devices the job's server runs on: the first ``bench.server.tensor_parallel_size`` entries of the serve
    environment's ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs), else indices ``0 .. tp - 1``."""
    tp = max(1, int(cfg.bench.server.tensor_parallel_size))
    visible = cfg.env.serve.env_vars.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [d.strip() for d in str(visible).split(",") if d.strip()][:tp]
    return [str(i) for i in range(tp)]


@contextmanager
def sampling(cfg: Config, env: StageEnv, out_dir: Path) -> Iterator[Sampling]:
    """The GPU sampler for the ``with`` block (cuda and ``bench.gpu_sample_interval_ms`` > 0), stopped on exit,
    normal or not; ``out_dir/gpu_samples.jsonl`` holds its samples."""
    if cfg.env.device != "cuda":
        yield Sampling(None, NOT_MEASURED_CPU)
        return
    interval = int(cfg.bench.gpu_sample_interval_ms)
    if interval <= 0:
        yield Sampling(None, "bench.gpu_sample_interval_ms=0: the GPU was not sampled")
        return
    path = out_dir / SAMPLES_FILE
    path.unlink(missing_ok=True)
    cmd = env.module(CHILD, str(path), str(interval), ",".join(devices_of(cfg)))
    proc = procs.start(cmd, out_dir / "gpu_sampler.log", env=env.env, echo=False)
    try:
        yield Sampling(path)
    finally:
        procs.stop_group(proc, grace_s=5.0)


def point_window(point: SweepPoint) -> tuple[float, float] | None:
    """The point's measured window in Unix s, from its sidecar (``<point>.qv.json``: the last attempt's
    ``end_unix_s`` and ``duration_s``); None for a point recorded without it."""
    if not point.result_file:
        return None
    side_path = Path(point.result_file).with_suffix(".qv.json")
    if not side_path.is_file():
        return None
    return PointSidecar.model_validate_json(side_path.read_text()).window_unix_s()


def annotate(speed: Speed, sampled: Sampling) -> None:
    """Give ``speed`` its ``gpu_sampling`` and each of its points its ``gpu`` window summary
    (:func:`quantverdict.measure.gpu_samples.window_summary`); never raises (a summary must not fail a sweep)."""
    try:
        if sampled.path is None:
            speed.gpu_sampling = GpuSampling(not_measured=sampled.not_measured)
            return
        raw, samples = gpu_samples.read_samples(sampled.path)
        header = GpuSamplerHeader.model_validate(raw)
        speed.gpu_sampling = GpuSampling(
            source=header.source,
            interval_ms=header.interval_ms,
            devices=header.devices,
            samples=len(samples),
            file=str(sampled.path),
            **({"not_measured": header.error} if header.error else {}),
        )
        for p in speed.points:
            window = point_window(p)
            if window is not None and samples:
                p.gpu = gpu_samples.window_summary(samples, *window, p.output_tokens_total)
    except Exception:  # noqa: BLE001 - a summary bug must not turn a finished sweep into a failure
        log.exception("could not summarize the GPU samples")
