"""A job's vLLM server from start to stop: built from the config, started, swept, stopped, and the record's
``speed`` and ``memory.server`` sections filled in along the way.

:func:`serving` is the ``with`` block around everything that talks to the server (the sweep, and with
``eval.backend=server`` the evaluation too); :func:`sweep` runs the speed sweep inside it. :func:`benchmark`
is both for a server started only for the sweep: the sweep's client process is started with the server, so
that its imports overlap the server's start-up. On cuda the HBM copy bandwidth is measured first (the
roofline's), before the server takes the GPU.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from quantverdict.config.cpu_caps import DtypeChoice
from quantverdict.config.schema import ComputeDtype, Config
from quantverdict.measure import sweep as sweep_math
from quantverdict.measure import vllm_log
from quantverdict.processes import procs
from quantverdict.processes.envs import StageEnv
from quantverdict.processes.runner import run_stage
from quantverdict.results.record import CapacitySearch, Record, ServerMemory, Speed, SweepPoint
from quantverdict.results.stage_results import HbmResult, SweepClientTimes
from quantverdict.serving import capacity as capacity_search
from quantverdict.serving import gpu_sampling, host_sampling, workload
from quantverdict.serving.benchmark import SweepClient, finished_points, run_sweep, start_client
from quantverdict.serving.server import VLLMServer
from quantverdict.serving.speed import add_roofline, speed_validity


def compile_cache_dir(cfg: Config) -> Path:
    """vLLM's cache root for the job's server (``VLLM_CACHE_ROOT``): ``<paths.cache_root>/vllm``, shared by every
    job of a grid, so a scheme compiled once is loaded from ``torch_compile_cache/`` by the next server."""
    return Path(cfg.paths.cache_root) / "vllm"


def new_server(
    cfg: Config, rec: Record, out: Path, serve_dtype: DtypeChoice | None, env: StageEnv, model_path: str
) -> VLLMServer:
    """The job's :class:`VLLMServer`, not started; on cuda the HBM copy bandwidth is measured first (the
    roofline's, before the server takes the GPU). Resets ``rec.speed`` to its start.

    Args:
        cfg: the job's config (``bench.server``, ``model.serve_args``, ``env.device``).
        rec: the job's record; ``speed`` is set to ``mode``, ``served_model``, ``server`` (the port to be tried
            first, :meth:`VLLMServer.endpoint`), ``workload`` (:func:`quantverdict.serving.workload.prepare`),
            ``points`` (empty), ``hbm_copy`` (cuda) and ``dtype`` (when
            ``serve_dtype`` is given).
        out: the job's output folder (``vllm_server.log``, the hbm stage's files).
        serve_dtype: the resolved ``--dtype`` and why (on CPU chosen from the CPU, see ``cpu_caps``), or None.
        env: the serve environment.
        model_path: the checkpoint folder to serve.
    """
    served_name = f"{cfg.model.name}-{cfg.scheme.name}"
    server_cfg = cfg.bench.server
    if serve_dtype is not None:  # the resolved --dtype (on CPU chosen from the CPU; see cpu_caps)
        server_cfg = dataclasses.replace(server_cfg, dtype=ComputeDtype(serve_dtype.dtype))
    if cfg.model.serve_args:
        server_cfg = dataclasses.replace(server_cfg, extra_args=[*server_cfg.extra_args, *cfg.model.serve_args])
    hbm = None
    if cfg.env.device == "cuda":  # the roofline's bandwidth, measured before the server takes the GPU
        hbm = run_stage(env, "hbm", {"gib": 4, "iters": 20}, out, HbmResult).model_dump(exclude={"status"})
    server = VLLMServer(
        env=env,
        model_path=model_path,
        served_name=served_name,
        server_cfg=server_cfg,
        max_model_len=cfg.bench.server.max_model_len or cfg.model.max_model_len,
        device=cfg.env.device,
        log_path=out / "vllm_server.log",
        compile_cache_dir=compile_cache_dir(cfg),
    )
    rec.speed = Speed(
        mode=str(cfg.bench.mode),  # the config string, not its Enum member
        served_model=served_name,
        server=server.endpoint(),
        # the traffic, its prompts file written before the server starts (the text workload's, in the bench folder)
        workload=workload.prepare(cfg, out / "bench", env) if cfg.bench.enabled else None,
        points=[],
    )
    if hbm:
        rec.speed.hbm_copy = hbm
    if serve_dtype is not None:
        rec.speed.dtype = {"value": str(server_cfg.dtype), "chosen_by": serve_dtype.chosen_by, "why": serve_dtype.why}
    return server


@contextmanager
def serving(
    cfg: Config,
    rec: Record,
    out: Path,
    serve_dtype: DtypeChoice | None,
    env: StageEnv,
    model_path: str,
    save: Callable[[], None],
    before_start: Callable[[VLLMServer], None] | None = None,
) -> Iterator[VLLMServer]:
    """A started server (``speed.server_start_s``, ``speed.server`` with the port it listens on, ``memory.server``
    from its log) for the ``with`` block.

    Arguments as :func:`new_server`, plus ``save``, which writes the record (called once the server is up), and
    ``before_start``, called with the built server just before it starts (see :func:`benchmark`).
    On exit, normal or not, the server is stopped, then ``speed`` is completed: points kept from
    ``bench/sweep.jsonl`` after a crash mid-sweep, the server log parsed again (compile, graph-capture and
    warm-up time included), the validity summary (:func:`quantverdict.serving.speed.speed_validity`), the stage's
    ``time_split`` (:func:`quantverdict.measure.sweep.time_split`) and, on cuda, the roofline. The server's
    compile cache is :func:`compile_cache_dir`.
    """
    server = new_server(cfg, rec, out, serve_dtype, env, model_path)
    hbm = rec.speed.hbm_copy
    activation_quantized = cfg.scheme.activation_bits < 16
    bench_dir = out / "bench"
    if before_start is not None:
        before_start(server)
    t0 = time.perf_counter()
    try:
        with server:
            rec.speed.server_start_s = round(time.perf_counter() - t0, 3)
            rec.speed.server = server.endpoint()
            rec.memory.server = ServerMemory.model_validate(
                vllm_log.parse(server.log_path.read_text(), activation_quantized)
            )
            save()
            yield server
    finally:
        rec.speed.server = server.endpoint()  # a server that could not start: the port it tried last
        # a crash mid-sweep keeps the points that finished (appended to sweep.jsonl one by one)
        if not rec.speed.points:
            rec.speed.points = [SweepPoint.model_validate(p) for p in finished_points(bench_dir)]
        if server.log_path.exists():
            rec.memory.server = ServerMemory.model_validate(
                vllm_log.parse(server.log_path.read_text(), activation_quantized)
            )
        speed_validity(rec.speed, cfg.scheme.label, rec.memory.server, activation_quantized)
        rec.speed.time_split = sweep_math.time_split(
            rec.speed.server_start_s, rec.memory.server, rec.speed.points, rec.speed.sweep_wall_s
        )
        if hbm:
            add_roofline(rec.speed, rec.model, model_path, hbm)


def benchmark(
    cfg: Config,
    rec: Record,
    out: Path,
    serve_dtype: DtypeChoice | None,
    env: StageEnv,
    model_path: str,
    save: Callable[[], None],
) -> None:
    """Start the server and the sweep's client together, sweep, stop both (a server started only for the sweep).

    The client (:func:`quantverdict.serving.benchmark.start_client`) imports vLLM's benchmark library while the
    server starts and waits at its gate; a server that fails to start stops it too. Arguments and errors as
    :func:`serving` and :func:`sweep`.
    """
    clients: list[SweepClient] = []

    def start(server: VLLMServer) -> None:
        clients.append(start_client(server, cfg.bench, model_path, env, out / "bench"))

    try:
        with serving(cfg, rec, out, serve_dtype, env, model_path, save, before_start=start) as server:
            sweep(cfg, rec, server, env, model_path, out, client=clients[0] if clients else None)
    finally:
        for client in clients:
            client.stop()


def sweep(
    cfg: Config,
    rec: Record,
    server: VLLMServer,
    env: StageEnv,
    model_path: str,
    out: Path,
    client: SweepClient | None = None,
) -> None:
    """Run the speed sweep (``cfg.bench``) against the running ``server`` into ``rec.speed.points`` (``client``:
    one started with the server, see :func:`benchmark`; None: started now).

    Raises:
        RuntimeError: a sweep point completed no request (the points stay in the record, flagged).
        quantverdict.serving.server.ServerError: the server died (the message quotes the root cause from its log).
    """
    # a client told a port the server lost while it started is started again by run_sweep, not with the server
    with_server = client is not None and client.base_url == server.base_url
    t0 = time.perf_counter()
    points: list[dict[str, Any]] | None = None
    sampled: gpu_sampling.Sampling | None = None
    host: host_sampling.HostSampled | None = None
    try:
        with (
            gpu_sampling.sampling(cfg, env, out / "bench") as sampled,  # NVML on cuda; on cpu, why not
            host_sampling.sampling(cfg, server.pid, server.base_url, out / "bench") as host,  # every device
        ):
            points = run_sweep(server, cfg.bench, model_path, env, out / "bench", client=client)
    finally:
        # a sweep that failed part-way keeps the points that finished, with their GPU and host windows
        if points is None:
            points = finished_points(out / "bench")
        rec.speed.sweep_wall_s = round(time.perf_counter() - t0, 3)
        for p in points:
            p["server_start"] = 1  # the job's own start (quantverdict.orchestrate.starts runs the others)
        rec.speed.points = [SweepPoint.model_validate(p) for p in points]
        if (search := capacity_search.read_search(out / "bench")) is not None:  # bench.capacity: its outcome
            rec.speed.searches = [CapacitySearch.model_validate({**search, "server_start": 1})]
        if sampled is not None:
            gpu_sampling.annotate(rec.speed, sampled)
        if host is not None:
            host_sampling.annotate(rec.speed, host, sampled.path if sampled is not None else None)
    # the client's own start: with the server (its import overlapped the start-up, outside sweep_wall_s) or not
    result = out / "bench" / "sweep_client.result.json"
    done = SweepClientTimes.model_validate_json(result.read_text()) if result.is_file() else SweepClientTimes()
    rec.speed.sweep_client = {
        "started_with_server": with_server,
        "import_s": done.import_s,
        "gate_wait_s": done.gate_wait_s,
        # the warm-up waves run before the sweep with bench.prefetch_prompts (part of sweep_wall_s; None without)
        "calibration_s": done.calibration_s,
    }
    dead = [str(p.point) for p in rec.speed.points if not p.completed]
    if dead:
        server.check_alive(" during the sweep", wait_s=15)  # a server that died under load says so, and why
        cause = procs.log_root_cause(server.log_path)
        raise RuntimeError(
            f"no request completed at sweep point(s) {', '.join(dead)}: the server answered with errors"
            f"{' (' + cause + ')' if cause else ''} (see {server.log_path}); the points are kept in the record, "
            "flagged invalid"
        )
