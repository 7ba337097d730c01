"""The reviews and GPU tables committed in docs/results regenerate identically from their records
(tests/regen_docs_results.py; about 15 s on 2 cores: every review is a child process)."""

from __future__ import annotations

from pathlib import Path

from regen_docs_results import regenerate


def test_docs_results_regenerate_identically(tmp_path: Path) -> None:
    compared, problems = regenerate(tmp_path)
    assert len(compared) >= 58  # 8 reviews x (md, html, json, 3-4 plots) + 5 GPU tables
    assert problems == []
