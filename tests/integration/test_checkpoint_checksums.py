"""A cached checkpoint is reused only with the bytes it was made with: same-size corruption of its scales and a
truncated shard are caught by its sha256 checksums, set aside and quantized again. Bytes that match their checksums
are reused only when they pass the sanity check against the source model: zero or NaN scales checksummed again are
caught by it. Real int8 (data-free) on the embedded model."""

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

pytestmark = [pytest.mark.integration, pytest.mark.slow]

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


def _job(out: Path, cache: Path) -> tuple[dict, str]:
    """One int8 job (no evaluation, no sweep) under ``out`` with ``paths.cache_root=cache``: its record and its log."""
    proc = run_cli(out, *FAST, f"paths.cache_root={cache}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (rec,) = [load(p) for p in find_records(out)]
    return rec, proc.stdout + proc.stderr


def test_damaged_cached_checkpoints_are_set_aside_and_quantized_again(
    tmp_path: Path, stage_envs: dict, embedded_model: dict, quantized: dict
) -> None:
    """One cached int8 checkpoint damaged three ways in turn, each followed by the same job: same-size corruption of
    its scales (caught by the checksums), zero scales checksummed again (caught by the sanity check), a truncated
    shard (caught by the checksums); after each the job sets the damaged folder aside and quantizes again. The jobs
    run one after the other on the one cache entry, so each damage starts from the checkpoint the job before made
    or reused (five jobs, where a job per damage and a cached one before each would take seven). The cache is one of
    this test's own, holding the cached bf16 model and a copy of the tier's int8 checkpoint (the ``quantized``
    fixture's entry, which the first job reuses: its key is the job's): the checkpoint it damages is never one
    another test or job reads (the integration tier runs files side by side)."""
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    model_dir = Path(embedded_model["path"])
    (cache / "models" / model_dir.name).symlink_to(model_dir)  # the cached bf16 model, not materialized again
    made = Path(quantized["int8"][0]["path"])
    shutil.copytree(made, cache / "checkpoints" / made.parent.name / made.name)
    # --- same-size corruption of 30 scales: the checksums catch it ---
    rec, _ = _job(tmp_path / "a", cache)
    assert rec["stages"]["quantize"]["status"] == "cached" and rec["checkpoint"]["key"] == quantized["int8"][0]["key"]
    ckpt = Path(rec["checkpoint"]["path"])
    assert ckpt == cache / "checkpoints" / made.parent.name / made.name
    assert (ckpt / caches.CHECKSUMS).is_file() and rec["checkpoint"]["sha256"]
    t0 = time.perf_counter()
    assert caches.verify_checksums(ckpt) == rec["checkpoint"]["sha256"]
    print(f"verifying {sum(p.stat().st_size for p in ckpt.iterdir()) / 1e6:.0f} MB: {time.perf_counter() - t0:.2f} s")

    shard = next(ckpt.glob("*.safetensors"))
    size = shard.stat().st_size
    assert len(zero_scales(shard, 30)) == 30
    assert shard.stat().st_size == size

    rec2, _ = _job(tmp_path / "b", cache)
    assert rec2["stages"]["quantize"]["status"] == "ok"  # not "cached"
    detail = rec2["stages"]["quantize"]["detail"]
    assert "re-quantized: cached checkpoint damaged" in detail and shard.name in detail and "checksums" in detail
    # set aside, kept for inspection, named in the record (this job's folder: the cache may hold older ones)
    (aside,) = [Path(a["path"]) for a in rec2["checkpoint"]["set_aside"]]
    assert aside.is_dir() and aside.name.startswith(f"{ckpt.name}.damaged-") and str(aside) in detail
    was, now = (json.loads((d / caches.CHECKSUMS).read_text()) for d in (aside, ckpt))
    assert was[shard.name] == now[shard.name]  # int8 round-to-nearest: the same weights as first made
    shutil.rmtree(aside)  # the folder this test set aside; nothing else

    # --- the checkpoint made again is reused; zero scales checksummed again: the sanity check catches them ---
    rec3, _ = _job(tmp_path / "c", cache)
    assert rec3["stages"]["quantize"]["status"] == "cached"
    assert rec3["checkpoint"]["sanity"]["finite"] and rec3["checkpoint"]["sanity"]["ppl_ratio"] < 1.1
    assert len(zero_scales(shard, None)) == 30 * 7  # 30 layers x (q, k, v, o, gate, up, down); lm_head is 16-bit
    caches.write_checksums(ckpt)  # the zeroed bytes get checksums of their own: they now verify
    caches.verify_checksums(ckpt)

    rec4, log = _job(tmp_path / "d", cache)
    quantize = rec4["stages"]["quantize"]
    assert quantize["status"] == "ok"  # quantized again, not "cached"
    assert "failed its sanity check against the source model" in quantize["detail"]
    assert "quantize.sanity.max_ppl_ratio=10.0" in quantize["detail"]
    (aside4,) = rec4["checkpoint"]["set_aside"]
    assert Path(aside4["path"]).is_dir() and Path(aside4["path"]).name.startswith(f"{ckpt.name}.damaged-")
    assert "sanity check" in aside4["reason"]
    assert aside4["path"] in log  # named in the log too
    made = rec4["checkpoint"]["sanity"]
    assert made["checked"] == "when made" and made["finite"] and made["ppl_ratio"] < 1.1  # int8 RTN: 1.005
    shutil.rmtree(aside4["path"])

    # NaN scales, checksummed again, on a copy: the check a reuse runs refuses it, naming it
    copy = tmp_path / "nan" / ckpt.name
    shutil.copytree(ckpt, copy)
    zero_scales(next(copy.glob("*.safetensors")), None, BF16_NAN)
    caches.write_checksums(copy)
    caches.verify_checksums(copy)
    cfg = compose(["scheme=int8"])
    with pytest.raises(IntegrityError, match=f"{ckpt.name} failed its sanity check.*non-finite logits"):
        caches.check_sanity(cfg, stage_envs["quantize"], embedded_model, copy, tmp_path / "nan_check")

    # --- a shard cut to half its size: the checksums catch it; the checkpoint made again has the same bytes ---
    with open(shard, "r+b") as fh:
        fh.truncate(shard.stat().st_size // 2)
    rec5, _ = _job(tmp_path / "e", cache)
    assert rec5["stages"]["quantize"]["status"] == "ok"  # not "cached"
    assert "re-quantized: cached checkpoint damaged" in rec5["stages"]["quantize"]["detail"]
    assert rec5["memory"]["checkpoint"]["total_weight_bytes"] == rec["memory"]["checkpoint"]["total_weight_bytes"]
    (aside5,) = rec5["checkpoint"]["set_aside"]  # kept for inspection, named in the record
    assert Path(aside5["path"]).name.startswith(f"{ckpt.name}.damaged-")
    shutil.rmtree(aside5["path"])
