"""The sanity verdict on a quantized checkpoint against its source model (standard library only).

A checkpoint whose files match their checksums can still be wrong: a zero or NaN ``weight_scale`` written
when it was made decodes to zero or NaN weights, and the model then scores text near chance (a token
perplexity of 10^5 on a model whose baseline scores 10). The numbers come from
:mod:`quantverdict.children.checkpoint_sanity`, which runs the source model and the checkpoint on the same
fixed token windows; :func:`judge` compares them with the bounds of ``quantize.sanity`` (conf/config.yaml).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class SanityNumbers:
    """What :func:`judge` compares, from :func:`quantverdict.children.checkpoint_sanity.compare`: ``finite`` (every
    logit of the checkpoint finite), ``nll_source`` and ``nll_checkpoint`` (mean next-token NLL, nats/token),
    ``ppl_ratio`` (``exp(nll_checkpoint - nll_source)``, the checkpoint's token perplexity over the source's on the
    same tokens) and ``mean_kld`` (mean per-token KL(source || checkpoint) over the full vocabulary, nats). A number
    is None where it is not finite or past float range (the child writes no inf or NaN into JSON)."""

    finite: bool
    nll_source: float | None
    nll_checkpoint: float | None
    ppl_ratio: float | None
    mean_kld: float | None

    @classmethod
    def of(cls, result: Mapping[str, Any]) -> SanityNumbers:
        """The numbers of a sanity result as its JSON holds them (the child's, or one stored beside a checkpoint);
        its other keys (``n_tokens``, times) are left.

        Raises:
            ValueError: a key missing, ``finite`` not a bool, or a number neither a number nor None (the key named).
        """
        missing = [f.name for f in fields(cls) if f.name not in result]
        if missing:
            raise ValueError(f"the sanity result lacks {', '.join(missing)}")
        if not isinstance(result["finite"], bool):
            raise ValueError(f"the sanity result's finite is {result['finite']!r}, not true or false")
        nums = {f.name: result[f.name] for f in fields(cls) if f.name != "finite"}
        for key, value in nums.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"the sanity result's {key} is {value!r}, not a number or null")
        return cls(finite=result["finite"], **{k: None if v is None else float(v) for k, v in nums.items()})


def judge(numbers: SanityNumbers, max_ppl_ratio: float, max_mean_kld: float, finite_only: bool = False) -> str | None:
    """Why the checkpoint fails its sanity check, or None when it passes.

    Args:
        numbers: the checkpoint against its source model on the check windows (:class:`SanityNumbers`).
        max_ppl_ratio: the largest ``ppl_ratio`` that passes.
        max_mean_kld: the largest ``mean_kld`` that passes.
        finite_only: judge finite logits only (a model with random weights: its perplexity and KL say nothing).

    Returns:
        A sentence naming the measured value and the bound it broke; None when within every bound.
    """
    if not numbers.finite:
        return "non-finite logits (NaN or inf) on the check windows"
    if finite_only:
        return None
    # None: past float range
    ratio = math.inf if numbers.ppl_ratio is None else numbers.ppl_ratio
    kld = math.inf if numbers.mean_kld is None else numbers.mean_kld
    if not math.isfinite(ratio) or ratio > max_ppl_ratio:
        return (
            f"token perplexity {ratio:.4g}x the source model's on the check windows "
            f"({_ppl(numbers.nll_checkpoint)} vs {_ppl(numbers.nll_source)}; "
            f"quantize.sanity.max_ppl_ratio={max_ppl_ratio})"
        )
    if not math.isfinite(kld) or kld > max_mean_kld:
        return (
            f"mean KL divergence to the source model {kld:.4g} nats/token on the check windows "
            f"(quantize.sanity.max_mean_kld={max_mean_kld})"
        )
    return None


def _ppl(nll: float | None) -> str:
    """Token perplexity of a mean NLL (nats), in 4 significant digits (``inf`` past float range or for None)."""
    if nll is None:
        return "inf"
    try:
        return f"{math.exp(nll):.4g}"
    except OverflowError:
        return "inf"
