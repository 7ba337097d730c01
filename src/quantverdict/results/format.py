"""Number formatting shared by the results tables and the review: one rule for missing and non-finite values."""

from __future__ import annotations

import math
from typing import Any

DASH = "–"  # a table cell with no value


def number(v: Any, fmt: str = ".2f", suffix: str = "", missing: str = DASH) -> str:
    """``v`` formatted with ``fmt`` and ``suffix``; ``missing`` for None, NaN and ±inf.

    >>> number(0.3456), number(None), number(float("nan"), missing="n/a"), number(12, ",d", " tok")
    ('0.35', '–', 'n/a', '12 tok')
    """
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return missing
    return f"{v:{fmt}}{suffix}"
