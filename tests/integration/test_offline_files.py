"""Offline source conversion on the real offline data folder: item counts and layout (the converters on small inputs:
tests/unit/test_offline_data.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import DATA_ROOT
from quantverdict.children import offline_data as od

pytestmark = pytest.mark.integration
needs_data = pytest.mark.skipif(not (DATA_ROOT / "SOURCES.md").is_file(), reason=f"no offline data at {DATA_ROOT}")


@needs_data
def test_prepare_real_files(tmp_path: Path) -> None:
    tasks = ["wikitext", "arc_easy", "arc_challenge", "piqa", "hellaswag", "boolq"]
    out = od.prepare(tasks, DATA_ROOT, tmp_path)
    # item counts from SOURCES.md; 62 WikiText-2 test articles as in EleutherAI/wikitext_document_level
    expected = {
        "wikitext": 62,
        "arc_easy": 2376,
        "arc_challenge": 1170,
        "piqa": 1838,
        "hellaswag": 10042,
        "boolq": 3270,
    }
    assert {t: out.info[t]["n_docs"] for t in tasks} == expected
    for t in tasks:
        yaml = (out.include_path / f"{t}.yaml").read_text()
        assert f"task: {t}\n" in yaml and str(out.data_files[t]) in yaml and "${" not in yaml
        assert Path(out.data_files[t]).is_absolute()
    assert (out.include_path / "utils.py").is_file()
    # the same inputs reuse the same directory
    assert od.prepare(tasks, DATA_ROOT, tmp_path).include_path == out.include_path
    first = json.loads(out.data_files["wikitext"].read_text().splitlines()[0])["page"]
    assert first.startswith(" = Robert Boulter = \n \n Robert Boulter is an English film")


@needs_data
def test_wikitext_valid_layout_reconstruction() -> None:
    # The tokenized WikiText-2 valid file still has its blank lines: removing them and restoring
    # them must give back 58 of its 60 articles byte for byte (measured when the rule was written).
    lines = (DATA_ROOT / "wikitext-2" / "valid.txt").read_text(encoding="utf-8").split("\n")
    original = od.wikitext_pages(lines)
    rebuilt = od.wikitext_pages(od.restore_wikitext_lines(lines))
    assert len(original) == len(rebuilt) == 60
    assert sum(a == b for a, b in zip(original, rebuilt)) == 58
