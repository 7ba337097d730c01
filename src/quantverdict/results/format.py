"""Number formatting shared by the results tables and the review: one rule for missing and non-finite values."""

from __future__ import annotations

import math
from typing import Any

from quantverdict.results.record import GpuInfo

DASH = "–"  # a table cell with no value


def number(v: Any, fmt: str = ".2f", suffix: str = "", missing: str = DASH) -> str:
    """``v`` formatted with ``fmt`` and ``suffix``; ``missing`` for None, NaN and ±inf.

    >>> number(0.3456), number(None), number(float("nan"), missing="n/a"), number(12, ",d", " tok")
    ('0.35', '–', 'n/a', '12 tok')
    """
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return missing
    return f"{v:{fmt}}{suffix}"


def gpu_limits(gpu: GpuInfo | dict[str, Any]) -> list[str]:
    """The power cap and top SM clock a record keeps for a GPU (``enforced_power_limit_w``, ``clocks_max_sm_mhz``
    of :func:`quantverdict.orchestrate.hardware.gpu_info`; older records lack them), as words for a hardware line; the
    parts not recorded are left out.

    >>> gpu_limits({"enforced_power_limit_w": 700.0, "clocks_max_sm_mhz": 1980.0}), gpu_limits({"name": "T4"})
    (['power limit 700 W', 'max SM clock 1980 MHz'], [])
    """
    typed = gpu if isinstance(gpu, GpuInfo) else GpuInfo.of(gpu)
    parts = []
    if typed.enforced_power_limit_w is not None:
        parts.append(f"power limit {typed.enforced_power_limit_w:g} W")
    if typed.clocks_max_sm_mhz is not None:
        parts.append(f"max SM clock {typed.clocks_max_sm_mhz:g} MHz")
    return parts
