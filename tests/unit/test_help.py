"""``python -m pipelines.run --help`` fits one screen: the command forms, every config group with its choices, the
keys people change and where the full reference is (conf/hydra/help/quantverdict.yaml). A real process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from quantverdict.config.compose import PROJECT_ROOT

# the config groups and their files, read off conf/ (one line each, choices in sorted order as Hydra lists them)
GROUPS = [
    "bench: cpu, cpu-capacity, cpu-concurrency, gpu, gpu-capacity, gpu-concurrency, gpu-concurrency-decode, "
    "gpu-concurrency-prefill, gpu-long-context",
    "env: auto, cpu, gpu",
    "eval: cpu, gpu, gpu-server",
    "kv: auto, fp8, fp8_calibrated",
    "model: hub, llama3.1-70b-shape, llama3.1-8b-shape, qwen3.5-4b-shape, qwen3.5-9b, qwen3.5-9b-shape, "
    "smollm2-135m, tiny-llama-shape, tiny-qwen3.5-shape",
    "review: cpu, default, gpu",
    "scheme: awq, bf16, fp8, fp8_block, gptq, int8, nvfp4, nvfp4a16, w4afp8, w8a8",
    "target: a100-40gb, a100-80gb, a10g, h100, h200, l4",
    "tracking: server, sqlite",
]


def help_text(*overrides: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.run", "--help", *overrides],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_help_fits_a_screen_and_lists_every_group() -> None:
    """One process (Hydra's start is seconds on 2 cores): env=gpu brings the GPU profiles of conf/env/gpu.yaml's
    device (eval=gpu, bench=gpu), and the help names what this command line chose."""
    text = help_text("env=gpu", "model=llama3.1-8b-shape", "scheme=awq")
    lines = text.rstrip("\n").splitlines()
    assert len(lines) <= 40, f"{len(lines)} lines"
    for group in GROUPS:
        assert group in lines
    assert "hydra/launcher: ray, submitit_slurm (where a grid's jobs run; default: here, one after another)" in lines
    assert "Chosen: model=llama3.1-8b-shape scheme=awq env=gpu eval=gpu bench=gpu kv=auto review=default" in lines
    # the command forms and where the reference is
    assert "  python -m pipelines.run [KEY=VALUE ...]                  one job: one model, one scheme" in lines
    assert any(line.startswith("  python -m pipelines.run -m scheme=bf16,awq,fp8") for line in lines)
    assert any(line.startswith("  python -m pipelines.review GRID_DIR") for line in lines)
    assert "docs/reference/config.md" in text
    # the cost keys, with the '+' pipelines.run needs for the mapping
    assert "'+review.gpu_price_per_hour={H100: 2.5}'  review.energy_usd_per_kwh=0.15  a cost line" in text
    # not Hydra's config dump: no key of the composed config is printed
    assert "baseline_note" not in text and "gpu_memory_utilization" not in text


def test_hydra_help_is_passed_to_hydra_as_typed() -> None:
    """Hydra's own --hydra-help composes a config without the app's groups: an env= override there is an error
    ("Could not override 'env'"), so env=auto is not expanded for it; an ordinary command line still is."""
    from quantverdict.config.compose import CONF_DIR
    from quantverdict.config.device_pick import expand

    assert expand(["--hydra-help"], CONF_DIR, gpus=lambda: []) == ["--hydra-help"]
    # the added overrides go before the flag, where Hydra's argument parser reads them as overrides
    out = expand(["--help"], CONF_DIR, gpus=lambda: [])
    assert (out[0], out[-1]) == ("env=cpu", "--help")


def test_review_help_names_the_cost_keys_the_outputs_and_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    from pipelines.review import main

    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "'review.gpu_price_per_hour={H100: 2.5}'" in text and "review.energy_usd_per_kwh=0.15" in text
    assert "writes review.md, review.html and review.json into --out" in text
    assert "exit codes: 0 done, 1 written but not logged to MLflow, 2 bad input" in text
