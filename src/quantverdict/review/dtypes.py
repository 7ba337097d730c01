"""The compute dtype a record was served in, and the flag when a scheme and its baseline differ in it."""

from __future__ import annotations

from typing import Any

from quantverdict.review import flags
from quantverdict.review.flags import Flag


def served_dtype(rec: dict[str, Any]) -> str | None:
    """The ``--dtype`` the record's vLLM server computed in, or None when nothing was served.

    Newer records say it in ``speed.dtype.value`` (chosen from the CPU, by the kernel or by the config; see
    :mod:`.cpu_caps`); older ones only have ``config.bench.server.dtype``. ``auto`` is vLLM's own
    choice, the checkpoint's dtype: the model's ``dtype`` (``config.model.dtype``).
    """
    speed = rec.get("speed") or {}
    if not speed.get("points"):
        return None
    cfg = rec.get("config") or {}
    value = (speed.get("dtype") or {}).get("value") or ((cfg.get("bench") or {}).get("server") or {}).get("dtype")
    if not value or value == "auto":
        value = (cfg.get("model") or {}).get("dtype") or None
    return str(value) if value else None


def dtype_flags(rec: dict[str, Any], base: dict[str, Any] | None) -> list[Flag]:
    """A flag when ``rec`` and its baseline were served in different compute dtypes (their speed ratio then
    measures the dtype as much as the scheme), with the recorded reason; [] otherwise."""
    if base is None or base is rec:
        return []
    mine, theirs = served_dtype(rec), served_dtype(base)
    if not mine or not theirs or mine == theirs:
        return []
    why = ((rec.get("speed") or {}).get("dtype") or {}).get("why")
    return [
        Flag(
            flags.DTYPE_MISMATCH,
            "",
            f"served in {mine}, its baseline in {theirs}: the speed ratio mixes compute dtypes"
            + (f" ({why})" if why else ""),
        )
    ]
