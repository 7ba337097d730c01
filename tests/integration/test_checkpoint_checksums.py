"""A cached checkpoint is reused only with the bytes it was made with: same-size corruption of its scales is
caught by its sha256 checksums, set aside and quantized again. Real int8 (data-free) on the embedded model."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

from clihelp import run_cli
from quantverdict.orchestrate import caches
from quantverdict.results.record import find_records, load

pytestmark = pytest.mark.integration

FAST = ["scheme=int8", "eval.enabled=false", "bench.enabled=false"]


def zero_scales(shard: Path, count: int) -> list[str]:
    """Overwrite the data of the first ``count`` ``*.weight_scale`` tensors with zeros (size unchanged)."""
    with open(shard, "r+b") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
        names = sorted(k for k in header if k.endswith("weight_scale"))[:count]
        for name in names:
            start, end = header[name]["data_offsets"]
            fh.seek(8 + n + start)
            fh.write(bytes(end - start))
    return names


def test_same_size_corruption_of_a_cached_checkpoint_is_quantized_again(tmp_path: Path, embedded_model: dict) -> None:
    first = run_cli(tmp_path / "a", *FAST)
    assert first.returncode == 0, first.stderr[-3000:]
    (rec,) = [load(p) for p in find_records(tmp_path / "a")]
    ckpt = Path(rec["checkpoint"]["path"])
    assert (ckpt / caches.CHECKSUMS).is_file() and rec["checkpoint"]["sha256"]
    t0 = time.perf_counter()
    assert caches.verify_checksums(ckpt) == rec["checkpoint"]["sha256"]
    print(f"verifying {sum(p.stat().st_size for p in ckpt.iterdir()) / 1e6:.0f} MB: {time.perf_counter() - t0:.2f} s")

    shard = next(ckpt.glob("*.safetensors"))
    size = shard.stat().st_size
    assert len(zero_scales(shard, 30)) == 30
    assert shard.stat().st_size == size

    second = run_cli(tmp_path / "b", *FAST)
    assert second.returncode == 0, second.stderr[-3000:]
    (rec2,) = [load(p) for p in find_records(tmp_path / "b")]
    assert rec2["stages"]["quantize"]["status"] == "ok"  # not "cached"
    detail = rec2["stages"]["quantize"]["detail"]
    assert "re-quantized: cached checkpoint damaged" in detail and shard.name in detail and "checksums" in detail
    assert list(ckpt.parent.glob(f"{ckpt.name}.damaged-*"))  # set aside, kept for inspection
    aside = next(ckpt.parent.glob(f"{ckpt.name}.damaged-*"))
    was, now = (json.loads((d / caches.CHECKSUMS).read_text()) for d in (aside, ckpt))
    assert was[shard.name] == now[shard.name]  # int8 round-to-nearest: the same weights as first made
    third = run_cli(tmp_path / "c", *FAST)
    (rec3,) = [load(p) for p in find_records(tmp_path / "c")]
    assert third.returncode == 0 and rec3["stages"]["quantize"]["status"] == "cached"
