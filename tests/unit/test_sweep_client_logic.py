"""The one-process sweep client's decisions, against a stand-in for vLLM's benchmark module (no server): a
warm-up only before the first repeat of a load level, later repeats sized from the earlier one's rate (a
closed loop: the rate reached; an open loop: the offered rate), a short first window run again with the
same seed after a cache reset, the sampled prompts counted and passed through unchanged, one tokenizer.
With ``prefetch_prompts``: every level's warm-up wave before the sweep, every repeat sized from it and its
prompts made ahead by the workers (threads here).

The stand-in's server: a closed loop of C reaches 2 x C req/s for a warm-up wave (<= C requests) and 3 x C
req/s for a measured run; an open loop completes half the offered rate (overloaded). Its prompts repeat
with period 50, so a run of n > 50 requests has n - 50 repeats.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import types
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from quantverdict.children import prompt_sampler, sweep_client, vllm_cli

CALLS: dict[str, Any] = {}

SERVE_SRC = """
import json, pathlib, types

def add_cli_args(parser):
    for flag in ("--backend", "--base-url", "--model", "--tokenizer", "--dataset-name", "--random-input-len",
                 "--random-output-len", "--request-rate", "--temperature", "--ready-check-timeout-sec",
                 "--num-warmups", "--percentile-metrics", "--metric-percentiles", "--result-dir",
                 "--result-filename"):
        parser.add_argument(flag)
    parser.add_argument("--num-prompts", type=int)
    parser.add_argument("--max-concurrency", type=int)
    parser.add_argument("--seed", type=int)
    for flag in ("--ignore-eos", "--disable-tqdm", "--save-result", "--save-detailed"):
        parser.add_argument(flag, action="store_true")

def get_tokenizer(name, **kw):
    CALLS["tokenizer_loads"] += 1
    return object()

def get_samples(args, tokenizer):
    CALLS["sampled"].append((args.seed, args.num_prompts))
    return [types.SimpleNamespace(prompt=f"prompt {(args.seed * 7 + i) % 50}" + "x" * 80, prompt_len=10)
            for i in range(args.num_prompts)]

async def main_async(args):
    tok = get_tokenizer(args.tokenizer)
    reqs = get_samples(args, tok)
    n = len(reqs)
    CALLS["runs"].append((args.seed, n, args.max_concurrency, args.request_rate))
    CALLS["first_prompts"].append(reqs[0].prompt)
    if args.max_concurrency:
        rps = (2 if n <= args.max_concurrency else 3) * args.max_concurrency
    else:
        rps = 0.5 * float(args.request_rate)
    rps = CALLS["rps_by_seed"].get(args.seed, rps)  # a test can make one seed's run faster
    res = {"duration": n / rps, "completed": n, "num_prompts": n}
    if args.save_result:
        (pathlib.Path(args.result_dir) / args.result_filename).write_text(json.dumps(res))
    return res
"""


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    CALLS.clear()
    CALLS.update(tokenizer_loads=0, runs=[], sampled=[], first_prompts=[], rps_by_seed={})
    prompt_sampler._TOKENIZERS.clear()  # noqa: SLF001 - the worker's cache, kept between calls in a process
    prompt_sampler._PARSER.clear()  # noqa: SLF001 - its parser, built from the stand-in of each test
    serve = types.ModuleType("vllm.benchmarks.serve")
    serve.__dict__["CALLS"] = CALLS
    exec(SERVE_SRC, serve.__dict__)  # noqa: S102 - the stand-in's own source, above
    benchmarks = types.ModuleType("vllm.benchmarks")
    benchmarks.serve = serve  # type: ignore[attr-defined]
    argparse_utils = types.ModuleType("vllm.utils.argparse_utils")
    argparse_utils.FlexibleArgumentParser = argparse.ArgumentParser  # type: ignore[attr-defined]
    for name, mod in {
        "vllm": types.ModuleType("vllm"),
        "vllm.benchmarks": benchmarks,
        "vllm.benchmarks.serve": serve,
        "vllm.utils": types.ModuleType("vllm.utils"),
        "vllm.utils.argparse_utils": argparse_utils,
    }.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(sweep_client, "install_alias", lambda: None)
    monkeypatch.setattr(vllm_cli, "install_alias", lambda: None)
    monkeypatch.setattr(sweep_client, "reset_prefix_cache", lambda url: {"success": True, "tries": 1, "s": 0.0})
    monkeypatch.setattr(sweep_client, "settled_counters", lambda url: {})
    return serve


def _spec(tmp_path: Path) -> dict[str, Any]:
    pts = [
        {"name": "conc-4_r0", "request_rate": "inf", "max_concurrency": 4, "num_prompts": 16, "seed": 1},
        {"name": "conc-4_r1", "request_rate": "inf", "max_concurrency": 4, "num_prompts": 16, "seed": 2},
        {"name": "rate-2_r0", "request_rate": "2", "max_concurrency": None, "num_prompts": 16, "seed": 3},
        {"name": "rate-2_r1", "request_rate": "2", "max_concurrency": None, "num_prompts": 16, "seed": 4},
    ]
    return {
        "base_url": "http://127.0.0.1:1", "model": "m", "tokenizer": "/tok", "input_len": 10, "output_len": 4,
        "ignore_eos": True, "percentile_metrics": "ttft", "metric_percentiles": "50", "result_dir": str(tmp_path),
        "warmup_prompts": 2, "warmup_seed": 1_000_000, "min_duration_s": 10.0, "reset_prefix_cache": True,
        "points": pts,
    }  # fmt: skip


def test_warmups_sizes_retries_and_repeats(fake_vllm: types.ModuleType, tmp_path: Path) -> None:
    sweep_client.run(_spec(tmp_path))
    side = {
        n: json.loads((tmp_path / f"{n}.qv.json").read_text())
        for n in ("conc-4_r0", "conc-4_r1", "rate-2_r0", "rate-2_r1")
    }
    # warm-ups: one wave of C = 4 before conc-4_r0, warmup_prompts = 2 before rate-2_r0, none before the repeats
    assert [side[n]["warmup"]["requests"] for n in side] == [4, 0, 2, 0]
    # conc-4_r0: the warm-up wave ran at 8 req/s, so 8 x 10 s x 1.2 = 96 requests; the run went at 12 req/s:
    # 8.0 s < 10 s, run again with the same seed (the cache was reset) at 12 x 10 x 1.15 = 138 requests, 140 in
    # whole waves of 4
    a = side["conc-4_r0"]["attempts"]
    assert [x["num_prompts"] for x in a] == [math.ceil(8 * 10 * 1.2), 4 * math.ceil(12 * 10 * 1.15 / 4)]  # 96, 140
    assert [x["seed"] for x in a] == [1, 1] and side["conc-4_r0"]["seed"] == 1
    assert (tmp_path / "conc-4_r0.short.json").is_file()
    # conc-4_r1: no warm-up, sized from the 12 req/s conc-4_r0 reached: 140 requests, one attempt, 11.7 s
    assert [x["num_prompts"] for x in side["conc-4_r1"]["attempts"]] == [140]
    assert side["conc-4_r1"]["warmup"]["rate_estimate_rps"] == 12.0
    # open loop at 2 req/s, overloaded (1 req/s completed): both repeats sized at the offered 2 req/s
    assert side["rate-2_r0"]["num_prompts"] == math.ceil(2 * 10 * 1.2)  # 24
    assert side["rate-2_r1"]["num_prompts"] == math.ceil(2 * 10 * 1.15)  # 23, not 12 from the 1 req/s reached
    # the prompts vLLM sampled were counted as sent (period 50: 140 requests, 90 repeats) and passed through
    assert side["conc-4_r1"]["prompt_repeats"] == {
        "requests": 140, "prompt_tokens": 1400, "repeated_requests": 90, "repeated_tokens": 900,
    }  # fmt: skip
    assert side["rate-2_r1"]["prompt_repeats"]["repeated_requests"] == 0  # 23 requests < 50
    measured = [r for r in CALLS["runs"] if r[0] != 1_000_000]
    assert [r[1] for r in measured] == [96, 140, 140, 24, 23]  # main_async sent what get_samples returned
    # one tokenizer for the 7 calls (2 warm-ups, 5 runs)
    assert len(CALLS["runs"]) == 7 and CALLS["tokenizer_loads"] == 1


def test_a_failed_reset_retries_with_another_seed(
    fake_vllm: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sweep_client, "reset_prefix_cache", lambda url: {"success": False, "tries": 20, "s": 5.0})
    spec = _spec(tmp_path)
    spec["points"] = spec["points"][:1]
    sweep_client.run(spec)
    side = json.loads((tmp_path / "conc-4_r0.qv.json").read_text())
    # the first attempt's prompts may still be cached: the second draws prompts never sent
    assert [x["seed"] for x in side["attempts"]] == [1, 1 + sweep_client.RETRY_SEED_STRIDE]
    assert side["seed"] == 1 + sweep_client.RETRY_SEED_STRIDE


def test_without_cache_resets_a_retry_draws_other_prompts(fake_vllm: types.ModuleType, tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    spec["points"], spec["reset_prefix_cache"] = spec["points"][:1], False
    sweep_client.run(spec)
    side = json.loads((tmp_path / "conc-4_r0.qv.json").read_text())
    assert [x["seed"] for x in side["attempts"]] == [1, 1 + sweep_client.RETRY_SEED_STRIDE]
    assert side["resets"] == []  # none asked for


def test_an_open_loop_without_warmup_is_sized_at_its_offered_rate(fake_vllm: types.ModuleType, tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    spec["points"], spec["warmup_prompts"] = spec["points"][2:3], 0
    sweep_client.run(spec)
    side = json.loads((tmp_path / "rate-2_r0.qv.json").read_text())
    assert "warmup" not in side and side["num_prompts"] == math.ceil(2 * 10 * 1.2)  # 24, not the minimum 16


def _prefetch(monkeypatch: pytest.MonkeyPatch) -> None:
    # the workers as threads (the stand-in vLLM lives in this process); the real ones are spawned processes
    monkeypatch.setattr(sweep_client, "sampling_pool", lambda workers: ThreadPoolExecutor(max_workers=workers))


def _closed(conc: int, repeats: int, seed0: int = 1) -> list[dict[str, Any]]:
    return [
        {"name": f"conc-{conc}_r{r}", "request_rate": "inf", "max_concurrency": conc, "num_prompts": 16,
         "seed": seed0 + r}
        for r in range(repeats)
    ]  # fmt: skip


def test_with_prefetch_every_repeat_is_sized_before_the_sweep_and_its_prompts_made_ahead(
    fake_vllm: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _prefetch(monkeypatch)
    spec = _spec(tmp_path)
    spec["points"], spec["prefetch_prompts"] = _closed(4, 3), True
    out = sweep_client.run(spec)
    side = {r: json.loads((tmp_path / f"conc-4_r{r}.qv.json").read_text()) for r in range(3)}
    # the calibration wave (4 requests, before the sweep) ran at 8 req/s: every repeat is sized 8 x 10 x 1.2 = 96.
    # r0 runs at 12 req/s, 8.0 s < 10 s, and again with the same seed at 12 x 10 x 1.15 = 138, 140 in whole waves
    # of 4; that short run resizes r1 and r2 from the 12 req/s it reached: 140 (11.7 s), one attempt each, their
    # prompts made again by the workers
    assert side[0]["warmup"] == {
        "requests": 4, "completed": 4, "duration_s": 0.5, "rate_estimate_rps": 8.0, "when": "before the sweep",
    }  # fmt: skip
    for r in (1, 2):
        assert side[r]["warmup"] == {
            "requests": 0, "sized_before_sweep": True, "rate_estimate_rps": 8.0, "resized_from_rps": 12.0,
        }  # fmt: skip
    a = side[0]["attempts"]
    assert [(x["num_prompts"], x["seed"]) for x in a] == [(96, 1), (140, 1)]
    # the first attempt's prompts came from the worker, the retry's from the client
    assert ["sampled_ahead_s" in x for x in a] == [True, False] and not any("prefetch_error" in x for x in a)
    for r in (1, 2):
        (b,) = side[r]["attempts"]
        assert (b["num_prompts"], b["seed"]) == (140, 1 + r) and "sampled_ahead_s" in b
    for r in range(3):  # counted as sent (140 requests, period 50: 90 repeats)
        assert side[r]["prompt_repeats"]["repeated_requests"] == 90
    assert [x["when"] for x in side[0]["resets"]] == [
        "before sweep", "after warm-up wave 1 of 1", "before the run", "after attempt 1", "after attempt 2",
    ]  # fmt: skip
    assert CALLS["runs"][0] == (1_000_000, 4, 4, "inf")  # the wave, then the measured runs
    assert [(r[0], r[1]) for r in CALLS["runs"][1:]] == [(1, 96), (1, 140), (2, 140), (3, 140)]
    # what main_async sent is what get_samples makes for that seed: the stand-in's first prompt of seed s is
    # "prompt (7 s) mod 50" (seed 2: 14, seed 3: 21)
    assert CALLS["first_prompts"][3] == "prompt 14" + "x" * 80 and CALLS["first_prompts"][4] == "prompt 21" + "x" * 80
    # made by the workers: the wave, the first plan (96 each; r1's and r2's may be cancelled before they start, so
    # at most once each) and the resized r1 and r2 (140); by the client: r0's retry
    made = sorted(CALLS["sampled"])
    for run in [(1_000_000, 4), (1, 96), (1, 140), (2, 140), (3, 140)]:
        assert made.count(run) == 1
    assert made.count((2, 96)) <= 1 and made.count((3, 96)) <= 1 and len(made) <= 7
    assert out["calibration_s"] is not None and out["calibration_s"] >= 0


def test_with_prefetch_the_calibration_waves_run_before_the_sweep_one_per_level(
    fake_vllm: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _prefetch(monkeypatch)
    # measured runs a little slower than the stand-in's 3 x C, so that no window falls short: conc-4 at 9 req/s,
    # conc-8 at 18 req/s
    CALLS["rps_by_seed"].update({1: 9.0, 2: 9.0, 3: 18.0, 4: 18.0})
    spec = _spec(tmp_path)
    spec["points"], spec["prefetch_prompts"] = _closed(4, 2) + _closed(8, 2, seed0=3), True
    sweep_client.run(spec)
    names = ["conc-4_r0", "conc-4_r1", "conc-8_r0", "conc-8_r1"]
    side = {n: json.loads((tmp_path / f"{n}.qv.json").read_text()) for n in names}
    # the waves, one per level, in plan order and before any measured run: conc-4's 4 requests at 8 req/s, conc-8's
    # 8 at 16 req/s; none before conc-8_r0. Sizes: conc-4 8 x 10 x 1.2 = 96 (10.7 s at 9 req/s), conc-8
    # 16 x 10 x 1.2 = 192 (10.7 s at 18 req/s), every repeat alike, one attempt each
    assert CALLS["runs"] == [
        (1_000_000, 4, 4, "inf"), (1_000_000, 8, 8, "inf"),
        (1, 96, 4, "inf"), (2, 96, 4, "inf"), (3, 192, 8, "inf"), (4, 192, 8, "inf"),
    ]  # fmt: skip
    assert [side[n]["warmup"]["requests"] for n in names] == [4, 0, 8, 0]
    assert [side[n]["warmup"]["rate_estimate_rps"] for n in names] == [8.0, 8.0, 16.0, 16.0]
    assert side["conc-8_r0"]["warmup"]["when"] == "before the sweep"
    assert side["conc-8_r1"]["warmup"]["sized_before_sweep"] is True
    for n in names:
        (attempt,) = side[n]["attempts"]
        assert "sampled_ahead_s" in attempt
    assert [side[n]["num_prompts"] for n in names] == [96, 96, 192, 192]
    # the calibration's resets (one after each wave: the second wave's prompts start as the first's) are in the
    # first point's sidecar only
    assert [x["when"] for x in side["conc-4_r0"]["resets"][:3]] == [
        "before sweep", "after warm-up wave 1 of 2", "after warm-up wave 2 of 2",
    ]  # fmt: skip
    assert [x["when"] for x in side["conc-8_r0"]["resets"]] == ["before the run", "after attempt 1"]
    assert sorted(CALLS["sampled"]) == sorted(
        [(1_000_000, 4), (1_000_000, 8), (1, 96), (2, 96), (3, 192), (4, 192)]
    )  # each made once


def test_with_prefetch_open_loop_waves_with_one_command_line_each_take_their_own_prompts(
    fake_vllm: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _prefetch(monkeypatch)
    spec = _spec(tmp_path)
    spec["points"] = [
        {"name": "rate-2_r0", "request_rate": "2", "max_concurrency": None, "num_prompts": 16, "seed": 1},
        {"name": "rate-4_r0", "request_rate": "4", "max_concurrency": None, "num_prompts": 16, "seed": 2},
    ]
    spec["prefetch_prompts"] = True
    sweep_client.run(spec)
    # both waves are 2 requests all at once with the warm-up seed (one command line): the worker made each once,
    # the client none; sized at the offered rates, 2 x 10 x 1.2 = 24 and 4 x 10 x 1.2 = 48 (24 s each, overloaded)
    assert CALLS["sampled"].count((1_000_000, 2)) == 2
    assert [(r[0], r[1]) for r in CALLS["runs"]] == [(1_000_000, 2), (1_000_000, 2), (1, 24), (2, 48)]
    for n in ("rate-2_r0", "rate-4_r0"):
        (attempt,) = json.loads((tmp_path / f"{n}.qv.json").read_text())["attempts"]
        assert "sampled_ahead_s" in attempt


def test_the_client_waits_for_the_gate(fake_vllm: types.ModuleType, tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    spec["points"] = spec["points"][:1]
    spec["start_gate"], spec["gate_timeout_s"] = str(tmp_path / "go"), 0.3
    with pytest.raises(TimeoutError, match="server did not come up"):
        sweep_client.run(spec)
    assert CALLS["runs"] == []  # nothing sent before the gate
    # the gate appears 0.2 s after the client starts waiting: it waits that long, then sweeps
    spec["gate_timeout_s"] = 5.0
    timer = threading.Timer(0.2, lambda: (tmp_path / "go").write_text("now"))
    timer.start()
    waited = sweep_client.run(spec)["gate_wait_s"]
    timer.join()
    assert 0.2 <= waited < 5.0 and len(CALLS["runs"]) == 3  # warm-up, 96 requests, 140 again


def test_reprefix_swaps_the_request_id_prefix() -> None:
    reqs = [types.SimpleNamespace(request_id=f"bench-aaaa-{i}") for i in range(3)] + [types.SimpleNamespace()]
    prompt_sampler.reprefix(reqs, "bench-aaaa-", "bench-bbbb-")
    assert [getattr(r, "request_id", None) for r in reqs] == ["bench-bbbb-0", "bench-bbbb-1", "bench-bbbb-2", None]
    assert prompt_sampler.reprefix(reqs, None, "x-")[0].request_id == "bench-bbbb-0"  # older vLLM: no prefix


def test_a_broken_prompt_worker_costs_time_not_the_sweep(
    fake_vllm: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(argv: list[str]) -> Any:
        raise MemoryError("worker out of memory")

    monkeypatch.setattr(sweep_client, "sampling_pool", lambda workers: ThreadPoolExecutor(max_workers=workers))
    monkeypatch.setattr(prompt_sampler, "sample", broken)
    spec = _spec(tmp_path)
    spec["points"], spec["prefetch_prompts"] = spec["points"][:2], True
    sweep_client.run(spec)
    # r0: 96 requests (the wave's 8 req/s x 10 s x 1.2) fell short at 12 req/s, again with 140; that resized r1 to
    # 12 x 10 x 1.15 = 138, 140 in whole waves of 4, whose prompts the (broken) worker was asked for again: the client
    # sampled them and said why
    (first,) = json.loads((tmp_path / "conc-4_r1.qv.json").read_text())["attempts"]
    assert first["prefetch_error"] == "MemoryError: worker out of memory" and "sampled_ahead_s" not in first
    assert (2, 140) in CALLS["sampled"] and first["num_prompts"] == 140 and (1_000_000, 4) in CALLS["sampled"]


def test_a_dead_worker_pool_costs_time_not_the_sweep(
    fake_vllm: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from concurrent.futures.process import BrokenProcessPool

    class DeadPool(ThreadPoolExecutor):
        """A pool whose worker process died after the calibration waves' prompts were asked for: every later
        submit raises, as a ProcessPoolExecutor does once a worker ended abruptly."""

        submits = 0

        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            DeadPool.submits += 1
            if DeadPool.submits > 2 + 1:  # 2 warm-ups + the one wave
                raise BrokenProcessPool("A child process terminated abruptly")
            return super().submit(fn, *args, **kwargs)

    monkeypatch.setattr(sweep_client, "sampling_pool", lambda workers: DeadPool(max_workers=workers))
    CALLS["rps_by_seed"].update({1: 9.0, 2: 9.0})  # 96 requests at 9 req/s: 10.7 s, no retry
    spec = _spec(tmp_path)
    spec["points"], spec["prefetch_prompts"] = spec["points"][:2], True
    sweep_client.run(spec)
    # both points measured, sized before the sweep (8 x 10 x 1.2 = 96), their prompts sampled by the client
    for r in (0, 1):
        (attempt,) = json.loads((tmp_path / f"conc-4_r{r}.qv.json").read_text())["attempts"]
        assert attempt["num_prompts"] == 96 and "sampled_ahead_s" not in attempt
    assert sorted(CALLS["sampled"]) == [(1, 96), (2, 96), (1_000_000, 4)]


def test_a_later_repeat_that_falls_short_samples_its_retry_itself(
    fake_vllm: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sweep_client, "sampling_pool", lambda workers: ThreadPoolExecutor(max_workers=workers))
    # r0 at 9 req/s: its 96 requests (8 x 10 x 1.2) last 10.7 s, one attempt; r1 at 20 req/s: 4.8 s < 10 s
    CALLS["rps_by_seed"].update({1: 9.0, 2: 20.0})
    spec = _spec(tmp_path)
    spec["points"], spec["prefetch_prompts"] = spec["points"][:2], True
    sweep_client.run(spec)
    a = json.loads((tmp_path / "conc-4_r1.qv.json").read_text())["attempts"]
    # first attempt: the worker's 96 prompts; again at 20 x 10 x 1.15 = 230, 232 in whole waves of 4, with the same
    # seed, sampled here
    assert [(x["num_prompts"], x["seed"], "sampled_ahead_s" in x) for x in a] == [(96, 2, True), (232, 2, False)]
    assert CALLS["sampled"].count((2, 232)) == 1 and CALLS["sampled"].count((2, 96)) == 1


class _LazyFuture(Future):  # type: ignore[type-arg]
    """A worker's result made only when the client asks for it: a request the workers have not reached yet."""

    def __init__(self, fn: Any, args: tuple[Any, ...]) -> None:
        super().__init__()
        self._fn, self._args = fn, args

    def result(self, timeout: float | None = None) -> Any:
        if not self.done() and self.set_running_or_notify_cancel():
            try:
                self.set_result(self._fn(*self._args))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, as a pool does
                self.set_exception(exc)
        return super().result(timeout)


class _QueuePool(Executor):
    """Records the order the client asks the workers for prompts (a worker takes requests in that order)."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, int]] = []

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future:  # type: ignore[type-arg]
        if fn is prompt_sampler.sample:
            argv = args[0]
            self.asked.append((int(argv[argv.index("--seed") + 1]), int(argv[argv.index("--num-prompts") + 1])))
        return _LazyFuture(fn, args)


def test_a_short_run_requeues_the_later_runs_behind_its_resized_repeats(
    fake_vllm: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = _QueuePool()
    monkeypatch.setattr(sweep_client, "sampling_pool", lambda workers: pool)
    CALLS["rps_by_seed"].update({4: 18.0, 5: 18.0})  # conc-8 at 18 req/s: 192 requests last 10.7 s, no retry
    spec = _spec(tmp_path)
    spec["points"], spec["prefetch_prompts"] = _closed(4, 3) + _closed(8, 2, seed0=4), True
    sweep_client.run(spec)
    # asked before the sweep: the two waves (warm-up seed), then every run at its planned size (conc-4: 8 req/s x 10 s
    # x 1.2 = 96, conc-8: 16 x 10 x 1.2 = 192). conc-4_r0 ran at 12 req/s, 8.0 s < 10 s: r1 and r2 resized to
    # 12 x 10 x 1.15 = 138, 140 in whole waves of 4, and asked for again, then conc-8's two runs behind them, in plan
    # order
    assert pool.asked == [
        (1_000_000, 4), (1_000_000, 8), (1, 96), (2, 96), (3, 96), (4, 192), (5, 192),
        (2, 140), (3, 140), (4, 192), (5, 192),
    ]  # fmt: skip
    side = {n: json.loads((tmp_path / f"{n}.qv.json").read_text()) for n in ("conc-4_r1", "conc-4_r2", "conc-8_r1")}
    assert side["conc-4_r1"]["warmup"]["resized_from_rps"] == 12.0 and side["conc-4_r2"]["num_prompts"] == 140
    assert "resized_from_rps" not in side["conc-8_r1"]["warmup"] and side["conc-8_r1"]["num_prompts"] == 192
    # every first attempt took the workers' prompts (the resized ones included); only r0's retry sampled here
    for n in ("conc-4_r1", "conc-4_r2", "conc-8_r1"):
        (attempt,) = side[n]["attempts"]
        assert "sampled_ahead_s" in attempt


class _StuckPool(Executor):
    """Workers that make the calibration wave's prompts, then hang: every measured run's request stays pending."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future:  # type: ignore[type-arg]
        if fn is prompt_sampler.sample and "1000000" in args[0]:  # the warm-up seed's wave
            return _LazyFuture(fn, args)
        return Future()


def test_stuck_workers_are_given_up_and_later_runs_say_why(
    fake_vllm: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sweep_client, "sampling_pool", lambda workers: _StuckPool())
    monkeypatch.setattr(sweep_client, "PREFETCH_WAIT_S", 0.2)
    CALLS["rps_by_seed"].update({1: 9.0, 2: 9.0})  # 96 requests at 9 req/s: 10.7 s, no retry
    spec = _spec(tmp_path)
    spec["points"], spec["prefetch_prompts"] = spec["points"][:2], True
    sweep_client.run(spec)
    # r0 waited 0.2 s for its prompts and gave the workers up; r1's request, cancelled then, is sampled by the
    # client too and names the give-up, not the cancellation it caused
    errors = [
        attempt.get("prefetch_error")
        for r in (0, 1)
        for attempt in json.loads((tmp_path / f"conc-4_r{r}.qv.json").read_text())["attempts"]
    ]
    assert errors == ["TimeoutError", "prompt workers given up after TimeoutError"]
    assert sorted(CALLS["sampled"]) == [(1, 96), (2, 96), (1_000_000, 4)]  # the wave's by the (stand-in) worker


def test_stop_pool_ends_a_worker_process_stuck_in_its_task() -> None:
    import time

    pool = sweep_client.sampling_pool(1)  # a real spawned worker process
    future = pool.submit(time.sleep, 60)
    deadline = time.monotonic() + 60
    while not future.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    procs = list(pool._processes.values())  # type: ignore[attr-defined]  # noqa: SLF001 - what stop_pool must end
    assert len(procs) == 1 and procs[0].is_alive()
    pid = procs[0].pid
    sweep_client.stop_pool(pool)
    procs[0].join(10)

    def running(pid: int) -> bool:  # from /proc, not is_alive(): a worker reaped by another waiter reads alive there
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return False
        return state not in ("Z", "X")  # a zombie has ended

    deadline = time.monotonic() + 10
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(pid)  # terminated, not left to finish its 60-s sleep


def test_a_point_record_appears_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the orchestrator parses <point>.qv.json the moment it exists; the client must never create that name
    # before its text is in it (a CI rehearsal read one empty): it writes <name>.part and renames it over
    written: list[str] = []
    real_write = Path.write_text

    def spy(self: Path, data: str, *args: Any, **kwargs: Any) -> int:
        written.append(self.name)
        return real_write(self, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", spy)
    target = tmp_path / "conc-16_r0.qv.json"
    sweep_client.publish(target, '{"seed": 7}')
    assert written == ["conc-16_r0.qv.json.part"]
    assert json.loads(target.read_text()) == {"seed": 7} and sorted(p.name for p in tmp_path.iterdir()) == [
        "conc-16_r0.qv.json"
    ]
