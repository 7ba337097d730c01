"""The speed sweep: vLLM's own client (``vllm bench serve``) against a running :class:`VLLMServer`.

Orchestrator side; the client runs in the serve environment as
``python -m quantverdict.children.vllm_cli bench serve ...`` through :mod:`quantverdict.processes.procs`.
Every finished point is appended to ``out_dir/sweep.jsonl`` at once, so a crash mid-sweep keeps
the points already measured. Parsing lives in :mod:`quantverdict.measure.sweep`.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from quantverdict.config.schema import BenchConfig
from quantverdict.measure import bench_result, sweep_plan
from quantverdict.processes import procs
from quantverdict.processes.envs import StageEnv
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
) -> list[str]:
    """The ``vllm bench serve`` command line for one point.

    Random dataset with fixed lengths (``--random-range-ratio`` defaults to 0), ``--ignore-eos``
    so that every request produces exactly ``output_len`` tokens, greedy sampling
    (``--temperature 0``) so that runs are repeatable. The seed is ``bench.seed + repeat``: every
    load level and every scheme sees the same prompts and arrival pattern; repeats differ.
    """
    cmd = serve_env.module(CLI_MODULE, "bench", "serve")
    cmd += ["--backend", "vllm", "--base-url", server.base_url, "--model", server.served_model_name]
    cmd += ["--tokenizer", str(tokenizer_path), "--dataset-name", "random"]
    cmd += ["--random-input-len", str(bench_cfg.input_len), "--random-output-len", str(bench_cfg.output_len)]
    if bench_cfg.ignore_eos:
        cmd.append("--ignore-eos")
    n = sweep_plan.prompts_for(bench_cfg.num_prompts, bench_cfg.prompts_per_concurrency, point.concurrency)
    cmd += ["--num-prompts", str(n), "--request-rate", point.request_rate_arg]
    if point.concurrency is not None:
        cmd += ["--max-concurrency", str(point.concurrency)]
    cmd += ["--seed", str(bench_cfg.seed + point.repeat)]
    if bench_cfg.warmup_prompts > 0 and "--num-warmups" in optional_flags:
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


def client_failure(server: VLLMServer, point: str, rc: int | None, client_log: Path) -> str:
    """Why a point's client failed, root cause first: the client's own error line
    (:func:`quantverdict.processes.procs.root_cause`) and, when the server's log holds one, the server's.

    Call :meth:`VLLMServer.check_alive` first: a server that died is reported as such.
    """
    client = procs.log_root_cause(client_log)
    served = procs.log_root_cause(server.log_path)
    why = f"{client or 'no error line in its log'}" + (f"; the server's log says: {served}" if served else "")
    how = f"exit code {rc}" if rc is not None else "no result file"
    return f"vllm bench serve failed for point {point}: {why} ({how}; log: {client_log})\n{_tail(client_log)}"


def run_sweep(
    server: VLLMServer,
    bench_cfg: BenchConfig,
    tokenizer_path: str | Path,
    serve_env: StageEnv,
    out_dir: Path,
) -> list[dict[str, Any]]:
    """Run every point of ``bench_cfg`` against ``server``; return the parsed points in run order.

    Files in ``out_dir``: ``<point>.json`` (vLLM's detailed result), ``<point>.log`` (client
    output), ``sweep.jsonl`` (one parsed point per line, appended as each point finishes).

    Args:
        server: a started, verified :class:`VLLMServer`.
        bench_cfg: ``bench`` (mode, rates/concurrencies, prompts, lengths, repeats, seed, timeout).
        tokenizer_path: the checkpoint directory (its tokenizer builds the random prompts).
        serve_env: the serve environment (the client is vLLM's own).
        out_dir: where results go.

    Returns:
        One dict per point, see :func:`quantverdict.measure.bench_result.parse_result` (validity, saturation and
        recomputed latencies included; summaries over repeats: :func:`quantverdict.measure.sweep.summarize`).

    Raises:
        BenchmarkError: a point's client failed or timed out (finished points stay in sweep.jsonl).
        quantverdict.serving.server.ServerError: the server died during the sweep (the message quotes the
            root cause from its log).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    points = sweep_plan.plan(bench_cfg.mode, list(bench_cfg.rates), list(bench_cfg.concurrencies), bench_cfg.repeats)
    flags = supported_optional_flags(serve_env)
    jsonl = out_dir / "sweep.jsonl"
    results: list[dict[str, Any]] = []
    log.info(
        "speed sweep: %d points (%s), %d prompts each, %d in / %d out tokens",
        len(points),
        bench_cfg.mode,
        bench_cfg.num_prompts,
        bench_cfg.input_len,
        bench_cfg.output_len,
    )
    for i, point in enumerate(points, 1):
        server.check_alive(" during the sweep" if i > 1 else "")
        result_file = out_dir / f"{point.name}.json"
        client_log = out_dir / f"{point.name}.log"
        result_file.unlink(missing_ok=True)
        cmd = bench_command(server, bench_cfg, tokenizer_path, serve_env, point, out_dir, flags)
        t0 = time.monotonic()
        proc = procs.start(cmd, client_log, env=serve_env.env, echo=False)
        try:
            rc = procs.wait(proc, bench_cfg.point_timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise BenchmarkError(
                f"point {point.name} ran past bench.point_timeout_s={bench_cfg.point_timeout_s:g} s "
                f"(client log: {client_log})"
            ) from exc
        if rc != 0 or not result_file.is_file():
            server.check_alive(f" during sweep point {point.name}", wait_s=15)
            raise BenchmarkError(client_failure(server, point.name, rc, client_log))
        warmups = bench_cfg.warmup_prompts if "--num-warmups" in flags else 0
        parsed = bench_result.parse_result(
            json.loads(result_file.read_text()),
            point,
            sweep_plan.prompts_for(bench_cfg.num_prompts, bench_cfg.prompts_per_concurrency, point.concurrency),
            bench_cfg.output_len,
            warmups,
        )
        parsed["client_wall_s"] = round(time.monotonic() - t0, 1)
        parsed["result_file"] = str(result_file)
        with open(jsonl, "a") as fh:
            fh.write(json.dumps(parsed) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        results.append(parsed)
        log.info(bench_result.summary_line(parsed, i, len(points)))
    return results
