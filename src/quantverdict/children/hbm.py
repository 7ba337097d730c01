"""Child stage (serve env, CUDA): measured device-to-device copy bandwidth of the GPU.

spec: ``{"gib": float (buffer size, default 4), "iters": int (default 20)}``
result: ``{"copy_bytes_per_s", "copy_gbps" (1e9 bytes/s), "buffer_bytes", "iters", "device"}``

Bytes moved per copy = 2 x buffer (each byte read once and written once), timed with CUDA events
over ``iters`` copies after 3 warm-ups; the best of 3 such runs is kept. The buffer is many times the
L2 cache so the copy streams from HBM.
"""

from __future__ import annotations

from typing import Any

from quantverdict.children._child import child_main, progress
from quantverdict.measure.memory import GIB


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("the HBM copy benchmark needs a CUDA GPU (env=gpu)")
    n = int(float(spec.get("gib", 4)) * GIB)
    iters = int(spec.get("iters", 20))
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    best = 0.0
    for _ in range(3):
        for _ in range(3):
            dst.copy_(src)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dst.copy_(src)
        stop.record()
        torch.cuda.synchronize()
        seconds = start.elapsed_time(stop) / 1e3
        best = max(best, 2 * n * iters / seconds)
    name = torch.cuda.get_device_name()
    progress(f"HBM copy on {name}: {best / 1e9:,.0f} GB/s (read + write)")
    del src, dst
    torch.cuda.empty_cache()
    return {"copy_bytes_per_s": best, "copy_gbps": best / 1e9, "buffer_bytes": n, "iters": iters, "device": name}


if __name__ == "__main__":
    child_main(run)
