"""Bad input on the command line: the project's form (key, allowed values or form, closest match), exit code 2,
nothing run and no output folder made. Real ``python -m pipelines.run`` processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from quantverdict.config.compose import PROJECT_ROOT

# the shipped schemes (conf/scheme/*.yaml), in the order the error lists them
SCHEMES = "awq, bf16, fp8, fp8_block, gptq, int8, nvfp4, nvfp4a16, w4afp8, w8a8"
EVAL_KEYS = (
    "backend, batch_invariance_check, batch_size, dtype, enabled, headline, include_path, kld, limit, max_length, "
    "name, num_fewshot, seed, task_limits, tasks, token_perplexity, vllm_args"
)


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.run", *args, f"paths.output_root={tmp_path / 'out'}"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["scheme=awk"],
            f"scheme=awk: no such scheme; allowed: {SCHEMES} (did you mean 'awq'?)",
        ),
        (["eval.limt=5"], f"eval.limt: no such key in eval; keys: {EVAL_KEYS} (did you mean 'limit'?)"),
        (["eval.limit=abc"], "eval.limit=abc: must be an integer or null"),
        (["bench.rates=[1,fast]"], "bench.rates=[1,fast]: bench.rates[1] must be a number (e.g. 0.5, inf)"),
        (
            ["schem=awq"],
            "schem: no such key at the top level; keys: baseline_scheme, bench, data, env, eval, kv, model, "
            "paths, quantize, resume, review, scheme, seed, tracking (did you mean 'scheme'?)",
        ),
    ],
)
def test_bad_override_is_answered_in_the_project_form(tmp_path: Path, args: list[str], message: str) -> None:
    proc = run(tmp_path, *args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr
    assert "+eval.limt" not in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()  # nothing ran: not even Hydra's output folder


def test_multirun_checks_every_value_and_collects_all_errors(tmp_path: Path) -> None:
    proc = run(tmp_path, "-m", "scheme=bf16,awk,gtpq", "eval.enabled=maybe")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"scheme=awk: no such scheme; allowed: {SCHEMES} (did you mean 'awq'?)" in proc.stderr
    assert f"scheme=gtpq: no such scheme; allowed: {SCHEMES} (did you mean 'gptq'?)" in proc.stderr
    assert "eval.enabled=maybe: must be true or false" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_value_outside_an_enum_field_is_answered_before_hydra_runs(tmp_path: Path) -> None:
    # bench.mode and eval.backend are Enum fields: OmegaConf refuses the value while composing, and the message is
    # the one validate() gives for a refused choice (key, value, allowed values, closest match)
    proc = run(tmp_path, "bench.mode=rates", "eval.backend=servr")
    assert proc.returncode == 2
    assert "bench.mode='rates' is not allowed; allowed: rate, concurrency (did you mean 'rate'?)" in proc.stderr
    assert "eval.backend='servr' is not allowed; allowed: hf, vllm, server (did you mean 'server'?)" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_refused_value_is_exit_code_2_too(tmp_path: Path) -> None:
    # composed fine, refused by validate(): the same exit code, the project's message
    proc = run(tmp_path, "eval.limit=0")
    assert proc.returncode == 2
    assert "eval.limit=0 must be >= 1 or null" in proc.stdout + proc.stderr


def test_review_answers_in_the_same_form(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pipelines.review import main

    assert main([str(tmp_path), "review.confidence=high"]) == 2
    assert "review.confidence=high: must be a number (e.g. 0.5, inf)" in capsys.readouterr().err
    assert main([str(tmp_path), "review=strict"]) == 2
    assert "review=strict: no such review; allowed: cpu, default, gpu" in capsys.readouterr().err


def test_a_grid_whose_every_job_is_refused_is_exit_code_2(tmp_path: Path) -> None:
    proc = run(tmp_path, "-m", "scheme=bf16,awq", "eval.limit=0", "tracking.enabled=false")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "eval.limit=0 must be >= 1 or null" in proc.stderr
    assert not (tmp_path / "out").exists()  # refused before Hydra made the grid's folder
