"""Hub and local transformers folders through the real materialize child (quantize environment), and one job
of a hub model end to end on the command line.

The model is tiny-llama-shape as the synthetic source builds it (a LlamaForCausalLM with random weights and
SmolLM2's tokenizer), copied out as a plain transformers folder. The hub path runs offline: the folder is put
into a hub cache in huggingface_hub's layout (tests/hub_cache.py) and ``HF_HUB_OFFLINE=1``; preflight and the
child use the real huggingface_hub (``snapshot_download(local_files_only=True)``), no request is made.

Parameters of tiny-llama-shape by hand (hidden 256, intermediate 512, 2 layers, 4 query heads and 2 KV heads
of 64, vocabulary 49,152, untied): per layer q 256x256 + k, v 2 x 256x128 + o 256x256 + MLP 3 x 256x512 =
589,824, plus two RMSNorm weights of 256 = 590,336; x 2 = 1,180,672; embeddings and lm_head 2 x 49,152 x 256 =
25,165,824; final norm 256; total 26,346,752.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from clihelp import run_cli
from hub_cache import fill_hub_cache
from quantverdict.children.materialize import MODEL_INFO
from quantverdict.config.compose import compose
from quantverdict.orchestrate import preflight
from quantverdict.orchestrate.caches import materialize
from quantverdict.processes.envs import StageEnv
from quantverdict.results.record import StageInfo, find_records, load

pytestmark = pytest.mark.integration

HF_ID = "qv-test/tiny-llama"
COMMIT = "1111111111222222222233333333334444444444"
NEWER = "5555555555666666666677777777778888888888"
TINY_PARAMETERS = 26_346_752


@pytest.fixture(scope="module")
def tiny_folder(
    stage_envs: dict[str, StageEnv], embedded_model: dict, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """tiny-llama-shape materialized by the synthetic source (in the shared cache), copied out as a plain
    transformers folder (config.json, model.safetensors, tokenizer files)."""
    cfg = compose(["model=tiny-llama-shape"])
    out = tmp_path_factory.mktemp("tiny")
    built = materialize(
        cfg.model,
        stage_envs["quantize"],
        Path(cfg.paths.cache_root),
        out,
        StageInfo(),
        {"tokenizer_path": embedded_model["path"]},
    )
    folder = out / "tiny-llama"
    shutil.copytree(built["path"], folder, ignore=shutil.ignore_patterns(MODEL_INFO))
    return folder


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for var in ("HF_HOME", "HF_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)


def test_hub_model_materializes_offline_from_a_prefilled_cache(
    offline: None, tiny_folder: Path, stage_envs: dict[str, StageEnv], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    snapshot = fill_hub_cache(cache / "hf", HF_ID, tiny_folder, COMMIT)
    cfg = compose(["model=hub", f"model.hf_id={HF_ID}", f"paths.cache_root={cache}"])
    found = preflight.check(cfg)
    assert found.hub is not None and found.hub.commit == COMMIT and found.params == TINY_PARAMETERS
    st = StageInfo()
    model = materialize(cfg.model, stage_envs["quantize"], cache, tmp_path / "out", st, hub=found.hub)
    assert (model["hf_id"], model["revision"], model["commit"]) == (HF_ID, "main", COMMIT)
    assert Path(model["path"]) == snapshot  # read in place: no second copy of the weights
    assert model["architecture"] == "LlamaForCausalLM" and model["source"] == "hf"
    assert model["dims"]["hidden_size"] == 256 and model["dims"]["num_hidden_layers"] == 2
    assert model["num_parameters"] == TINY_PARAMETERS and model["dtype"] == "bfloat16"
    entry = json.loads((cache / "models" / "tiny-llama" / MODEL_INFO).read_text())
    assert entry["model"]["commit"] == COMMIT and entry["commit"] == COMMIT

    again = StageInfo()
    assert (
        materialize(cfg.model, stage_envs["quantize"], cache, tmp_path / "out", again, hub=found.hub)["commit"]
        == COMMIT
    )
    assert again.status == "cached"

    # main moves to another commit: resolved anew, and the entry of the old commit is not reused
    newer = fill_hub_cache(cache / "hf", HF_ID, tiny_folder, NEWER)
    moved = preflight.check(cfg).hub
    assert moved is not None and moved.commit == NEWER
    st3 = StageInfo()
    model3 = materialize(cfg.model, stage_envs["quantize"], cache, tmp_path / "out", st3, hub=moved)
    assert st3.status != "cached" and model3["commit"] == NEWER and Path(model3["path"]) == newer


def test_local_folder_materializes_in_place(tiny_folder: Path, stage_envs: dict[str, StageEnv], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cfg = compose(
        [
            "model=qwen3.5-9b",
            "model.name=tiny-local",
            "model.source=local",
            f"model.path={tiny_folder}",
            f"paths.cache_root={cache}",
        ]
    )
    found = preflight.check(cfg)
    assert found.hub is None
    model = materialize(cfg.model, stage_envs["quantize"], cache, tmp_path / "out", StageInfo())
    assert model["path"] == str(tiny_folder) and model["source"] == "local"
    assert model["num_parameters"] == TINY_PARAMETERS and model["architecture"] == "LlamaForCausalLM"
    assert "commit" not in model


def test_hub_model_job_end_to_end_offline(
    offline: None, tiny_folder: Path, stage_envs: dict[str, StageEnv], tmp_path: Path
) -> None:
    """`python -m pipelines.run` on the cached hub model, quantized data-free (int8: round-to-nearest W8A16),
    evaluation and speed sweep off."""
    cache = tmp_path / "cache"
    snapshot = fill_hub_cache(cache / "hf", HF_ID, tiny_folder, COMMIT)
    proc = run_cli(
        tmp_path / "out",
        "model=hub",
        f"model.hf_id={HF_ID}",
        "scheme=int8",
        f"paths.cache_root={cache}",
        "eval.enabled=false",
        "bench.enabled=false",
        timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    (path,) = find_records(tmp_path / "out" / "runs")
    rec = load(path)
    assert rec["status"] == "ok"
    assert (rec["model"]["hf_id"], rec["model"]["revision"], rec["model"]["commit"]) == (HF_ID, "main", COMMIT)
    assert rec["model"]["path"] == str(snapshot)
    assert rec["config"]["model"]["revision"] == "main" and rec["config"]["model"]["hf_id"] == HF_ID
    assert COMMIT in rec["stages"]["preflight"]["detail"]
    assert rec["checkpoint"]["quantized"] and Path(rec["checkpoint"]["path"]).is_relative_to(cache / "checkpoints")
    # W8A16 of 2 layers x 7 Linear modules (q, k, v, o, gate, up, down); lm_head and embeddings stay 16-bit
    assert rec["memory"]["checkpoint"]["quantized_modules"] == 14
