"""The record's speed summaries of a finished sweep: validity (kernel check, per-load summary, sustained
ceiling) and, where the copy bandwidth was measured, the roofline efficiency at concurrency 1.

Both functions complete the record's typed ``speed`` section in place and never raise: a bug in a summary must not
turn a finished sweep into a failure, nor hide the sweep's own error. The measure functions they call take the
sweep's typed points and summaries (:mod:`quantverdict.measure.points`, the models the record's ``speed`` section
uses). ``tools.bench.bench_gpu``
also runs :func:`speed_validity` on finished records after re-parsing their server logs.
"""

from __future__ import annotations

import logging
from typing import Any

from quantverdict.measure import bench_result, capacity, kernels, roofline, sweep
from quantverdict.results.record import ModelDims, ModelInfo, ServerMemory, Speed, SweepPoint

log = logging.getLogger(__name__)


def speed_validity(speed: Speed, label: str, server: ServerMemory | None, act_quant: bool) -> None:
    """Add the kernel check, the per-load summary over repeats and the sustained ceiling to ``speed``
    (see :mod:`quantverdict.measure.sweep`); never raises, so that it cannot hide the sweep's own error.

    Args:
        speed: the record's ``speed`` section (``points``, ``mode``); gains ``kernel_check``, ``summary``,
            ``sustained_ceiling``; a closed-loop point whose stored steady window is shorter than two request
            lifetimes (measured before that rule) is rewritten by
            :func:`quantverdict.measure.bench_result.rebase_steady`.
        label: the scheme's format label (W4A16, W8A8, ...).
        server: the record's ``memory.server`` (parsed server log), or None (an empty section reads as None).
        act_quant: the scheme quantizes activations (``activation_bits < 16``).
    """
    try:
        mode = speed.mode or "rate"
        speed.kernel_check = kernels.kernel_check(label, server, act_quant)
        points = [bench_result.rebase_steady(p).to_dict() for p in speed.points]
        speed.points = [SweepPoint.model_validate(p) for p in points]
        speed.summary = sweep.summarize(speed.points, mode)
        speed.sustained_ceiling = capacity.sustained_ceiling(speed.summary, mode)
    except Exception:  # noqa: BLE001 - a summary bug must not turn a finished sweep into a failure
        log.exception("could not summarize the speed sweep")


def add_roofline(speed: Speed, model: ModelInfo, model_path: str, hbm: dict[str, Any]) -> None:
    """``speed.roofline``: decode time per token at concurrency 1 against reading the weights once at
    the measured copy bandwidth (:mod:`quantverdict.measure.roofline`); never raises.

    Args:
        speed: the record's ``speed`` section, with ``summary`` and ``points`` (:func:`speed_validity` ran).
        model: the record's ``model`` section (``dims.tie_word_embeddings``).
        model_path: the served checkpoint folder (its safetensors headers give the bytes read per step).
        hbm: the measured copy bandwidth (the hbm stage's result: ``copy_bytes_per_s``, bytes read + written per
            second).
    """
    try:
        tied = bool(ModelDims.of(model.dims).tie_word_embeddings)
        read = roofline.decode_read_bytes(model_path, tied)
        tpot = roofline.c1_tpot_ms(speed.summary, speed.points)
        out: dict[str, Any] = {**read, "copy_bytes_per_s": hbm["copy_bytes_per_s"]}
        if tpot:
            out.update(roofline.efficiency(read["decode_bytes"], hbm["copy_bytes_per_s"], tpot))
        else:
            out["note"] = "no concurrency-1 point in the sweep (bench.mode=concurrency with 1 in bench.concurrencies)"
        speed.roofline = out
    except Exception:  # noqa: BLE001 - a summary bug must not turn a finished sweep into a failure
        log.exception("could not compute the roofline efficiency")
