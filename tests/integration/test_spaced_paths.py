"""A whole job through the command line with every folder under a name holding a space: output root
(records, stage specs, MLflow store and artifacts), cache root (model, lm-eval's converted data) and the
offline data. bf16 with a two-item evaluation: the evaluate child runs for real, nothing is quantized."""

from __future__ import annotations

from pathlib import Path

import pytest

from clihelp import run_cli
from conftest import DATA_ROOT
from quantverdict.results.record import find_records, load

pytestmark = pytest.mark.integration


def test_job_in_folders_with_spaces(tmp_path: Path, embedded_model: dict) -> None:
    out, cache, data = tmp_path / "my runs", tmp_path / "my cache", tmp_path / "offline data"
    (cache / "models").mkdir(parents=True)
    model_dir = Path(embedded_model["path"])
    (cache / "models" / model_dir.name).symlink_to(model_dir)  # the cached bf16 model, not materialized again
    for src in DATA_ROOT.rglob("*"):
        if src.is_file():
            (data / src.relative_to(DATA_ROOT)).parent.mkdir(parents=True, exist_ok=True)
            (data / src.relative_to(DATA_ROOT)).symlink_to(src)
    proc = run_cli(
        out,
        "scheme=bf16",
        f"paths.cache_root={cache}",
        f"data.offline_root={data}",
        "bench.enabled=false",
        "eval.tasks=[arc_easy]",
        "eval.limit=2",
        "eval.token_perplexity.enabled=false",
        "eval.batch_invariance_check=false",
        timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    (path,) = find_records(out / "runs")
    rec = load(path)
    job_dir = path.parent
    assert " " in str(job_dir) and rec["job"]["output_dir"] == str(job_dir)
    assert rec["status"] == "ok" and rec["stages"]["materialize"]["status"] == "cached"
    assert rec["stages"]["evaluate"]["status"] == "ok"
    assert rec["accuracy"]["tasks"]["arc_easy"]["n"] == 2
    assert (job_dir / "evaluate.spec.json").is_file() and (job_dir / "eval" / "samples_arc_easy.jsonl").is_file()
    assert list((cache / "data").rglob("arc_easy.jsonl"))  # lm-eval read its converted data from the spaced cache

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out}/mlflow.db")
    exp = client.get_experiment_by_name("quantverdict")
    (run,) = [r for r in client.search_runs([exp.experiment_id]) if "config_hash" in r.data.tags]
    assert run.info.status == "FINISHED"
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"record.json", "eval"}
