"""Shared fixtures. Integration fixtures build the real stage environments and the embedded model once."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from quantverdict.config.compose import PROJECT_ROOT, compose
from quantverdict.config.schema import Config
from quantverdict.processes import envs
from quantverdict.processes.envs import StageEnv

DATA_ROOT = Path(os.environ.get("QV_DATA_ROOT", PROJECT_ROOT.parent / "shared" / "data"))
# data.offline_root defaults to null (lm-eval's hub tasks); this machine's tests read the offline copies, so they
# name the folder explicitly, for the configs they compose and the pipelines they start (the Makefile's test
# targets set QV_DATA_ROOT too). Tests that need the folder skip where it is missing.
if "QV_DATA_ROOT" not in os.environ and DATA_ROOT.is_dir():
    os.environ["QV_DATA_ROOT"] = str(DATA_ROOT)


@pytest.fixture
def marker() -> str:
    """A marker of this test alone, for the environment of the processes it starts (``clihelp.marked_pids``)."""
    return uuid.uuid4().hex


@pytest.fixture(scope="session")
def default_cfg() -> Config:
    return compose([])


@pytest.fixture(scope="session")
def stage_envs(default_cfg: Config) -> dict[str, StageEnv]:
    """The real quantize and serve environments (created on first use, then reused)."""
    return {
        stage: envs.ensure(stage, getattr(default_cfg.env, stage), default_cfg.env, PROJECT_ROOT)
        for stage in ("quantize", "serve")
    }


@pytest.fixture(scope="session")
def embedded_model(
    default_cfg: Config, stage_envs: dict[str, StageEnv], tmp_path_factory: pytest.TempPathFactory
) -> dict:
    """The embedded SmolLM2-135M materialized as bf16 safetensors in the shared cache (result dict of
    the materialize stage: path, dims, num_parameters, ...)."""
    from quantverdict.orchestrate.caches import materialize
    from quantverdict.results.record import StageInfo

    out = tmp_path_factory.mktemp("materialize")
    return materialize(default_cfg.model, stage_envs["quantize"], Path(default_cfg.paths.cache_root), out, StageInfo())


@pytest.fixture(scope="module")
def served_dtype(serve_env: StageEnv, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The ``--dtype`` a job serves the embedded bf16 model with on this CPU, decided as the pipeline decides:
    the serve environment's probe (:mod:`quantverdict.children.cpu_probe`) and
    :func:`quantverdict.config.cpu_caps.compute_dtype`: bfloat16 where the CPU has native bf16, float32 where
    bf16 is emulated. For tests that start a server themselves (``bench.server.dtype`` would otherwise be vLLM's
    default, the checkpoint's bfloat16: measured on a CPU without native bf16, one 256-token request with 16
    output tokens took 12.5 s). Needs a module-scoped ``serve_env`` fixture in the test module."""
    from quantverdict.config import cpu_caps
    from quantverdict.processes.runner import run_stage
    from quantverdict.results.stage_results import CpuProbeResult

    probe = run_stage(
        serve_env, "cpu_probe", {"vllm": True}, tmp_path_factory.mktemp("cpu_probe"), CpuProbeResult
    ).model_dump()
    return cpu_caps.compute_dtype(cpu_caps.CpuCapabilities.from_probe(probe)).dtype


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tier of a test is the folder it sits in: tests/unit -> unit, tests/integration -> integration
    (whether or not its file says so); browser and slow are marked where they apply."""
    tiers = {
        Path(__file__).parent / "unit": pytest.mark.unit,
        Path(__file__).parent / "integration": pytest.mark.integration,
    }
    for item in items:
        for folder, mark in tiers.items():
            if folder in item.path.parents:
                item.add_marker(mark)
