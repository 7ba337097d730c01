"""What a stage child's own module sets in its environment before the stage imports torch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from quantverdict.config.compose import PROJECT_ROOT

SHOW = "import os, quantverdict.children._child; print(os.environ.get('OMP_WAIT_POLICY'))"


@pytest.mark.parametrize(("given", "seen"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_openmp_waits_passively_unless_the_environment_says_otherwise(given: str | None, seen: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    env["PYTHONPATH"] = str(PROJECT_ROOT / "src")
    out = subprocess.run([sys.executable, "-c", SHOW], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == seen
