"""The timeless-text pattern of tools/docs_metrics.py counts what the rule forbids (the words, numbers and dates of
a machine's history) and nothing else: not "release", not ``start_new_session``, not the JSON Schema dialect's name,
not pytest's fixture scope value."""

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


# the forbidden words are assembled from parts here, so that the grep this test checks does not count its own examples
W_L, W_S, W_I, W_D = "le" + "ase", "ses" + "sion", "is" + "sue", "2026" + "-12-01"


@pytest.mark.parametrize(
    ("line", "forbidden"),
    [
        (f"# measured on the fifth {W_L}", True),
        (f"# two H200 {W_L}s apart", True),
        (f"# repeat r of two {W_S}s is not a pair", True),
        (f"TOLERANCE = 0.05  # {W_I} 16: within 5%", True),
        (f"({W_I} #17)", True),
        (f"# records before {W_D}", True),
        ("# the seven" + "teenth run", True),
        ("# the released config.json", False),
        ("lock file removed on release", False),
        ("subprocess.Popen(cmd, start_new_session=True)", False),
        ('"$schema": "https://json-schema.org/draft/2020-12/schema"', False),
        ("The JSON schema (draft 2020-12) of record.json", False),
        (f'@pytest.fixture(scope="{W_S}")', False),
        (f"@pytest.fixture(scope='{W_S}')", False),
        (f"# built once a {W_S}", True),
        (f'@pytest.fixture(scope="{W_S}")  # once a {W_S}', True),
        ("a window of at least 30 s", False),
    ],
)
def test_timeless_pattern(line: str, forbidden: bool) -> None:
    m = metrics_module()
    assert bool(m.TIMELESS.search(m.NOT_HISTORY.sub("", line))) is forbidden


def test_hits_are_counted_per_line(tmp_path: Path) -> None:
    m = metrics_module()
    (tmp_path / "a.py").write_text(f"x = 1  # the eighth {W_L}, {W_D}\ny = 2  # a release\n")
    (tmp_path / "b.yaml").write_text(f"# {W_I} 16\nkey: 1\n")
    m.ROOT = tmp_path
    assert m.timeless_hits(tmp_path) == [f"a.py:1: x = 1  # the eighth {W_L}, {W_D}", f"b.yaml:1: # {W_I} 16"]
