"""The design card's own command on a machine without the Hugging Face hub: refused before any work.

Real ``python -m pipelines.run`` with a real MLflow store; no stage environment is built or started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from quantverdict.config.compose import PROJECT_ROOT

pytestmark = pytest.mark.integration


def test_a_job_this_machine_cannot_run_is_refused_before_any_work(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.run",
            "scheme=awq",
            "model=qwen3.5-9b",
            f"paths.output_root={tmp_path / 'out'}",
            f"paths.cache_root={tmp_path / 'cache'}",
        ],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "HF_HUB_OFFLINE": "1"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-2000:]  # bad input for this machine, nothing ran
    assert "this machine cannot run the job" in out and "model.source=local" in out and "HF_HUB_OFFLINE" in out
    (rec,) = [json.loads(p.read_text()) for p in (tmp_path / "out" / "runs").glob("*/record.json")]
    assert rec["status"] == "failed" and rec["failed_stage"] == "preflight"
    assert "setup" not in rec["stages"] and not (tmp_path / "cache" / "models").exists()  # nothing was built
