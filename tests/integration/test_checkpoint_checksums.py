"""A cached checkpoint is reused only with the bytes it was made with: same-size corruption of its scales is
caught by its sha256 checksums, set aside and quantized again. Bytes that match their checksums are reused only
when they pass the sanity check against the source model: zero or NaN scales checksummed again are caught by it.
Real int8 (data-free) on the embedded model."""

from __future__ import annotations

import json
import shutil
import struct
import time
from pathlib import Path

import pytest

from clihelp import run_cli
from quantverdict.config.compose import compose
from quantverdict.measure.integrity import IntegrityError
from quantverdict.orchestrate import caches
from quantverdict.results.record import find_records, load

pytestmark = pytest.mark.integration

FAST = ["scheme=int8", "eval.enabled=false", "bench.enabled=false"]


BF16_NAN = b"\xc0\x7f"  # 0x7fc0, little-endian: bfloat16 quiet NaN


def zero_scales(shard: Path, count: int | None, fill: bytes = b"\x00\x00") -> list[str]:
    """Overwrite the data of the first ``count`` (None: every) bfloat16 ``*.weight_scale`` tensors with ``fill``
    repeated (two bytes: one bfloat16 value), size unchanged."""
    with open(shard, "r+b") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
        names = sorted(k for k in header if k.endswith("weight_scale"))[:count]
        for name in names:
            assert header[name]["dtype"] == "BF16", header[name]
            start, end = header[name]["data_offsets"]
            fh.seek(8 + n + start)
            fh.write(fill * ((end - start) // 2))
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
    # set aside, kept for inspection, named in the record (this job's folder: the cache may hold older ones)
    (aside,) = [Path(a["path"]) for a in rec2["checkpoint"]["set_aside"]]
    assert aside.is_dir() and aside.name.startswith(f"{ckpt.name}.damaged-") and str(aside) in detail
    was, now = (json.loads((d / caches.CHECKSUMS).read_text()) for d in (aside, ckpt))
    assert was[shard.name] == now[shard.name]  # int8 round-to-nearest: the same weights as first made
    third = run_cli(tmp_path / "c", *FAST)
    (rec3,) = [load(p) for p in find_records(tmp_path / "c")]
    assert third.returncode == 0 and rec3["stages"]["quantize"]["status"] == "cached"
    shutil.rmtree(aside)  # the folder this test set aside; nothing else


def test_zero_or_nan_scales_with_matching_checksums_fail_the_sanity_check(
    tmp_path: Path, stage_envs: dict, embedded_model: dict
) -> None:
    first = run_cli(tmp_path / "a", *FAST)
    assert first.returncode == 0, first.stderr[-3000:]
    (rec,) = [load(p) for p in find_records(tmp_path / "a")]
    assert rec["checkpoint"]["sanity"]["finite"] and rec["checkpoint"]["sanity"]["ppl_ratio"] < 1.1
    ckpt = Path(rec["checkpoint"]["path"])
    shard = next(ckpt.glob("*.safetensors"))
    assert len(zero_scales(shard, None)) == 30 * 7  # 30 layers x (q, k, v, o, gate, up, down); lm_head is 16-bit
    caches.write_checksums(ckpt)  # the zeroed bytes get checksums of their own: they now verify
    caches.verify_checksums(ckpt)

    second = run_cli(tmp_path / "b", *FAST)
    assert second.returncode == 0, second.stderr[-3000:]
    (rec2,) = [load(p) for p in find_records(tmp_path / "b")]
    quantize = rec2["stages"]["quantize"]
    assert quantize["status"] == "ok"  # quantized again, not "cached"
    assert "failed its sanity check against the source model" in quantize["detail"]
    assert "quantize.sanity.max_ppl_ratio=10.0" in quantize["detail"]
    (aside,) = rec2["checkpoint"]["set_aside"]
    assert Path(aside["path"]).is_dir() and Path(aside["path"]).name.startswith(f"{ckpt.name}.damaged-")
    assert "sanity check" in aside["reason"]
    assert aside["path"] in second.stdout + second.stderr  # named in the log too
    made = rec2["checkpoint"]["sanity"]
    assert made["checked"] == "when made" and made["finite"] and made["ppl_ratio"] < 1.1  # int8 RTN: 1.005
    shutil.rmtree(aside["path"])  # the folder this test set aside; nothing else

    # NaN scales, checksummed again, on a copy: the check a reuse runs refuses it, naming it
    copy = tmp_path / "nan" / ckpt.name
    shutil.copytree(ckpt, copy)
    zero_scales(next(copy.glob("*.safetensors")), None, BF16_NAN)
    caches.write_checksums(copy)
    caches.verify_checksums(copy)
    cfg = compose(["scheme=int8"])
    with pytest.raises(IntegrityError, match=f"{ckpt.name} failed its sanity check.*non-finite logits"):
        caches.check_sanity(cfg, stage_envs["quantize"], embedded_model, copy, tmp_path / "nan_check")
