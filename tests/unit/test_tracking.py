"""MLflow naming and tracking URIs (the real store: tests/integration/test_mlflow_store.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantverdict.results.tracking import (
    EXPERIMENT_KIND_TAG,
    MODEL_TRAINING_KIND,
    flatten,
    metric_name,
    numeric_metrics,
    runs_page,
    sqlite_path,
)


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


def test_sqlite_path_of_tracking_uris() -> None:
    assert sqlite_path("sqlite:////abs/my runs/mlflow.db") == Path("/abs/my runs/mlflow.db")
    assert sqlite_path("sqlite:///rel.db?timeout=20") == Path("rel.db")
    assert sqlite_path("sqlite:///:memory:") is None
    assert sqlite_path("http://127.0.0.1:5000") is None
    assert sqlite_path("postgresql://u@h/db") is None


def test_runs_page_opens_the_model_training_layout() -> None:
    # MLflow 3.17.2's UI takes the page from its GenAI / Model training switch (the workflowType parameter); the
    # shared view names the table's columns
    view = "&viewStateShareKey=quantverdict-runs"
    assert runs_page("7") == "http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning" + view
    assert runs_page("7", "http://h:8080/") == "http://h:8080/#/experiments/7/runs?workflowType=machine_learning" + view
    assert (EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND) == ("mlflow.experimentKind", "custom_model_development")
