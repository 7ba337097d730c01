"""MLflow naming and a real sqlite MLflow store."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantverdict.config import TrackingConfig
from quantverdict.tracking import Tracker, flatten, metric_name, numeric_metrics, sqlite_path


def test_metric_name_maps_lm_eval_keys() -> None:
    assert metric_name("accuracy.tasks.arc_easy.acc,none") == "accuracy.tasks.arc_easy.acc"
    assert metric_name("speed.rate_inf.ttft_ms_p99") == "speed.rate_inf.ttft_ms_p99"
    assert metric_name("a:b(c)") == "a_b_c_"


def test_flatten_and_numeric_metrics() -> None:
    data = {"a": {"b": 1, "c": [{"d": 2.5}], "s": "text", "flag": True, "nan": float("nan")}}
    assert flatten(data) == {"a.b": 1, "a.c.0.d": 2.5, "a.s": "text", "a.flag": True, "a.nan": data["a"]["nan"]}
    # strings, bools and non-finite numbers are not metrics
    assert numeric_metrics(data) == {"a.b": 1.0, "a.c.0.d": 2.5}


def test_metric_name_collision_is_an_error() -> None:
    with pytest.raises(ValueError, match="collision"):
        numeric_metrics({"acc,none": 0.5, "acc": 0.6})


def _record(status: str) -> dict:
    return {
        "config": {"model": {"name": "m"}, "scheme": {"name": "s", "recipe": {"x": 1}}},
        "memory": {"checkpoint": {"total_weight_bytes": 1000}},
        "accuracy": {"tasks": {"arc_easy": {"acc": 0.5, "acc_norm": 0.55}}},
        "speed": {"mode": "rate", "points": [{"offered_rate_rps": 1.0, "output_tok_s": 10.0},
                                             {"offered_rate_rps": None, "output_tok_s": 30.0}]},
        "status": status,
        "error": None if status == "ok" else "RuntimeError: boom",
    }


def test_real_store_finished_and_failed_runs(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = TrackingConfig(name="t", uri=uri, experiment="exp", artifact_location=str(tmp_path / "artifacts"))
    artifact = tmp_path / "record.json"
    artifact.write_text("{}")
    for status in ("ok", "failed"):
        tr = Tracker(cfg)
        tr.start(f"m/{status}", {"scheme": status})
        tr.stage("quantize", "ok", 1.5, {"memory": {"x": 2}})
        tr.finish(_record(status), tmp_path, [artifact])
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("exp")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    assert runs["m/ok"].info.status == "FINISHED"
    assert runs["m/failed"].info.status == "FAILED"
    assert runs["m/failed"].data.tags["quantverdict.error"] == "RuntimeError: boom"
    ok = runs["m/ok"].data
    assert ok.metrics["memory.checkpoint.total_weight_bytes"] == 1000
    assert ok.metrics["accuracy.tasks.arc_easy.acc_norm"] == 0.55
    assert ok.metrics["speed.rate_1.output_tok_s"] == 10.0
    assert ok.metrics["speed.rate_inf.output_tok_s"] == 30.0
    assert ok.params["model.name"] == "m" and "scheme.recipe.x" not in ok.params
    # nested stage runs point at their parent
    children = [r for r in runs.values() if r.data.tags.get("mlflow.parentRunId") == runs["m/ok"].info.run_id]
    assert [c.info.run_name for c in children] == ["quantize"]
    assert children[0].data.metrics["wall_s"] == 1.5
    # nothing left running
    assert all(r.info.status != "RUNNING" for r in runs.values())
    assert [a.path for a in client.list_artifacts(runs["m/ok"].info.run_id)] == ["record.json"]


def test_sqlite_path_of_tracking_uris() -> None:
    assert sqlite_path("sqlite:////abs/my runs/mlflow.db") == Path("/abs/my runs/mlflow.db")
    assert sqlite_path("sqlite:///rel.db?timeout=20") == Path("rel.db")
    assert sqlite_path("sqlite:///:memory:") is None
    assert sqlite_path("http://127.0.0.1:5000") is None
    assert sqlite_path("postgresql://u@h/db") is None
