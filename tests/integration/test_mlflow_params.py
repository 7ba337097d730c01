"""Long config values in a real sqlite MLflow store (under tmp_path): a value longer than MLflow's 6,000-character
param limit is cut with a marker that names the whole value (its sha256 and length), a value that fits is logged
whole, and the whole resolved config and the recipe are artifacts of the job run. Needs only the orchestrator
environment."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from quantverdict.config.schema import TrackingConfig
from quantverdict.results.tracking import Tracker

pytestmark = pytest.mark.integration

# 300 module names of 41 characters as a keep-16-bit list: str() of the list is 300 x 43 (quoted) + 299 x 2
# (separators) + 2 (brackets) = 13,500 characters
IGNORE = [f"model.layers.{i:03d}.mlp.experts.gate_up_proj" for i in range(300)]
NOTE = "x" * 6999  # a plain value of 6,999 characters
FITS = "y" * 6000  # exactly MLflow's limit: logged whole


def test_long_values_are_cut_with_a_marker_and_the_whole_config_is_an_artifact(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = TrackingConfig(name="t", uri=uri, experiment="exp", artifact_location=str(tmp_path / "artifacts"))
    recipe = {"quant_stage": {"quant_modifiers": {"GPTQModifier": {"ignore": IGNORE, "targets": ["Linear"]}}}}
    config = {
        "model": {"name": "m", "baseline_note": NOTE},
        "scheme": {"name": "gptq", "ignore": IGNORE, "recipe": recipe, "label": FITS},
    }
    (tmp_path / "recipe.json").write_text(json.dumps(recipe, indent=2))
    tr = Tracker(cfg)
    tr.start("m/gptq", {"scheme": "gptq"})
    tr.finish(
        {"config": config, "memory": {}, "accuracy": {}, "speed": {}, "status": "ok", "error": None},
        tmp_path,
        [tmp_path / "recipe.json"],
    )

    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
    params = run.data.params
    for key, whole in (("scheme.ignore", str(IGNORE)), ("model.baseline_note", NOTE)):
        assert len(whole) > 6000
        marker = f"…[cut; sha256:{hashlib.sha256(whole.encode()).hexdigest()}; {len(whole)} chars]"
        got = params[key]
        assert len(got) == 6000 and got.endswith(marker), got[-120:]
        assert whole.startswith(got[: -len(marker)])  # the start of the value, unchanged
    assert len(str(IGNORE)) == 13_500
    assert params["scheme.label"] == FITS  # 6,000 characters fit: no marker
    assert not any(k.startswith("scheme.recipe") for k in params)  # the recipe is an artifact, not params

    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"config.yaml", "recipe.json"}
    got_config = yaml.safe_load(
        Path(client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path / "d"))).read_text()
    )
    assert got_config == config  # whole: every ignore entry, the recipe, the 6,999-character value
    got_recipe = json.loads(
        Path(client.download_artifacts(run.info.run_id, "recipe.json", str(tmp_path / "e"))).read_text()
    )
    assert got_recipe == recipe
