"""Do lm-eval's batching and padding change a request's log-likelihood? (child, serve environment)

The same three requests are scored at batch size 1 and at batch size 3 by the model the tasks use; the
largest difference is judged at float32 and recorded otherwise. Imports lm-eval inside
:func:`batch_invariance` only, so :func:`compare_loglikelihoods` runs anywhere.
"""

from __future__ import annotations

from typing import Any

# three short (context, continuation) pairs of different lengths, so that a batch of 3 is padded
BATCH_INVARIANCE_REQUESTS = (
    ("The capital of France is", " Paris."),
    ("Water boils at one hundred degrees Celsius at sea level, and it freezes at", " zero degrees."),
    ("Once upon a time", " there lived an old fisherman by the sea with his wife."),
)
BATCH_INVARIANCE_SIZES = (1, 3)
BATCH_INVARIANCE_TOLERANCE = 1e-4  # |log-likelihood difference| allowed at float32


def compare_loglikelihoods(a: list[float], b: list[float], dtype: str) -> dict[str, Any]:
    """Largest difference between the same requests' log-likelihoods under two batch sizes.

    Judged against ``BATCH_INVARIANCE_TOLERANCE`` (1e-4 nats) only at float32: in bfloat16 a padded
    batch takes other kernels and rounds differently, so the difference is recorded, not judged.

    Args:
        a: log-likelihoods (nats) of the requests at one batch size.
        b: the same requests at the other batch size, same order.
        dtype: the model's dtype (``float32``, ``bfloat16`` ...).

    Returns:
        ``{"max_abs_diff", "tolerance", "ok" (None when not judged), "note"}``.

    Raises:
        ValueError: empty or unequal lists.
    """
    if not a or len(a) != len(b):
        raise ValueError(f"need two equal, non-empty lists of log-likelihoods, got {len(a)} and {len(b)}")
    diff = max(abs(x - y) for x, y in zip(a, b))
    judged = str(dtype) in ("float32", "fp32", "float", "torch.float32")
    return {
        "max_abs_diff": diff,
        "tolerance": BATCH_INVARIANCE_TOLERANCE,
        "ok": (diff <= BATCH_INVARIANCE_TOLERANCE) if judged else None,
        "note": None if judged else f"dtype {dtype}: the tolerance is defined at float32; recorded, not judged",
    }


def batch_invariance(lm: Any, backend: str, dtype: str) -> dict[str, Any]:
    """Do lm-eval's batching and padding change a request's log-likelihood?

    Runs the three requests of ``BATCH_INVARIANCE_REQUESTS`` (different lengths, so a batch of three is
    padded) through ``lm.loglikelihood`` at batch size 1 and at batch size 3 and compares them
    (:func:`compare_loglikelihoods`). The model is the one the tasks use; its batch size is restored.

    Args:
        lm: an lm-eval ``HFLM``.
        backend: ``eval.backend``; only ``hf`` is checked (vLLM schedules its own batches).
        dtype: ``eval.dtype``.

    Returns:
        :func:`compare_loglikelihoods`'s keys plus ``batch_sizes``, ``dtype``, ``n_requests``,
        ``loglikelihoods`` (per batch size), or ``{"skipped": reason}``.
    """
    if backend != "hf":
        return {"skipped": f"eval.backend={backend}: the engine forms its own batches; checked with the hf backend"}
    from lm_eval.api.instance import Instance

    reqs = [
        Instance(request_type="loglikelihood", doc={}, arguments=pair, idx=i)
        for i, pair in enumerate(BATCH_INVARIANCE_REQUESTS)
    ]
    saved = lm.batch_size_per_gpu
    lls: dict[int, list[float]] = {}
    try:
        for bs in BATCH_INVARIANCE_SIZES:
            lm.batch_size_per_gpu = bs
            lls[bs] = [float(r[0]) for r in lm.loglikelihood(reqs, disable_tqdm=True)]
    finally:
        lm.batch_size_per_gpu = saved
    a, b = (lls[bs] for bs in BATCH_INVARIANCE_SIZES)
    return {
        **compare_loglikelihoods(a, b, dtype),
        "batch_sizes": list(BATCH_INVARIANCE_SIZES),
        "dtype": dtype,
        "n_requests": len(reqs),
        "loglikelihoods": {str(bs): v for bs, v in lls.items()},
    }
