"""MLflow's UI as a person sees it: a real ``mlflow server`` on a real sqlite store holding six job runs (one run
each, its stages as tags) and the grid's review, read by headless Chromium (MLflow's UI is a JavaScript app: the DOM
is dumped after its scripts ran). Asserts on the page's text: the runs page lists every job run and the review run,
nothing else, with the status, the three numbers and the verdict as columns, and the experiment is a model-training
one. Leaves no process behind.

MLflow 3.17.2's UI picks an experiment's page from a switch of the whole UI (GenAI / Model training), not from
the experiment's ``mlflow.experimentKind`` tag: :func:`quantverdict.results.tracking.runs_page` is the address
that opens the runs table; the plain experiment address opens the GenAI overview on a first visit (checked
below, so that a later MLflow that reads the tag shows up here).
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow import MlflowClient

from browser import chromium, mlflow_server, rendered_text, screenshot, visible_text
from pipelines.review import main
from quantverdict.config.schema import TrackingConfig
from quantverdict.results.tracking import Tracker, runs_page
from review_records import grid

pytestmark = [pytest.mark.integration, pytest.mark.browser]
SCHEMES = ("bf16", "int8", "fp8", "w8a8", "gptq", "awq")
UI_WAIT_MS = 20_000  # virtual time for the UI's scripts to fetch and render the runs


def _store(tmp: Path) -> tuple[str, Path]:
    """A sqlite store with the six jobs of review_records.grid (runs m/<scheme>, each with its 'quantize' stage as
    a tag) and their review logged by ``python -m pipelines.review``. Returns (uri, grid folder)."""
    uri = f"sqlite:///{tmp}/mlflow.db"
    MlflowClient(tracking_uri=uri).create_experiment("exp", artifact_location=(tmp / "artifacts").as_uri())
    src = tmp / "multirun"
    for rec in grid():
        d = src / f"m_{rec['job']['scheme']}"
        d.mkdir(parents=True)
        rec["job"]["output_dir"] = str(d)
        rec["config"]["tracking"] = {"name": "t", "enabled": True, "uri": uri, "experiment": "exp"}
        (d / "record.json").write_text(json.dumps(rec))
        tr = Tracker(TrackingConfig(name="t", uri=uri, experiment="exp"))
        scheme = rec["job"]["scheme"]
        tr.start(f"m/{scheme}", {"model": "m", "scheme": scheme, "config_hash": "x", "output_dir": str(d)})
        tr.stage("quantize", "ok", 1.0)
        tr.finish(rec, d, [d / "record.json"])
    tracking = [f"tracking.uri={uri}", "tracking.experiment=exp", f"paths.output_root={tmp}"]
    assert main([str(src), "review.memory_budget_gib=0.22", *tracking]) == 0
    return uri, src


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """``mlflow server`` over the store (:func:`browser.mlflow_server`: stopped with its whole process tree,
    checked gone); yields (address, experiment id)."""
    tmp = tmp_path_factory.mktemp("mlflow-ui")
    uri, _ = _store(tmp)
    exp = MlflowClient(tracking_uri=uri).get_experiment_by_name("exp")
    with mlflow_server(uri, tmp) as address:
        yield address, str(exp.experiment_id)


def test_runs_page_lists_every_job_run(server: tuple[str, str], tmp_path: Path) -> None:
    address, exp_id = server
    url = runs_page(exp_id, address)
    # wide enough for every column of the view: the table draws only the columns inside the window
    text = visible_text(
        chromium([f"--virtual-time-budget={UI_WAIT_MS}", "--dump-dom", url], tmp_path, (2400, 1200)).stdout
    )
    assert f"Runs - Experiment {exp_id} - MLflow" in text  # the page's title: the runs table opened
    assert "Traces 0" not in text  # not the GenAI overview the experiment used to open on
    # one row per job and one for the review: no stage rows
    for scheme in SCHEMES:
        assert f"m/{scheme}" in text, scheme
    assert "review/gpu-" in text
    assert "quantize" not in text.replace("do not quantize", "").replace("quantize gptq", "")
    # the columns of the stored view: the job's status, the three numbers, the verdict (budget 0.22 GiB: gptq)
    for column in ("quantverdict.status", "mem_gib", "acc_delta", "speed_ratio_c1", "speed_ratio_load", "verdict"):
        assert column in text, column
    assert "m: quantize gptq (W4A16)" in text
    screenshot(url, tmp_path / "mlflow-runs.png", tmp_path, (1400, 800), UI_WAIT_MS)


def test_experiment_is_marked_model_training(server: tuple[str, str]) -> None:
    """The kind tag, read back through the server's REST API (what the UI reads)."""
    address, exp_id = server
    with urllib.request.urlopen(f"{address}/api/2.0/mlflow/experiments/get?experiment_id={exp_id}") as r:
        tags = {t["key"]: t["value"] for t in json.load(r)["experiment"]["tags"]}
    assert tags["mlflow.experimentKind"] == "custom_model_development"


def test_plain_experiment_address_opens_the_genai_overview(server: tuple[str, str], tmp_path: Path) -> None:
    """MLflow 3.17.2 ignores the kind tag on a first visit to ``#/experiments/<id>``: it opens the GenAI
    overview. When this fails, MLflow reads the tag again: the plain address then opens the runs."""
    address, exp_id = server
    text = rendered_text(f"{address}/#/experiments/{exp_id}", tmp_path, UI_WAIT_MS)
    assert f"Overview - Experiment {exp_id} - MLflow" in text


def test_compare_view_shows_the_short_names(server: tuple[str, str], tmp_path: Path) -> None:
    """Three job runs compared: the metrics table starts with ``acc_delta`` (alphabetical, before the ~60
    flattened ``accuracy.*`` names) and the tags table names the reviewed grid."""
    address, exp_id = server
    client = MlflowClient(tracking_uri=f"{address}")
    runs = [r.info.run_id for r in client.search_runs([exp_id], "tags.config_hash = 'x'")][:3]
    query = urllib.parse.urlencode({"runs": json.dumps(runs), "experiments": json.dumps([exp_id])})
    text = rendered_text(f"{address}/#/compare-runs?{query}", tmp_path, UI_WAIT_MS)
    assert "Comparing 3 Runs from 1 Experiment" in text
    assert "Metrics Show diff only acc_delta" in text
    assert "acc_delta_metric word_perplexity change (%)" in text and "quantverdict.grid" in text
