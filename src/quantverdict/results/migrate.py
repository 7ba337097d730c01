"""Records of older schema versions read as the current one: the only code that knows older layouts.

Every reader gets records through :func:`quantverdict.results.record.load`, which calls :func:`upgrade`; no
other module branches on a record's version or on keys an older version lacked. What each version changed:

* **1 -> 2**: nothing in the layout (2 marks records written by the typed record code).
* **2 -> 3**: every sweep point and load level states what older records left to the reader:
  ``valid`` (a point without it: output tokens >= 90% of those requested and at least one request
  completed, :func:`quantverdict.measure.validity.point_valid`), ``saturated``
  with its ratio and basis (completion pace over arrival pace, :func:`quantverdict.measure.validity.saturation`,
  from what the point kept: :func:`quantverdict.measure.validity.older_point_saturation`; an older basis, the
  whole-run or steady-window rate, is replaced), and ``offered_rate_rps`` (``"inf"`` where older
  records wrote null for a closed loop or a burst); ``speed.dtype`` (the compute dtype the server ran in)
  where older records only kept the configured ``bench.server.dtype`` (``auto``: the checkpoint's dtype,
  ``config.model.dtype``); the checkpoint's ``effective_bits_per_weight`` under that name (early records wrote
  ``effective_bits_per_quantized_weight``).

The current version is validated against its model (:class:`quantverdict.results.record.JobRecord`) when
written and when read: a key a section does not name is refused.

A migrated record keeps the version it was written in as ``migrated_from``; a record of the current version is
returned as read.
"""

from __future__ import annotations

import copy
from typing import Any

from quantverdict import RECORD_SCHEMA_VERSION
from quantverdict.measure import validity
from quantverdict.measure.sweep_plan import INF, is_inf_rate

CURRENT_VERSION = RECORD_SCHEMA_VERSION
READABLE_VERSIONS = tuple(range(1, CURRENT_VERSION + 1))


def upgrade(data: dict[str, Any], where: str = "record") -> dict[str, Any]:
    """``data`` (a record dict of any readable version) as a version :data:`CURRENT_VERSION` record.

    Args:
        data: the record as read from its JSON.
        where: what to call the record in an error (its path).

    Returns:
        ``data`` itself when it is of the current version, else an upgraded copy (``data`` is left as read).

    Raises:
        ValueError: ``data`` is not a quantverdict record, or of a version this code does not read (newer:
            written by a newer quantverdict).
    """
    tool = data.get("tool")
    if not isinstance(tool, dict) or tool.get("name") != "quantverdict" or "schema_version" not in data:
        raise ValueError(f"{where} is not a quantverdict record")
    version = data["schema_version"]
    if version not in READABLE_VERSIONS:
        newer = isinstance(version, int) and version > CURRENT_VERSION
        raise ValueError(
            f"{where} has schema_version {version!r}; this code reads "
            f"{', '.join(map(str, READABLE_VERSIONS))}" + (" (written by a newer quantverdict)" if newer else "")
        )
    if version == CURRENT_VERSION:
        return data
    data = copy.deepcopy(data)
    _v2_to_v3(data)
    data["migrated_from"] = version
    data["schema_version"] = CURRENT_VERSION
    return data


def _v2_to_v3(data: dict[str, Any]) -> None:
    checkpoint = (data.get("memory") or {}).get("checkpoint")
    if isinstance(checkpoint, dict) and "effective_bits_per_quantized_weight" in checkpoint:
        bits = checkpoint.pop("effective_bits_per_quantized_weight")
        checkpoint.setdefault("effective_bits_per_weight", bits)
    speed = data.get("speed")
    if not isinstance(speed, dict):
        return
    points = speed.get("points")
    for p in points if isinstance(points, list) else []:
        if not isinstance(p, dict):
            continue
        if p.get("concurrency") is not None or is_inf_rate(p.get("offered_rate_rps")):
            p["offered_rate_rps"] = INF
        p.setdefault("valid", validity.point_valid(p))
        if p.get("saturation_basis") not in validity.RULE_BASES:  # decided on another basis, or not at all
            p.update(validity.older_point_saturation(p))
    levels = speed.get("summary")
    for lv in levels if isinstance(levels, list) else []:
        if isinstance(lv, dict) and (lv.get("concurrency") is not None or is_inf_rate(lv.get("offered_rate_rps"))):
            lv["offered_rate_rps"] = INF
    if points and not isinstance(speed.get("dtype"), dict):
        config: dict[str, Any] = data["config"] if isinstance(data.get("config"), dict) else {}
        configured = ((config.get("bench") or {}).get("server") or {}).get("dtype")
        if configured and configured != "auto":
            speed["dtype"] = {"value": configured, "chosen_by": "config", "why": "bench.server.dtype"}
        elif model_dtype := (config.get("model") or {}).get("dtype"):  # vLLM's auto: the checkpoint's dtype
            speed["dtype"] = {"value": model_dtype, "chosen_by": "checkpoint", "why": "vLLM's auto"}
