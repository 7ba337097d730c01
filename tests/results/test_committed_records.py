"""Every committed record (docs/results) reads back through the typed record: as written when of this version,
migrated and validated when older."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantverdict.results.record import read

DOCS = Path(__file__).resolve().parents[2] / "docs" / "results"


@pytest.mark.parametrize("path", sorted(DOCS.rglob("record.json")), ids=lambda p: str(p.relative_to(DOCS)))
def test_committed_records_round_trip(path: Path) -> None:
    # a record of this version reads back as written; an older one is read migrated and validated, everything else
    # as written
    data = json.loads(path.read_text())
    if data["schema_version"] == 3:
        assert read(path).to_dict() == data
        return
    assert data["schema_version"] in (1, 2)
    got = read(path).to_dict()
    assert (got["schema_version"], got["migrated_from"]) == (3, data["schema_version"])
    added_dtype = bool((data.get("speed") or {}).get("points")) and not (data.get("speed") or {}).get("dtype")
    if added_dtype:
        assert got["speed"]["dtype"]["value"] in ("bfloat16", "float16", "float32")
        got["speed"].pop("dtype")
    for new, old in zip(got.get("speed", {}).get("points") or [], (data.get("speed") or {}).get("points") or []):
        for key in ("saturated", "saturation_ratio", "saturation_basis"):  # decided again by the pace rule
            new.pop(key, None), old.pop(key, None)
    rest = {k: v for k, v in got.items() if k not in ("schema_version", "migrated_from")}
    assert rest == {k: v for k, v in data.items() if k != "schema_version"}
