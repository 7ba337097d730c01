"""The design card's own command on a machine without the Hugging Face hub: refused before any work, leaving
nothing behind (no run folder, record or MLflow run), as one job and as a grid.

Real ``python -m pipelines.run`` with a real MLflow store; no stage environment is built or started.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from quantverdict.config.compose import PROJECT_ROOT

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("grid", [False, True], ids=["job", "grid"])
def test_a_job_this_machine_cannot_run_is_refused_before_any_work(tmp_path: Path, grid: bool) -> None:
    store = tmp_path / "store"
    store.mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.run",
            *(["-m", "scheme=awq,gptq"] if grid else ["scheme=awq"]),
            "model=qwen3.5-9b",
            f"paths.output_root={tmp_path / 'out'}",
            f"paths.cache_root={tmp_path / 'cache'}",
            f"tracking.uri=sqlite:///{store}/mlflow.db",
        ],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "HF_HUB_OFFLINE": "1"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-2000:]  # bad input for this machine, nothing ran
    assert "this machine cannot run the job" in out and "model.source=local" in out and "HF_HUB_OFFLINE" in out
    # nothing left: the run (or grid) folder with its records removed, no MLflow store made, nothing built
    assert list((tmp_path / "out").iterdir()) == [], list((tmp_path / "out").rglob("*"))
    assert list(store.iterdir()) == []
    assert not (tmp_path / "cache" / "models").exists()
