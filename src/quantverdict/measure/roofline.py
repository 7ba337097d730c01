"""Roofline efficiency of decode at concurrency 1: how close a scheme gets to reading its weights once per token.

At batch 1 a decoder step reads every weight it multiplies once, so the fastest possible step takes
``bytes read / memory bandwidth``. The ratio of that to the measured time per output token (TPOT at
concurrency 1) is the fraction of the memory roofline the serving stack reaches; a weight-only 4-bit
scheme reads ~4x fewer bytes than bf16, and this ratio says how much of that it turns into speed.

Bandwidth is the measured device-to-device copy rate (bytes read + bytes written per second,
:mod:`quantverdict.children.hbm`), not the datasheet's. KV-cache reads are left out: at c=1 with a few
hundred tokens of context they are under 0.5% of an 8B model's weights. Orchestrator side, no torch.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from quantverdict.measure import validity
from quantverdict.measure.memory import read_header, tensor_bytes
from quantverdict.measure.points import LoadLevel, SweepPoint, as_point

# tensors a text decode step does not read in full: the vision tower of a VLM checkpoint (text-only
# serving), multi-token-prediction heads, and the input embedding table (one row per token)
_NOT_READ = re.compile(r"(^|\.)(visual|vision_tower|vision_model|mtp)\.")
_EMBED = re.compile(r"embed_tokens\.weight$")


def decode_read_bytes(path: str | Path, tie_word_embeddings: bool = False) -> dict[str, int]:
    """Bytes of a checkpoint that one decode step at batch 1 reads, from its safetensors headers.

    Counts every stored tensor (quantized weights with their scales and zero points, 16-bit layers,
    norms) except :data:`_NOT_READ` and the input embedding table; with tied embeddings the table is
    the ``lm_head`` and is counted once.

    Returns:
        ``{"decode_bytes", "embedding_bytes", "skipped_bytes" (vision/MTP), "total_bytes"}`` in bytes.

    Raises:
        FileNotFoundError: no safetensors file in ``path``.
    """
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors file in {path}")
    read = embed = skipped = 0
    for f in files:
        for name, entry in read_header(f).items():
            size = tensor_bytes(entry)
            if _NOT_READ.search(name):
                skipped += size
            elif _EMBED.search(name):
                embed += size
                if tie_word_embeddings:
                    read += size
            else:
                read += size
    return {
        "decode_bytes": read,
        "embedding_bytes": embed,
        "skipped_bytes": skipped,
        "total_bytes": read + skipped + (0 if tie_word_embeddings else embed),
    }


def efficiency(decode_bytes: float, copy_bytes_per_s: float, tpot_ms: float) -> dict[str, float]:
    """Roofline numbers of one scheme at concurrency 1.

    ``ideal_ms_per_token = decode_bytes / copy_bytes_per_s * 1e3``;
    ``efficiency = ideal_ms_per_token / tpot_ms`` (1.0 = every step runs at the copy bandwidth);
    ``achieved_bytes_per_s = decode_bytes / (tpot_ms / 1e3)``.

    Args:
        decode_bytes: bytes read per decode step (:func:`decode_read_bytes`).
        copy_bytes_per_s: measured copy bandwidth, bytes read + written per second.
        tpot_ms: measured time per output token at concurrency 1, ms (median over requests).

    Raises:
        ValueError: a non-positive input.
    """
    if decode_bytes <= 0 or copy_bytes_per_s <= 0 or tpot_ms <= 0:
        raise ValueError(
            f"decode_bytes={decode_bytes}, copy_bytes_per_s={copy_bytes_per_s}, tpot_ms={tpot_ms} must be > 0"
        )
    ideal = decode_bytes / copy_bytes_per_s * 1e3
    return {
        "ideal_ms_per_token": ideal,
        "tpot_ms": tpot_ms,
        "efficiency": ideal / tpot_ms,
        "achieved_bytes_per_s": decode_bytes / (tpot_ms / 1e3),
    }


def c1_tpot_ms(summary: Sequence[LoadLevel], points: Sequence[SweepPoint | Mapping[str, Any]]) -> float | None:
    """Median TPOT (ms) at concurrency 1: the summary row of load 1 in a concurrency sweep, else the
    median over the valid points (:func:`quantverdict.measure.validity.point_valid`) with ``concurrency == 1``;
    None when the sweep has no such load."""
    for row in summary or []:
        metrics = row.metrics or {}
        tpot = metrics["tpot_ms_p50"] if "tpot_ms_p50" in metrics else None
        if row.concurrency == 1 and tpot:
            return float(tpot.median)
    typed = [as_point(p) for p in points or []]
    vals = [
        float(p.tpot_ms_p50)
        for p in typed
        if p.concurrency == 1 and p.tpot_ms_p50 is not None and validity.point_valid(p)
    ]
    return statistics.median(vals) if vals else None  # of an even count: mean of the middle two
