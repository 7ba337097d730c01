"""Parallel jobs creating the same MLflow experiment all land in it (real MLflow, one fresh sqlite store).

A Hydra grid with a parallel launcher starts several jobs at once; each calls
:func:`quantverdict.results.tracking.experiment_id` through :class:`~quantverdict.results.tracking.Tracker`. Here N
separate processes are released at the same instant (a file barrier, after their imports) against
a store that does not exist yet, so they race both to create the database and the experiment.
Needs only the orchestrator environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quantverdict.config.compose import PROJECT_ROOT

pytestmark = pytest.mark.integration

N_JOBS = 4

# one job's tracking: import, build the tracker, wait for "go", then start and finish one run
JOB = r"""
import json, sys, time
from pathlib import Path
from quantverdict.config.schema import TrackingConfig
from quantverdict.results.tracking import Tracker

root, i = Path(sys.argv[1]), int(sys.argv[2])
cfg = TrackingConfig(name="sqlite", uri=f"sqlite:///{root}/mlflow.db", experiment="race",
                     artifact_location=str(root / "mlartifacts"))
tracker = Tracker(cfg)
(root / f"ready-{i}").touch()
while not (root / "go").exists():
    time.sleep(0.005)
tracker.start(f"job-{i}", {"job": str(i)})
out = root / f"out-{i}"
out.mkdir()
record = {"config": {"job": i}, "memory": {}, "accuracy": {}, "speed": {}, "status": "ok"}
(out / "record.json").write_text(json.dumps(record))
tracker.finish(record, out, [out / "record.json"])
print(json.dumps({"job": i, "experiment_id": tracker.experiment_id, "run_id": tracker.run_id}))
"""


def test_parallel_jobs_share_one_experiment(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    root = tmp_path / "store with space"  # the default output root may hold a space too
    root.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT / "src"), str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", JOB, str(root), str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(N_JOBS)
    ]
    deadline = time.monotonic() + 45
    while len(list(root.glob("ready-*"))) < N_JOBS:
        assert time.monotonic() < deadline, "the jobs did not get ready in 45 s"
        assert all(p.poll() is None for p in procs), [p.communicate()[1][-2000:] for p in procs if p.poll() is not None]
        time.sleep(0.05)
    (root / "go").touch()  # all N call experiment_id at the same moment, against a store not yet created
    results = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=60)
        assert p.returncode == 0, stderr[-3000:]
        results.append(json.loads(stdout.strip().splitlines()[-1]))

    client = MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
    experiments = [e for e in client.search_experiments() if e.name == "race"]
    assert len(experiments) == 1  # one experiment, not one per job
    exp_id = experiments[0].experiment_id
    assert {r["experiment_id"] for r in results} == {exp_id}
    runs = client.search_runs([exp_id])
    assert len(runs) == N_JOBS
    assert sorted(r.info.run_name for r in runs) == [f"job-{i}" for i in range(N_JOBS)]
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert all(
        sorted(a.path for a in client.list_artifacts(r.info.run_id)) == ["config.yaml", "record.json"] for r in runs
    )
