"""What one job prints at its end: the record's path, what it cannot conclude without the baseline and how to get
the verdict, and where its MLflow runs table is. A real ``python -m pipelines.run`` (evaluation and sweep off: the
stages before them run, the checkpoint from the cache: the ``quantized`` fixture's int8 entry, reused) with a real
sqlite store under tmp_path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mlflow import MlflowClient

from clihelp import run_cli
from quantverdict.results.record import find_records, load

pytestmark = pytest.mark.integration


def test_a_single_job_names_its_record_and_what_it_cannot_conclude(tmp_path: Path, quantized: dict) -> None:
    made = quantized["int8"][0]  # made in the checkpoint cache first (or found there), as a job would
    proc = run_cli(tmp_path, "scheme=int8", "eval.enabled=false", "bench.enabled=false", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    (record,) = find_records(tmp_path / "runs")
    # the job reached the fixture's cache entry: the same key and folder, reused, not quantized again
    rec = load(record)
    assert rec["stages"]["quantize"]["status"] == "cached"
    assert (rec["checkpoint"]["key"], rec["checkpoint"]["path"]) == (made["key"], made["path"])
    assert f"record: {record}" in lines
    assert (
        "Alone, this job gives int8's own numbers for smollm2-135m (weights, accuracy scores, speed where served), "
        "not a verdict: accuracy loss and speedup are measured against the bf16 baseline of the same model and "
        "machine."
    ) in lines
    assert any(line.startswith("For the verdict: python -m pipelines.run -m scheme=bf16,int8 ") for line in lines)
    # the runs table of the store the job logged to (paths.output_root's sqlite file), its experiment's id
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    exp = MlflowClient(tracking_uri=uri).get_experiment_by_name("quantverdict")
    assert (
        f"MLflow runs: mlflow ui --backend-store-uri {uri}, then open http://127.0.0.1:5000/#/experiments/"
        f"{exp.experiment_id}/runs?workflowType=machine_learning&viewStateShareKey=quantverdict-runs"
    ) in lines
    # one console line per stage it ran, in the short form; no child's output
    stages = [m.group(1) for line in lines if (m := re.fullmatch(r"\d\d:\d\d:\d\d INFO == stage (\w+): .*", line))]
    assert stages == ["preflight", "setup", "cpu_check", "materialize", "quantize", "memory"]
    assert not [line for line in lines if line.startswith("[") and "] " in line[:20]]  # "[quantize] ..." and alike
