"""Shared fixtures and the tiers. Integration fixtures build the real stage environments and the embedded model once.

Tiers by folder: tests/unit -> ``unit`` (self-contained: the synthetic offline data of tests/fixtures, no real data
folder, no committed results, no browser, no stage environment, no MLflow store), tests/integration ->
``integration`` (real llm-compressor, lm-eval, vLLM, MLflow, Chromium and the offline data), tests/results ->
``results`` (the committed results regenerate). A test marked ``browser`` starts Chromium: it is integration
wherever it sits.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from quantverdict.config.compose import PROJECT_ROOT, as_dict, compose
from quantverdict.config.schema import Config, SchemeConfig
from quantverdict.config.schemes import calibrates
from quantverdict.processes import envs
from quantverdict.processes.envs import StageEnv
from quantverdict.processes.runner import run_stage
from quantverdict.results.stage_results import QuantizeResult

DATA_ROOT = Path(os.environ.get("QV_DATA_ROOT", PROJECT_ROOT.parent / "shared" / "data"))
# data.offline_root defaults to null (lm-eval's hub tasks); the integration tier reads the real offline copies, so it
# names the folder explicitly, for the configs it composes and the pipelines it starts (the Makefile's integration
# target sets QV_DATA_ROOT too). Tests that need the folder skip where it is missing. A unit test runs with
# QV_DATA_ROOT at the synthetic copy instead (pytest_runtest_protocol below).
# a pytest-xdist worker (the first phase of make test-integration, INTEGRATION_WORKERS=N) binds the vLLM CPU servers
# it starts to a core of its own (gw0 -> the first allowed core, gw1 -> the second, ...): vLLM's auto binding gives
# every server on a host the same core, so two workers' servers would share one while the other idles. The serve
# environment takes the variable from the orchestrator's environment (conf/env/cpu.yaml).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw") and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
    _CORES = sorted(os.sched_getaffinity(0))
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(_CORES[int(_WORKER[2:]) % len(_CORES)])
# the vLLM CPU servers and engines the tier starts run their worker in the engine core's process
# (conf/env/cpu.yaml: VLLM_ENABLE_V1_MULTIPROCESSING=0): one Python process fewer to import vLLM into at each start.
# The tests of the server's process tree (cleanup after faults, the host sampler's roles) ask for vLLM's own layout
# (a worker process) with the ``worker_process`` fixture.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
if "QV_DATA_ROOT" not in os.environ and DATA_ROOT.is_dir():
    os.environ["QV_DATA_ROOT"] = str(DATA_ROOT)

UNIT_DIR = Path(__file__).parent / "unit"
# the unit tier's offline data: a few made-up items a file, in the real folder's layout and formats
SYNTHETIC_DATA = Path(__file__).parent / "fixtures" / "offline_data"
# what a unit test must never read: the real offline data (wherever QV_DATA_ROOT points, and ../shared beside the
# checkout) and the committed results (another tier checks those; they change when a study is redone)
OUTSIDE_UNIT = tuple(
    os.path.realpath(p)
    for p in {DATA_ROOT, PROJECT_ROOT.parent / "shared", PROJECT_ROOT / "docs" / "results"}
    if os.path.realpath(p) != os.path.realpath(SYNTHETIC_DATA)
)


# the real stage environments' root while the pool below stands in for it (QV_ENV_ROOT), else None
REAL_ENV_ROOT: list[str] = []


@pytest.fixture(scope="session", autouse=True)
def prefork_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """With ``QV_TEST_PREFORK=1`` (``make test-integration``): the stage children of every command a test starts are
    forked from interpreters that imported vLLM, lm-eval and llm-compressor once (tests/prefork: shim environments
    under ``QV_ENV_ROOT``, one zygote per environment), instead of importing them afresh each (10-20 s of CPU
    apiece on 2 cores). What the children run and record is unchanged; the processes a test sees are the
    launchers standing for them (``worker_process`` opts a test out)."""
    if os.environ.get("QV_TEST_PREFORK") != "1":
        yield
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from prefork import pool as prefork

    cfg = compose([])
    real = {s: envs.ensure(s, getattr(cfg.env, s), cfg.env, PROJECT_ROOT) for s in ("quantize", "serve")}
    base = tmp_path_factory.mktemp("prefork")
    started = prefork.start(real, base / "envs", base / "logs")
    REAL_ENV_ROOT.append(os.environ.get("QV_ENV_ROOT", ""))
    os.environ["QV_ENV_ROOT"] = str(started.root)
    try:
        yield
    finally:
        started.close()
        previous = REAL_ENV_ROOT.pop()
        if previous:
            os.environ["QV_ENV_ROOT"] = previous
        else:
            os.environ.pop("QV_ENV_ROOT", None)


@pytest.fixture
def worker_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's CPU worker in a process of its own (VLLM_ENABLE_V1_MULTIPROCESSING=1) for the jobs this test starts,
    each stage child started afresh by its real interpreter (not forked from the tier's pool: the test reads the
    processes themselves)."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    if REAL_ENV_ROOT:
        if REAL_ENV_ROOT[0]:
            monkeypatch.setenv("QV_ENV_ROOT", REAL_ENV_ROOT[0])
        else:
            monkeypatch.delenv("QV_ENV_ROOT", raising=False)


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


def load_scheme(name: str) -> SchemeConfig:
    """``conf/scheme/<name>.yaml`` as its typed config (``${scheme.ignore}`` resolved)."""
    path = PROJECT_ROOT / "conf" / "scheme" / f"{name}.yaml"
    node = OmegaConf.merge(OmegaConf.structured(SchemeConfig), OmegaConf.load(path))
    scheme = OmegaConf.to_object(OmegaConf.create({"scheme": node}).scheme)
    assert isinstance(scheme, SchemeConfig)
    return scheme


AWQ_CALIBRATION = ["scheme.calibration.num_samples=8", "scheme.calibration.seq_len=128"]


@pytest.fixture(scope="session")
def quantized(
    tmp_path_factory: pytest.TempPathFactory,
    stage_envs: dict[str, StageEnv],
    embedded_model: dict[str, Any],
) -> dict[str, Any]:
    """The embedded model quantized by the real quantize stage, each scheme once per test run and only when first
    asked for: ``quantized[name]`` -> (checkpoint, scheme config, model path).

    A scheme that quantizes is quantized as a job of the tier quantizes it (the calibration of
    ``clihelp.CALIBRATION``; AWQ, which no job of the tier finishes, half its tokens: AWQ's grid search costs in
    proportion to them): the job's recipe and method (:func:`quantverdict.orchestrate.job.quantize_plan`)
    through the job's checkpoint cache (:func:`quantverdict.orchestrate.caches.quantize`: its key, entry and lock
    under ``paths.cache_root``), so a checkpoint made here is the one such a job reuses and the other way round. The
    checkpoint is what a job records of it: the quantize stage's result stored with the entry plus ``path``,
    ``key``, ``cached`` and ``sanity``. bf16 (``method: none``) runs the stage itself: the stage then measures the
    source model, which no job asks of it. A scheme that calibrates skips without the offline data."""
    from clihelp import CALIBRATION
    from quantverdict.orchestrate import caches, resume
    from quantverdict.orchestrate.job import quantize_plan
    from quantverdict.results.record import StageInfo

    model = Path(embedded_model["path"])
    root = tmp_path_factory.mktemp("quantize")
    env = stage_envs["quantize"]

    class Lazy(dict):  # type: ignore[type-arg]
        def __missing__(self, name: str) -> Any:
            calibration = AWQ_CALIBRATION if name == "awq" else CALIBRATION
            cfg = compose([f"scheme={name}", *calibration])
            cal, work = cfg.scheme.calibration, root / "work" / name
            if calibrates(cfg) and cal.text_file and cfg.data.offline_root is None:
                pytest.skip(f"data.offline_root is null: no offline calibration text for {name}")
            if cfg.scheme.method == "none":
                spec = {
                    "model_path": str(model),
                    "out_dir": str(root / "ckpt" / name),
                    "recipe": {},
                    "method": "none",
                    "calibration": {"text_path": None, **as_dict(cal)},
                    "seed": cfg.seed,
                }
                made = run_stage(env, "quantize", spec, work, QuantizeResult, timeout_s=900).model_dump()
            else:
                recipe, method, _ = quantize_plan(cfg, embedded_model["dims"])
                versions = caches.checkpoint_versions(resume.installed(env))
                cache = Path(cfg.paths.cache_root)
                made = caches.quantize(cfg, env, embedded_model, recipe, method, versions, cache, work, StageInfo())
            self[name] = (made, cfg.scheme, model)
            return self[name]

    return Lazy()


@pytest.fixture(scope="module")
def serve_env(request: pytest.FixtureRequest) -> StageEnv:
    """The serve environment for tests that start a vLLM server themselves: the real one (``stage_envs``), or the
    interpreter ``QV_SERVE_PYTHON`` names (then no stage environment is built)."""
    python = os.environ.get("QV_SERVE_PYTHON")
    if python:
        extra = {"PYTHONPATH": str(envs.SRC_DIR), "VLLM_CPU_OMP_THREADS_BIND": "auto", "HF_HUB_OFFLINE": "1"}
        return StageEnv("serve", python, {**extra, "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    return request.getfixturevalue("stage_envs")["serve"]


@pytest.fixture(scope="module")
def model_path(request: pytest.FixtureRequest) -> str:
    """The embedded model's bf16 checkpoint folder (``embedded_model``), or the one ``QV_EMBEDDED_MODEL`` names
    (then nothing is materialized)."""
    path = os.environ.get("QV_EMBEDDED_MODEL")
    if path:
        return path
    return str(request.getfixturevalue("embedded_model")["path"])


@pytest.fixture(scope="module")
def served_dtype(serve_env: StageEnv, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The ``--dtype`` a job serves the embedded bf16 model with on this CPU, decided as the pipeline decides:
    the serve environment's probe (:mod:`quantverdict.children.cpu_probe`) and
    :func:`quantverdict.config.cpu_caps.compute_dtype`: bfloat16 where the CPU has native bf16, float32 where
    bf16 is emulated. For tests that start a server themselves (``bench.server.dtype`` would otherwise be vLLM's
    default, the checkpoint's bfloat16: measured on a CPU without native bf16, one 256-token request with 16
    output tokens took 12.5 s)."""
    from quantverdict.config import cpu_caps
    from quantverdict.processes.runner import run_stage
    from quantverdict.results.stage_results import CpuProbeResult

    probe = run_stage(
        serve_env, "cpu_probe", {"vllm": True}, tmp_path_factory.mktemp("cpu_probe"), CpuProbeResult
    ).model_dump()
    return cpu_caps.compute_dtype(cpu_caps.CpuCapabilities.from_probe(probe)).dtype


@pytest.fixture(scope="session")
def served_grid(tmp_path_factory: pytest.TempPathFactory, stage_envs: dict, embedded_model: dict) -> Any:
    """The grid of ``clihelp.SERVED_GRID`` (bf16 and W8A8 on the embedded model, two server starts each, evaluated
    through the served engine), run once for the tests that read it: a :class:`clihelp.ServedGrid`. Its readers sit in
    one file (tests/integration/test_served_grid.py), which one pytest-xdist worker runs whole (``--dist loadfile``)."""
    from clihelp import SERVED_GRID, ServedGrid, new_marker, run_cli

    out = tmp_path_factory.mktemp("served_grid")
    marker = new_marker()
    t0 = time.monotonic()
    proc = run_cli(out, *SERVED_GRID, multirun=True, timeout=1800, marker=marker)
    return ServedGrid(out, proc, marker, time.monotonic() - t0)


class _UnitGuard:
    """Fails a unit test (or the import of a unit test module) that opens or lists a path of :data:`OUTSIDE_UNIT`.

    A Python audit hook (:func:`sys.addaudithook`) sees every ``open``, ``os.listdir`` and ``os.scandir`` of this
    process; while ``active``, one under a forbidden folder raises :class:`PermissionError` at the call and is
    remembered, so that a test which swallows the error still fails. Child processes are not watched: the unit tier
    gives them the synthetic data through QV_DATA_ROOT.
    """

    EVENTS = frozenset({"open", "os.listdir", "os.scandir"})

    def __init__(self) -> None:
        self.active = False
        self.seen: list[str] = []
        sys.addaudithook(self.audit)

    def audit(self, event: str, args: tuple) -> None:
        if not self.active or event not in self.EVENTS or not args:
            return
        target = args[0]
        if target is None or isinstance(target, int):
            return
        try:
            path = os.path.realpath(os.fsdecode(target))
        except (TypeError, ValueError):
            return
        for root in OUTSIDE_UNIT:
            if path == root or path.startswith(root + os.sep):
                self.seen.append(f"{event} {path}")
                raise PermissionError(f"a unit test read {path} (under {root}): use a fixture under tests/fixtures")


UNIT_GUARD = _UnitGuard()


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> object:
    """Importing a unit test module is watched too (a parametrization that globs a folder runs then)."""
    watched = isinstance(collector, pytest.Module) and UNIT_DIR in collector.path.parents
    UNIT_GUARD.active, UNIT_GUARD.seen = watched, []
    try:
        outcome = yield
    finally:
        UNIT_GUARD.active = False
    report = outcome.get_result()
    if watched and UNIT_GUARD.seen and report.passed:
        report.outcome, report.longrepr = (
            "failed",
            "a unit test module read outside its tier: " + "; ".join(UNIT_GUARD.seen),
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A unit test (its fixtures included) runs with QV_DATA_ROOT at the synthetic offline data and watched by
    :data:`UNIT_GUARD`."""
    unit = item.get_closest_marker("unit") is not None
    saved = os.environ.get("QV_DATA_ROOT")
    if unit:
        os.environ["QV_DATA_ROOT"] = str(SYNTHETIC_DATA)
    UNIT_GUARD.active, UNIT_GUARD.seen = unit, []
    try:
        yield
    finally:
        UNIT_GUARD.active = False
        if saved is None:
            os.environ.pop("QV_DATA_ROOT", None)
        else:
            os.environ["QV_DATA_ROOT"] = saved


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A unit test that read outside its tier fails, even where it caught the guard's error."""
    outcome = yield
    report = outcome.get_result()
    if UNIT_GUARD.seen and not report.failed:
        report.outcome = "failed"
        report.longrepr = "a unit test read outside its tier: " + "; ".join(UNIT_GUARD.seen)
    UNIT_GUARD.seen = []  # reported once, in the phase that read


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tier of a test is the folder it sits in: tests/unit -> unit, tests/integration -> integration,
    tests/results -> results (whether or not its file says so); a test marked browser (Chromium) is integration
    wherever it sits; slow is marked where it applies. In one process, tests not marked slow run first (a broken
    environment, command line or store shows within minutes under ``pytest -x``); in a pytest-xdist worker the slow
    ones come first, so that ``--dist loadfile --no-loadscope-reorder`` hands out the long files first and the short
    ones fill the workers' ends (the longest file last would keep one worker busy alone). Each group keeps its
    collection order."""
    here = Path(__file__).parent
    tiers = {
        here / "unit": pytest.mark.unit,
        here / "integration": pytest.mark.integration,
        here / "results": pytest.mark.results,
    }
    for item in items:
        if item.get_closest_marker("browser") is not None:
            item.add_marker(pytest.mark.integration)
            continue
        for folder, mark in tiers.items():
            if folder in item.path.parents:
                item.add_marker(mark)
    slow_first = hasattr(config, "workerinput")  # set in a pytest-xdist worker
    items.sort(key=lambda item: (item.get_closest_marker("slow") is not None) != slow_first)  # stable
