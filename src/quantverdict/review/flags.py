"""Honesty flags (:class:`quantverdict.review.document.Flag`): what a review says a reader must know before trusting a
number, typed by a stable code."""

from __future__ import annotations

from enum import StrEnum


class FlagCode(StrEnum):
    """What a flag is about (tests and tools match these, never the prose; ``review.json``'s schema lists them)."""

    DTYPE_MISMATCH = "dtype_mismatch"  # scheme and baseline served in different compute dtypes
    ACCURACY_REFUSED = "accuracy_refused"  # accuracy deltas excluded (settings differ, no baseline ...)
    ACCURACY_NOTE = "accuracy_note"  # a delta computed the weaker way (no per-item data ...)
    BATCH_VARIANCE = "batch_variance"  # batching changed a request's log-likelihood beyond tolerance
    PERPLEXITY_FAMILY = "perplexity_family"  # lm-eval's word/byte perplexity disagree with the summed log-likelihood
    SPEED_POINT_SHORT = "speed_point_short"  # a point's requests ended early: invalid
    SPEED_POINT_INVALID = "speed_point_invalid"  # a point invalid for another reason
    SPEED_POINT_SHORT_KEPT = "speed_point_short_kept"  # some requests ended early, kept (>= 90%)
    SPEED_POINT_FAILED = "speed_point_failed"  # failed requests at a point
    PERCENTILE_DISAGREEMENT = "percentile_disagreement"  # recomputed latency percentiles differ from vLLM's
    FALLBACK_KERNEL = "fallback_kernel"  # the server log shows a fallback kernel
    ONEDNN_FALLBACK = "onednn_fallback"  # vLLM CPU fell back from oneDNN to torch linear
    KV_BYTES_MISMATCH = "kv_bytes_mismatch"  # vLLM's KV bytes/token differ from the model's
    GGUF_BASELINE = "gguf_baseline"  # the baseline is a dequantized GGUF model
    DIFFERENT_GPU = "different_gpu"  # scheme and baseline speed measured on different physical GPUs (uuid)
    WORKLOAD_MISMATCH = "workload_mismatch"  # scheme and baseline swept at different request shapes (in / out tokens)
    SWEEP_INCOMPLETE = "sweep_incomplete"  # planned load levels without a valid point (a job stopped mid-sweep ...)
    GPU_IDLE = "gpu_idle"  # the GPU ran no kernel for a share of a window whose load should keep it busy
    GPU_CLOCK = "gpu_clock"  # the SM clock drifted in a window, or heat or hardware slowed it
