"""``python -m pipelines.review`` on records copied from another checkout: the review logs to the MLflow store of
the checkout it runs in (or the one its command line names), never to the store named inside the records, and
writes its files under its own output folder, never next to the records.

The records are two committed CPU records (``docs/results/cpu-records``), copied with their ``bench/`` and
``eval/`` folders into a temporary folder; their ``config.tracking`` is pointed at the store of another checkout
whose ``outputs/`` folder exists (as a review's run of another checkout would find it). Real sqlite MLflow stores;
needs only the orchestrator environment.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from mlflow import MlflowClient

from pipelines.review import main
from quantverdict.config.compose import PROJECT_ROOT

pytestmark = pytest.mark.integration

CPU_RECORDS = PROJECT_ROOT / "docs" / "results" / "cpu-records" / "xeon-amx" / "smollm2-135m"


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` (relative path) with the sha256 of its bytes; folders as ``<dir>``."""
    return {
        str(p.relative_to(root)): "<dir>" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture
def copied(tmp_path: Path) -> tuple[Path, Path]:
    """(records folder, the other checkout's outputs folder that the records name as their store)."""
    other = tmp_path / "other-checkout" / "outputs"
    other.mkdir(parents=True)
    src = tmp_path / "records"
    for scheme in ("bf16", "int8"):
        shutil.copytree(CPU_RECORDS / scheme, src / scheme)
        path = src / scheme / "record.json"
        rec = json.loads(path.read_text())
        rec["config"]["tracking"] = {
            "name": "sqlite",
            "enabled": True,
            "uri": f"sqlite:///{other}/mlflow.db",
            "experiment": "quantverdict",
            "artifact_location": str(other / "mlartifacts"),
        }
        path.write_text(json.dumps(rec, indent=2))
    return src, other


def _review_runs(uri: str, experiment: str) -> list:
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment!r} at {uri}"
    return [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("quantverdict.kind") == "review"]


def test_review_of_copied_records_logs_here_and_writes_nothing_beside_them(
    copied: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, other = copied
    before = _tree(src)
    # this checkout's output root: its default store (conf/tracking/sqlite.yaml) is <root>/mlflow.db
    here = tmp_path / "this-checkout-outputs"
    monkeypatch.setenv("QV_OUTPUT_ROOT", str(here))

    assert main([str(src)]) == 0
    assert _tree(src) == before  # the records' folder byte for byte as it was: no reviews/ folder in it
    assert not (other / "mlflow.db").exists() and list(other.iterdir()) == []  # the store the records name
    (run,) = _review_runs(f"sqlite:///{here}/mlflow.db", "quantverdict")
    assert run.info.status == "FINISHED" and run.data.tags["quantverdict.source"] == str(src)
    (out,) = (here / "reviews").iterdir()  # the review's files under this checkout's outputs
    assert {"review.md", "review.html", "review.json"} <= {p.name for p in out.iterdir()}
    assert MlflowClient(tracking_uri=f"sqlite:///{here}/mlflow.db").list_artifacts(run.info.run_id)

    # a store given on the command line gets the next review; the folder and the records' store stay untouched
    given = tmp_path / "given"
    uri = f"sqlite:///{given}/mlflow.db"
    tracking = [f"tracking.uri={uri}", "tracking.experiment=isolated", f"tracking.artifact_location={given}/art"]
    assert main([str(src), *tracking, "--out", str(tmp_path / "rev")]) == 0
    (run,) = _review_runs(uri, "isolated")
    assert run.info.status == "FINISHED"
    assert (tmp_path / "rev" / "review.json").is_file()
    assert _tree(src) == before
    assert list(other.iterdir()) == []
    assert len(_review_runs(f"sqlite:///{here}/mlflow.db", "quantverdict")) == 1  # the first review only
