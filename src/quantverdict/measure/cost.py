"""Serving cost in US dollars per million output tokens, from a GPU price and a measured throughput.

Standard library only. The formula is the definition of the unit: the GPUs a scheme needs cost
``price_per_gpu_hour * n_gpus`` dollars per hour and produce ``output_tok_s * 3600`` output tokens per
hour at the stated load (the throughput measured by the serving sweep, ``vllm bench serve``'s output
token throughput at that request rate or concurrency), so::

    usd_per_mtok = price_per_gpu_hour * n_gpus / (output_tok_s * 3600) * 1e6

It prices GPU time only (no CPU, memory, power or idle capacity) and holds only at the load whose
throughput is used: the same scheme costs more per token at a lighter load.
"""

from __future__ import annotations

import math

__all__ = ["energy_usd_per_mtok", "usd_per_mtok", "usd_per_mtok_or_none"]

SECONDS_PER_HOUR = 3600.0
TOKENS_PER_MTOK = 1e6
JOULES_PER_KWH = 3.6e6


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def usd_per_mtok(price_per_gpu_hour: float, n_gpus: int, output_tok_s: float) -> float:
    """Dollars per million output tokens: ``price_per_gpu_hour * n_gpus / (output_tok_s * 3600) * 1e6``.

    Example (hand-worked): $3.60 per GPU-hour, 2 GPUs, 1000 output tok/s -> $7.20/h over 3.6 M tok/h
    -> $2.00 per million output tokens.

    Args:
        price_per_gpu_hour: price of one GPU for one hour, USD (> 0).
        n_gpus: GPUs the scheme needs (tensor x pipeline parallel size), an int >= 1.
        output_tok_s: measured output throughput at the stated load, output tokens per second (> 0).

    Returns:
        USD per 10^6 output tokens.

    Raises:
        ValueError: a non-positive, non-finite or non-numeric input, or ``n_gpus`` not an int.
    """
    price = _positive("price_per_gpu_hour", price_per_gpu_hour)
    if isinstance(n_gpus, bool) or not isinstance(n_gpus, int) or n_gpus < 1:
        raise ValueError(f"n_gpus must be an int >= 1, got {n_gpus!r}")
    tok_s = _positive("output_tok_s", output_tok_s)
    return price * n_gpus / (tok_s * SECONDS_PER_HOUR) * TOKENS_PER_MTOK


def usd_per_mtok_or_none(price_per_gpu_hour: float | None, n_gpus: int, output_tok_s: float | None) -> float | None:
    """:func:`usd_per_mtok`, or None when there is no price (no cost line) or no measured throughput.

    Args:
        price_per_gpu_hour: USD per GPU-hour, or None when the review config gives no price for the GPU kind.
        n_gpus: GPUs the scheme needs.
        output_tok_s: measured output tokens per second at the stated load, or None when not measured.

    Returns:
        USD per million output tokens, or None.

    Raises:
        ValueError: as :func:`usd_per_mtok` for inputs that are given but invalid (a price of 0 is an
            error, not "free": leave the price out to have no cost line).
    """
    if price_per_gpu_hour is None or output_tok_s is None:
        return None
    return usd_per_mtok(price_per_gpu_hour, n_gpus, output_tok_s)


def energy_usd_per_mtok(j_per_output_token: float, usd_per_kwh: float) -> float:
    """Dollars of GPU energy per million output tokens: ``j_per_output_token * 1e6 / 3.6e6 * usd_per_kwh``
    (1 kWh = 3.6e6 J). The energy is the GPU's alone (NVML), so the host's power and cooling are not in it.

    Example (hand-worked): 0.0692 J per output token at $0.15 per kWh -> 69,200 J per million tokens
    = 0.019222 kWh -> $0.0028833 per million output tokens.

    Args:
        j_per_output_token: the GPU's energy over a measured window divided by its output tokens, J (> 0).
        usd_per_kwh: the electricity price, USD per kWh (> 0).

    Returns:
        USD per 10^6 output tokens.

    Raises:
        ValueError: a non-positive, non-finite or non-numeric input.
    """
    joules = _positive("j_per_output_token", j_per_output_token) * TOKENS_PER_MTOK
    return joules / JOULES_PER_KWH * _positive("usd_per_kwh", usd_per_kwh)
