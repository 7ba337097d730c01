"""Bad input leaves nothing behind: a ``python -m pipelines.run`` refused with exit code 2 (a value no config
allows, or one the schema's checks refuse, for one job or for one job of a grid) makes no run folder, no record and
no MLflow run, not even the store. Real processes, a real sqlite store path under tmp_path."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from clihelp import run_cli

pytestmark = pytest.mark.integration


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    overrides = [a for a in args if a != "-m"]
    return run_cli(tmp_path / "out", *overrides, multirun="-m" in args, timeout=180)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["scheme=nope"], "scheme=nope: no such scheme"),
        (["bench.mode=concurrency", "bench.concurrencies=[0]"], "bench.concurrencies=[0] must be a non-empty list"),
        (["bench.num_prompts=0"], "bench.num_prompts=0 must be >= 1"),
        # a grid: one value refused for one job refuses the grid, naming that job by its sweep value
        (
            ["-m", "scheme=bf16,gptq", "scheme.calibration.num_samples=0"],
            "scheme.calibration.num_samples=0 must be >= 1 (in job scheme=gptq)",
        ),
    ],
)
def test_bad_input_leaves_no_folder_record_or_mlflow_run(tmp_path: Path, args: list[str], message: str) -> None:
    store = tmp_path / "store"
    store.mkdir()
    uri = f"sqlite:///{store}/mlflow.db"
    proc = run(tmp_path, *args, f"tracking.uri={uri}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr
    assert not (tmp_path / "out").exists()  # no run folder, no record
    assert list(store.iterdir()) == []  # not even the MLflow store: no run
