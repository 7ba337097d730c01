"""The compute dtype a record was served in, and the flag when a scheme and its baseline differ in it."""

from __future__ import annotations

from quantverdict.results.record import JobRecord
from quantverdict.review import flags
from quantverdict.review.flags import Flag


def served_dtype(rec: JobRecord) -> str | None:
    """The ``--dtype`` the record's vLLM server computed in, or None when nothing was served.

    The record says it in ``speed.dtype.value`` (chosen from the CPU, by the kernel, by the config or the
    checkpoint's; :mod:`quantverdict.config.cpu_caps`, and :mod:`quantverdict.results.migrate` for older records).
    ``auto`` is vLLM's own choice, the checkpoint's dtype: what vLLM's log says it ran in, else the model's
    ``dtype`` (``config.model.dtype``).
    """
    if not rec.speed.points:
        return None
    value = (rec.speed.dtype or {}).get("value")
    if value == "auto":
        value = rec.server.dtype or rec.cfg("model").get("dtype")
    return str(value) if value else None


def dtype_flags(rec: JobRecord, base: JobRecord | None) -> list[Flag]:
    """A flag when ``rec`` and its baseline were served in different compute dtypes (their speed ratio then
    measures the dtype as much as the scheme), with the recorded reason; [] otherwise."""
    if base is None or base is rec:
        return []
    mine, theirs = served_dtype(rec), served_dtype(base)
    if not mine or not theirs or mine == theirs:
        return []
    why = (rec.speed.dtype or {}).get("why")
    return [
        Flag(
            flags.DTYPE_MISMATCH,
            "",
            f"served in {mine}, its baseline in {theirs}: the speed ratio mixes compute dtypes"
            + (f" ({why})" if why else ""),
        )
    ]
