"""The speed sweep: vLLM's own benchmark library against a running :class:`VLLMServer`, from one client process.

Orchestrator side. :func:`run_sweep` starts ``python -m quantverdict.children.sweep_client`` once in the serve
environment: it imports vLLM's benchmark library once and drives every point (warm-up from unmeasured
prompts, prefix-cache reset, a distinct seed per point and repeat, a window of at least
``bench.min_duration_s``, the server's ``/metrics`` counters around each point). Every finished point is
parsed and appended to ``out_dir/sweep.jsonl`` as soon as its files appear, so a crash mid-sweep keeps the
points already measured. Parsing lives in :mod:`quantverdict.measure.bench_result`.

:func:`bench_command` is the equivalent ``vllm bench serve`` command line of one point, a CLI process per
point as before: ``tools.bench.fidelity`` runs it by hand to check the sweep against the tool people use.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from quantverdict.children import workload_check
from quantverdict.config.schema import BenchConfig
from quantverdict.config.workload import request_shape
from quantverdict.measure import bench_result, sweep_plan
from quantverdict.measure import workload as measure_workload
from quantverdict.measure.points import SamplingParams
from quantverdict.measure.points import SweepPoint as RecordedPoint
from quantverdict.processes import procs
from quantverdict.processes.envs import StageEnv
from quantverdict.processes.runner import ChildFailed, read_outcome
from quantverdict.results.stage_results import PointSidecar
from quantverdict.serving import capacity as capacity_search
from quantverdict.serving import workload
from quantverdict.serving.server import CLI_MODULE, VLLMServer

log = logging.getLogger(__name__)


class BenchmarkError(RuntimeError):
    """A point of the sweep failed: the client exited non-zero, timed out, or wrote no result."""


# Finds vLLM's benchmark client source without importing vLLM (find_spec on a top-level
# package does not run it), to ask which optional flags this version has.
_FLAG_PROBE = (
    "import importlib.util,pathlib,sys\n"
    "s=importlib.util.find_spec('vllm')\n"
    "p=pathlib.Path(s.submodule_search_locations[0])/'benchmarks'/'serve.py'\n"
    "t=p.read_text() if p.is_file() else ''\n"
    "print(' '.join(f for f in sys.argv[1:] if repr(f) in t or ('\"'+f+'\"') in t))"
)
_OPTIONAL_FLAGS = ("--num-warmups", "--temperature")


@lru_cache(maxsize=8)
def _supported_optional_flags(python: str, env_items: tuple[tuple[str, str], ...]) -> frozenset[str]:
    res = subprocess.run(
        [python, "-c", _FLAG_PROBE, *_OPTIONAL_FLAGS],
        capture_output=True,
        text=True,
        env={**os.environ, **dict(env_items)},
        timeout=60,
    )
    if res.returncode != 0:
        log.warning("could not inspect vllm bench serve's flags (%s); optional flags left out", res.stderr[-300:])
        return frozenset()
    return frozenset(res.stdout.split())


def supported_optional_flags(env: StageEnv) -> frozenset[str]:
    """Which of ``--num-warmups``/``--temperature`` this environment's ``vllm bench serve`` accepts."""
    return _supported_optional_flags(env.python, tuple(sorted(env.env.items())))


def bench_command(
    server: VLLMServer,
    bench_cfg: BenchConfig,
    tokenizer_path: str | Path,
    serve_env: StageEnv,
    point: sweep_plan.SweepPoint,
    result_dir: Path,
    optional_flags: frozenset[str] = frozenset(_OPTIONAL_FLAGS),
    seed: int | None = None,
    num_prompts: int | None = None,
    warmups: bool = True,
) -> list[str]:
    """The ``vllm bench serve`` command line for one point.

    The dataset of ``bench.dataset`` (:func:`quantverdict.children.workload_check.dataset_args`; the default:
    vLLM's random dataset with fixed lengths, ``--random-range-ratio`` defaults to 0), ``--ignore-eos``
    so that every request produces exactly ``output_len`` tokens, greedy sampling
    (``--temperature 0``) so that runs are repeatable.

    Args:
        seed: ``--seed``; None: ``bench.seed + repeat``, the older method, which gives every load
            level the same prompts (the prefix cache then serves them; kept for the test that shows it).
        num_prompts: ``--num-prompts``; None: :func:`quantverdict.measure.sweep_plan.prompts_for`.
        warmups: pass ``--num-warmups bench.warmup_prompts`` (vLLM sends the first measured prompt that
            many times) and keep vLLM's ready check (it sends that prompt once more); False:
            ``--num-warmups 0 --ready-check-timeout-sec 0``, nothing measured is sent before the run.
    """
    cmd = serve_env.module(CLI_MODULE, "bench", "serve")
    cmd += ["--backend", "vllm", "--base-url", server.base_url, "--model", server.served_model_name]
    cmd += ["--tokenizer", str(tokenizer_path)]
    dataset = workload.client_dataset(bench_cfg, result_dir)
    cmd += workload_check.dataset_args(dataset, bench_cfg.input_len, bench_cfg.output_len)
    if bench_cfg.ignore_eos:
        cmd.append("--ignore-eos")
    n = num_prompts or sweep_plan.prompts_for(
        bench_cfg.num_prompts, bench_cfg.prompts_per_concurrency, point.concurrency
    )
    n = workload_check.requests_to_send(dataset, n)
    cmd += ["--num-prompts", str(n), "--request-rate", point.request_rate_arg]
    if point.concurrency is not None:
        cmd += ["--max-concurrency", str(point.concurrency)]
    cmd += ["--seed", str(bench_cfg.seed + point.repeat if seed is None else seed)]
    if not warmups:
        cmd += ["--num-warmups", "0", "--ready-check-timeout-sec", "0"]
    elif bench_cfg.warmup_prompts > 0 and "--num-warmups" in optional_flags:
        cmd += ["--num-warmups", str(bench_cfg.warmup_prompts)]
    if "--temperature" in optional_flags:
        cmd += ["--temperature", "0"]
    cmd += ["--percentile-metrics", ",".join(sweep_plan.METRICS)]
    cmd += ["--metric-percentiles", ",".join(str(p) for p in sweep_plan.PERCENTILES)]
    cmd += ["--save-result", "--save-detailed", "--disable-tqdm"]
    cmd += ["--result-dir", str(result_dir), "--result-filename", f"{point.name}.json"]
    return cmd


def _tail(path: Path, lines: int = 20) -> str:
    return procs.clean_tail(procs.read_log(path), lines) or "(empty log)"


def client_failure(server: VLLMServer, point: str, rc: int | None, client_log: Path, error: str | None = None) -> str:
    """Why a point's client failed, root cause first: the client's own error line
    (:func:`quantverdict.processes.procs.root_cause`) and, when the server's log holds one, the server's.

    Call :meth:`VLLMServer.check_alive` first: a server that died is reported as such.
    """
    client = error or procs.log_root_cause(client_log)
    served = procs.log_root_cause(server.log_path)
    why = f"{client or 'no error line in its log'}" + (f"; the server's log says: {served}" if served else "")
    how = f"exit code {rc}" if rc is not None else "no result file"
    head = f"the sweep client (vLLM's benchmark library) failed at point {point}: {why}"
    return f"{head} ({how}; log: {client_log})\n{_tail(client_log)}"


def sweep_spec(
    server: VLLMServer,
    bench_cfg: BenchConfig,
    tokenizer_path: str | Path,
    points: list[sweep_plan.SweepPoint],
    result_dir: Path,
) -> dict[str, Any]:
    """The spec of :mod:`quantverdict.children.sweep_client` for ``points`` (in run order): the ``i``-th
    point's seed is :func:`~quantverdict.measure.sweep_plan.point_seed` ``(bench.seed, i)``, its minimum
    request count :func:`~quantverdict.measure.sweep_plan.prompts_for`; the warm-up seed
    :func:`~quantverdict.measure.sweep_plan.warmup_seed`; ``dataset`` the traffic
    (:func:`quantverdict.serving.workload.client_dataset`), ``max_model_len`` the server's context (the client
    checks a prompts file's token counts against it before the gate)."""
    return {
        "base_url": server.base_url,
        "model": server.served_model_name,
        "tokenizer": str(tokenizer_path),
        "input_len": bench_cfg.input_len,
        "output_len": bench_cfg.output_len,
        "dataset": workload.client_dataset(bench_cfg, result_dir),
        "max_model_len": server.max_model_len,
        "ignore_eos": bench_cfg.ignore_eos,
        "percentile_metrics": ",".join(sweep_plan.METRICS),
        "metric_percentiles": ",".join(str(p) for p in sweep_plan.PERCENTILES),
        "result_dir": str(result_dir),
        "warmup_prompts": bench_cfg.warmup_prompts,
        "warmup_seed": sweep_plan.warmup_seed(bench_cfg.seed),
        "min_duration_s": bench_cfg.min_duration_s,
        "reset_prefix_cache": bench_cfg.reset_prefix_cache,
        "prefetch_prompts": bench_cfg.prefetch_prompts,
        "points": [
            {
                "name": p.name,
                "request_rate": p.request_rate_arg,
                "max_concurrency": p.concurrency,
                "num_prompts": sweep_plan.prompts_for(
                    bench_cfg.num_prompts, bench_cfg.prompts_per_concurrency, p.concurrency
                ),
                "seed": sweep_plan.point_seed(bench_cfg.seed, i),
            }
            for i, p in enumerate(points)
        ],
    }


def parse_point(out_dir: Path, point: sweep_plan.SweepPoint, bench_cfg: BenchConfig) -> RecordedPoint:
    """One finished point from its two files: vLLM's ``<point>.json`` and the client's ``<point>.qv.json``
    (:func:`quantverdict.measure.bench_result.parse_result`, then
    :func:`~quantverdict.measure.bench_result.add_client_side` and
    :func:`quantverdict.measure.workload.add_workload`: the lengths sent, a shared-prefix workload's hit rate)."""
    side = json.loads((out_dir / f"{point.name}.qv.json").read_text())
    result_file = out_dir / f"{point.name}.json"
    result = bench_result.VllmBenchResult.model_validate_json(result_file.read_text())
    dataset = workload.client_dataset(bench_cfg, out_dir)
    sent = workload_check.requests_to_send(dataset, int(side["num_prompts"]))  # shared_prefix: whole groups
    parsed = bench_result.parse_result(
        result,
        point,
        sent,
        None if dataset.get("output_tokens_from_file") else bench_cfg.output_len,
        bench_cfg.warmup_prompts,
    )
    shared = measure_workload.shared_prefix_tokens(dataset, sent)
    bench_result.add_client_side(parsed, side, bench_cfg.min_duration_s, shared_tokens=shared)
    measure_workload.add_workload(parsed, result.input_lens, result.output_lens, dataset, bench_cfg.input_len)
    parsed.request_times = bench_result.request_times(result)
    sampling = PointSidecar.model_validate(side).sampling
    if sampling is not None:  # what every request of the point was sent with
        parsed.sampling = SamplingParams.model_validate(sampling)
    parsed.result_file = str(result_file)
    return parsed


def _append(jsonl: Path, parsed: dict[str, Any]) -> None:
    with open(jsonl, "a") as fh:
        fh.write(json.dumps(parsed) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def finished_points(bench_dir: Path) -> list[dict[str, Any]]:
    """The points a sweep finished, from ``bench_dir/sweep.jsonl`` (one parsed point per line, appended as each
    point finished, :func:`run_sweep`), in run order; [] when the file is absent. A line that is not whole JSON
    (the last one, cut by a kill before it was flushed) is left out, the others kept."""
    jsonl = bench_dir / "sweep.jsonl"
    if not jsonl.is_file():
        return []
    points = []
    for line in jsonl.read_text().splitlines():
        if not line.strip():
            continue
        try:
            points.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return points


CHILD = "sweep_client"
GATE = "sweep_client.go"


@dataclasses.dataclass
class SweepClient:
    """The sweep's client process, started before the server is ready: it imports vLLM's benchmark library
    (17.7 s on an H200 host) while the server loads, then waits for :attr:`gate` to exist.

    Attributes:
        proc: the client process (its own process group).
        points: the planned points, in run order; in a capacity search (:attr:`search`) those the client announced
            so far (:func:`quantverdict.serving.capacity.announced_points`).
        out_dir: where its files go; ``spec_path``, ``result_path``, ``log_path`` are its files there.
        gate: the file :func:`run_sweep` writes once the server is verified; the client starts the sweep then.
        base_url: the server address the client was given (the server may start on another port, see
            :meth:`quantverdict.serving.server.VLLMServer.start`).
    """

    proc: subprocess.Popen[bytes]
    points: list[sweep_plan.SweepPoint]
    out_dir: Path
    spec_path: Path
    result_path: Path
    log_path: Path
    gate: Path
    base_url: str = ""
    search: bool = False  # a capacity search (bench.capacity): the client picks the points as it goes

    def stop(self) -> None:
        """End the client and what is left of its process group: a server that never came up leaves the client
        waiting at the gate; a client killed alone would leave its prompt worker behind."""
        if self.proc.poll() is None or procs.group_alive(self.proc.pid):
            procs.stop_group(self.proc)


def start_client(
    server: VLLMServer,
    bench_cfg: BenchConfig,
    tokenizer_path: str | Path,
    serve_env: StageEnv,
    out_dir: Path,
    gate_timeout_s: float | None = None,
) -> SweepClient:
    """Start the sweep client for ``server`` (its URL and served name are fixed before it starts), holding at
    a gate: call this before ``server.start()`` so that the client's imports overlap the server's start-up;
    :func:`run_sweep` opens the gate. Files from an earlier run of the same points are removed first.

    Args:
        gate_timeout_s: how long the client waits for the gate before it gives up (exit 1); default the
            server's ``startup_timeout_s`` + 300 s.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    search = capacity_search.search_spec(bench_cfg)
    if search is not None:  # the client makes the points as the search goes
        capacity_search.clear(out_dir)
    points = (
        []
        if search is not None
        else sweep_plan.plan(bench_cfg.mode, list(bench_cfg.rates), list(bench_cfg.concurrencies), bench_cfg.repeats)
    )
    for p in points:
        for suffix in (".json", ".qv.json", ".short.json"):
            (out_dir / f"{p.name}{suffix}").unlink(missing_ok=True)
    gate = out_dir / GATE
    gate.unlink(missing_ok=True)
    spec = sweep_spec(server, bench_cfg, tokenizer_path, points, out_dir)
    spec["start_gate"] = str(gate)
    if search is not None:
        spec["search"] = search
    spec["gate_timeout_s"] = (
        gate_timeout_s if gate_timeout_s is not None else float(server.cfg.startup_timeout_s) + 300.0
    )
    spec_path, result_path, client_log = (out_dir / f"{CHILD}{x}" for x in (".spec.json", ".result.json", ".log"))
    result_path.unlink(missing_ok=True)
    spec_path.write_text(json.dumps(spec, indent=2))
    proc = procs.start(
        serve_env.module(f"quantverdict.children.{CHILD}", str(spec_path), str(result_path)),
        client_log,
        env=serve_env.env,
        echo=False,
    )
    return SweepClient(
        proc, points, out_dir, spec_path, result_path, client_log, gate, server.base_url, search is not None
    )


def run_sweep(
    server: VLLMServer,
    bench_cfg: BenchConfig,
    tokenizer_path: str | Path,
    serve_env: StageEnv,
    out_dir: Path,
    client: SweepClient | None = None,
) -> list[dict[str, Any]]:
    """Run every point of ``bench_cfg`` against ``server`` from one client process; return the parsed points
    in run order.

    Files in ``out_dir``: ``<point>.json`` (vLLM's result, as ``vllm bench serve --save-result
    --save-detailed`` writes it), ``<point>.qv.json`` (seed, server counters, attempts, wall time),
    ``sweep_client.log`` (client output), ``sweep.jsonl`` (one parsed point per line, appended as each
    point finishes); in a capacity search (``bench.capacity``) also ``points.jsonl`` (the points in the order the
    client announced them) and ``search.json`` (:mod:`quantverdict.serving.capacity`).

    Args:
        server: a started, verified :class:`VLLMServer` (dev mode: ``/reset_prefix_cache``).
        bench_cfg: ``bench`` (mode, rates/concurrencies, prompts, lengths, repeats, seed, min_duration_s,
            reset_prefix_cache, point_timeout_s).
        tokenizer_path: the checkpoint directory (its tokenizer builds the random prompts).
        serve_env: the serve environment (the client is vLLM's own library).
        out_dir: where results go.
        client: the client :func:`start_client` started while the server loaded; None, or one told another
            address (the server started again on another port): started now.

    Returns:
        One dict per point, see :func:`quantverdict.measure.bench_result.parse_result` and
        :func:`~quantverdict.measure.bench_result.add_client_side` (validity with the prefix-cache hit rate
        and server token counts, saturation, recomputed latencies, client overhead).

    Raises:
        BenchmarkError: the client failed, or no point finished within ``bench.point_timeout_s`` of the
            previous one (finished points stay in sweep.jsonl).
        quantverdict.serving.server.ServerError: the server died during the sweep (the message quotes the
            root cause from its log).
    """
    server.check_alive()
    if client is not None and client.base_url != server.base_url:  # told the port the server lost while it started
        log.info("the server moved to %s: the sweep client is started again with that address", server.base_url)
        client.stop()
        client = None
    if client is None:
        client = start_client(server, bench_cfg, tokenizer_path, serve_env, out_dir)
    log.info(
        "speed sweep: %s (%s), >= %d prompts and >= %g s each, %s, one client process",
        "a capacity search" if client.search else f"{len(client.points)} points",
        bench_cfg.mode,
        bench_cfg.num_prompts,
        bench_cfg.min_duration_s,
        request_shape(bench_cfg),
    )
    points, result_path, client_log = client.points, client.result_path, client.log_path
    jsonl = out_dir / "sweep.jsonl"
    results: list[dict[str, Any]] = []
    client.gate.write_text(f"{time.time():.3f}\n")  # the server is verified: the client may start
    proc = client.proc
    last = time.monotonic()
    try:
        while True:
            rc = proc.poll()
            if client.search:  # the points announced so far (the client appends each before it runs)
                points = client.points = capacity_search.announced_points(out_dir)
            while len(results) < len(points) and (out_dir / f"{points[len(results)].name}.qv.json").is_file():
                point = points[len(results)]
                parsed = parse_point(out_dir, point, bench_cfg)
                _append(jsonl, parsed.to_dict())
                results.append(parsed.to_dict())
                last = time.monotonic()
                log.info(bench_result.summary_line(parsed, len(results), len(points)))
            if rc is not None:
                break
            if time.monotonic() - last > bench_cfg.point_timeout_s:
                name = points[len(results)].name if len(results) < len(points) else "(after the last point)"
                raise BenchmarkError(
                    f"point {name} ran past bench.point_timeout_s={bench_cfg.point_timeout_s:g} s "
                    f"(client log: {client_log})"
                )
            time.sleep(0.5)
    except BaseException:
        procs.stop_group(proc)
        raise
    procs.wait(proc)
    client.stop()  # the client has exited; a prompt worker it left behind goes too
    unfinished = client.search and capacity_search.read_search(out_dir) is None
    if rc != 0 or len(results) < len(points) or unfinished:
        server.check_alive(" during the sweep", wait_s=15)
        name = points[len(results)].name if len(results) < len(points) else "(after the last point)"
        err = None
        if result_path.is_file():
            try:
                outcome, _ = read_outcome(result_path)
            except ValueError as exc:  # not JSON, or not a child's result: the client's log names the cause
                log.warning("the sweep client's result %s is unreadable: %s", result_path, exc)
            else:
                err = outcome.error if isinstance(outcome, ChildFailed) else None
        raise BenchmarkError(client_failure(server, name, rc, client_log, err))
    return results
