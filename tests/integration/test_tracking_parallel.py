"""Parallel jobs creating the same MLflow experiment all land in it, and so do parallel reviews (real MLflow, one
fresh sqlite store each).

A Hydra grid with a parallel launcher starts several jobs at once; each calls
:func:`quantverdict.results.tracking.experiment_id` through :class:`~quantverdict.results.tracking.Tracker` when it
opens its run. Here N
separate processes are released at the same instant (a file barrier, after their imports) against
a store that does not exist yet, so they race both to create the database and the experiment.
Needs only the orchestrator environment.
"""

from __future__ import annotations

import hashlib
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

# one job's tracking: import (MLflow too: the tracker touches no store before its run opens), build the tracker,
# wait for "go", then open and finish the job's one run
JOB = r"""
import json, sys, time
from pathlib import Path
import mlflow
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
tracker.open()
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


N_REVIEWS = 3
CPU_RECORDS = PROJECT_ROOT / "docs" / "results" / "cpu-records" / "xeon-amx" / "smollm2-135m"

# one review through the command line's own main(), held just before it logs to MLflow until the test says "go"
REVIEW = r"""
import sys, time
from pathlib import Path
import quantverdict.review.core as core
from pipelines.review import main

root, i = Path(sys.argv[1]), sys.argv[2]
logging_review = core.log_review

def log_review_on_go(*args, **kwargs):
    (root / f"ready-{i}").touch()
    while not (root / "go").exists():
        time.sleep(0.005)
    return logging_review(*args, **kwargs)

core.log_review = log_review_on_go
sys.exit(main(sys.argv[3:]))
"""


def test_parallel_reviews_each_log_a_run_and_a_failed_log_fails_the_review(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    root = tmp_path / "store"
    root.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(PROJECT_ROOT / "src"), str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    # a value longer than MLflow takes (6000 characters): cut with the jobs' marker, whole value's sha256 and length
    prices = {f"GPU{n:04d}": 1.5 for n in range(500)}
    price_arg = "review.gpu_price_per_hour={" + ", ".join(f"{k}: {v}" for k, v in prices.items()) + "}"
    common = [str(CPU_RECORDS), f"paths.output_root={root}", "review.bootstrap_samples=1000", price_arg]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", REVIEW, str(root), str(i), *common, "--out", str(tmp_path / f"review-{i}")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(N_REVIEWS)
    ]
    deadline = time.monotonic() + 240
    while len(list(root.glob("ready-*"))) < N_REVIEWS:
        assert time.monotonic() < deadline, "the reviews did not get ready in 240 s"
        assert all(p.poll() is None for p in procs), [p.communicate()[1][-2000:] for p in procs if p.poll() is not None]
        time.sleep(0.05)
    assert not (root / "mlflow.db").exists()  # a fresh store: the three race to create it
    (root / "go").touch()
    for p in procs:
        _, stderr = p.communicate(timeout=240)
        assert p.returncode == 0, stderr[-3000:]

    client = MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
    (exp,) = [e for e in client.search_experiments() if e.name == "quantverdict"]
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`quantverdict.kind` = 'review'")
    assert len(runs) == N_REVIEWS and {r.info.status for r in runs} == {"FINISHED"}
    whole = str(prices)  # the review logs str() of each constraint's value
    marker = f"…[cut; sha256:{hashlib.sha256(whole.encode()).hexdigest()}; {len(whole)} chars]"
    for run in runs:
        logged = run.data.params["review.gpu_price_per_hour"]
        assert len(logged) == 6000 and logged == whole[: 6000 - len(marker)] + marker

    # a store that cannot be opened (its folder is a file): the review is written, says it was not logged, exits 1
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    out = tmp_path / "review-unlogged"
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.review", *common[:1], f"tracking.uri=sqlite:///{blocker}/mlflow.db",
         "review.bootstrap_samples=1000", "--out", str(out)],
        capture_output=True, text=True, env=env, cwd=PROJECT_ROOT, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert f"NOT logged to MLflow at sqlite:///{blocker}/mlflow.db" in proc.stderr
    assert (out / "review.md").is_file() and "review:" in proc.stdout
