"""The sanity verdict on a quantized checkpoint against its source model (standard library only).

A checkpoint whose files match their checksums can still be wrong: a zero or NaN ``weight_scale`` written
when it was made decodes to zero or NaN weights, and the model then scores text near chance (a token
perplexity of 10^5 on a model whose baseline scores 10). The numbers come from
:mod:`quantverdict.children.checkpoint_sanity`, which runs the source model and the checkpoint on the same
fixed token windows; :func:`judge` compares them with the bounds of ``quantize.sanity`` (conf/config.yaml).
"""

from __future__ import annotations

import math
from typing import Any


def judge(result: dict[str, Any], max_ppl_ratio: float, max_mean_kld: float, finite_only: bool = False) -> str | None:
    """Why the checkpoint fails its sanity check, or None when it passes.

    Args:
        result: :func:`quantverdict.children.checkpoint_sanity.compare`'s dict: ``finite`` (every logit of the
            checkpoint finite), ``nll_source`` and ``nll_checkpoint`` (mean next-token NLL, nats/token),
            ``ppl_ratio`` (``exp(nll_checkpoint - nll_source)``, the checkpoint's token perplexity over the
            source's on the same tokens) and ``mean_kld`` (mean per-token KL(source || checkpoint) over the full
            vocabulary, nats).
        max_ppl_ratio: the largest ``ppl_ratio`` that passes.
        max_mean_kld: the largest ``mean_kld`` that passes.
        finite_only: judge finite logits only (a model with random weights: its perplexity and KL say nothing).

    Returns:
        A sentence naming the measured value and the bound it broke; None when within every bound.
    """
    if not result.get("finite", False):
        return "non-finite logits (NaN or inf) on the check windows"
    if finite_only:
        return None
    # None: past float range (the child writes no inf or NaN into JSON)
    ratio, kld = (math.inf if result.get(k) is None else float(result[k]) for k in ("ppl_ratio", "mean_kld"))
    if not math.isfinite(ratio) or ratio > max_ppl_ratio:
        return (
            f"token perplexity {ratio:.4g}x the source model's on the check windows "
            f"({_ppl(result['nll_checkpoint'])} vs {_ppl(result['nll_source'])}; "
            f"quantize.sanity.max_ppl_ratio={max_ppl_ratio})"
        )
    if not math.isfinite(kld) or kld > max_mean_kld:
        return (
            f"mean KL divergence to the source model {kld:.4g} nats/token on the check windows "
            f"(quantize.sanity.max_mean_kld={max_mean_kld})"
        )
    return None


def _ppl(nll: float) -> str:
    """Token perplexity of a mean NLL (nats), in 4 significant digits (``inf`` past float range)."""
    try:
        return f"{math.exp(float(nll)):.4g}"
    except OverflowError:
        return "inf"
