"""The GPU sampler on a real GPU: ``quantverdict.children.gpu_sampler`` started in the serve environment samples
NVML (or ``nvidia-smi`` where ``pynvml`` is missing) every 50 ms while a GEMM loop runs, and stops on SIGTERM.

Skipped without an NVIDIA GPU (nothing to sample: no fake stands in for NVML). Expected: a header naming the source,
about 20 samples a second per device, positive power and clocks, utilization above 0 while the loop runs and an
energy counter (NVML) that never decreases; a window over the loop gets an energy per output token."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from quantverdict.measure import gpu_samples
from quantverdict.processes import procs

pytestmark = [pytest.mark.integration]

LOAD = (
    "import time, torch\n"
    "a = torch.randn(4096, 4096, device='cuda', dtype=torch.bfloat16)\n"
    "t = time.time()\n"
    "while time.time() - t < 2.0:\n"
    "    [a @ a for _ in range(20)]\n"
    "    torch.cuda.synchronize()\n"
)


def _has_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    res = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    return res.returncode == 0 and "GPU 0" in res.stdout


@pytest.mark.skipif(not _has_gpu(), reason="no NVIDIA GPU (nvidia-smi missing or lists none): NVML has nothing to read")
def test_the_sampler_reads_the_gpu_under_load(tmp_path: Path, stage_envs: dict) -> None:
    env = stage_envs["serve"]
    out = tmp_path / "gpu_samples.jsonl"
    sampler = procs.start(
        env.module("quantverdict.children.gpu_sampler", str(out), "50", "0"), tmp_path / "sampler.log", env=env.env
    )
    try:
        time.sleep(1.0)
        t0 = time.time()
        subprocess.run([env.python, "-c", LOAD], check=True, env={**env.env}, timeout=300)
        t1 = time.time()
        time.sleep(0.5)
    finally:
        procs.stop_group(sampler, grace_s=5.0)
    header, samples = gpu_samples.read_samples(out)
    assert header["source"] in ("nvml", "nvidia-smi"), header
    assert header["interval_ms"] == 50
    assert len(samples) >= 40  # >= 3.5 s at 50 ms, one device (nvidia-smi's -lms keeps a slower pace at worst)
    assert all(s["power_w"] and s["power_w"] > 0 for s in samples if s.get("power_w") is not None)
    assert max(s["sm_clock_mhz"] or 0 for s in samples) > 0
    busy = [s for s in samples if t0 <= s["t"] <= t1]
    assert any((s.get("util_pct") or 0) > 0 for s in busy)
    if header["source"] == "nvml":
        energy = [s["energy_mj"] for s in samples if s.get("energy_mj") is not None]
        assert energy and all(b >= a for a, b in zip(energy, energy[1:]))
    w = gpu_samples.window_summary(samples, t0, t1, output_tokens=1000)
    assert (
        w.samples and w.energy_j and w.energy_j > 0 and w.energy_per_output_token_j and w.energy_per_output_token_j > 0
    )
