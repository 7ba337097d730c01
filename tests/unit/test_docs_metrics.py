"""The timeless-text pattern of tools/docs_metrics.py counts what the rule forbids and nothing else: a lease, a
session, an issue number, a date; not "release", not ``start_new_session``, not the JSON Schema dialect's name."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from quantverdict.config.compose import PROJECT_ROOT


def metrics_module() -> Any:
    spec = importlib.util.spec_from_file_location("docs_metrics", Path(PROJECT_ROOT) / "tools" / "docs_metrics.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("line", "forbidden"),
    [
        ("# measured on the fifth lease", True),
        ("# two H200 leases apart", True),
        ("# repeat r of two sessions is not a pair", True),
        ("TOLERANCE = 0.05  # issue 16: within 5%", True),
        ("(issue #17)", True),
        ("# records before 2026-12-01", True),
        ("# the seventeenth run", True),
        ("# the released config.json", False),
        ("lock file removed on release", False),
        ("subprocess.Popen(cmd, start_new_session=True)", False),
        ('"$schema": "https://json-schema.org/draft/2020-12/schema"', False),
        ("The JSON schema (draft 2020-12) of record.json", False),
        ("a window of at least 30 s", False),
    ],
)
def test_timeless_pattern(line: str, forbidden: bool) -> None:
    m = metrics_module()
    assert bool(m.TIMELESS.search(m.NOT_A_DATE.sub("", line))) is forbidden


def test_hits_are_counted_per_line(tmp_path: Path) -> None:
    m = metrics_module()
    (tmp_path / "a.py").write_text("x = 1  # the eighth lease, 2026-12-02\ny = 2  # a release\n")
    (tmp_path / "b.yaml").write_text("# issue 16\nkey: 1\n")
    m.ROOT = tmp_path
    assert m.timeless_hits(tmp_path) == ["a.py:1: x = 1  # the eighth lease, 2026-12-02", "b.yaml:1: # issue 16"]
