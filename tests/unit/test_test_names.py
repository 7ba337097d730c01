"""pytest imports test files by their basename (no packages under tests/): two files of one name in different tiers
make the second one fail to collect when the tiers run in one pytest run (``pytest tests/unit tests/integration``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_file_name_is_used_once() -> None:
    names = Counter(p.name for p in TESTS.rglob("test_*.py") if "fixtures" not in p.parts)
    assert [n for n, k in names.items() if k > 1] == []
