"""A cross-model grid on CPU: the embedded model (real accuracy) and a tiny synthetic Llama (memory and speed),
bf16 and W8A8 each, reviewed for an A10G target. The grid's own review names one candidate across models. The
embedded model's accuracy is one task of 4 items (measured, so that the comparison across models has an accuracy on
one side only) and 512 tokens of token perplexity (its KL divergence): the review reads no more of it.

Expected by hand:

* every job ran on this CPU, so memory is computed for the A10G and the review says the jobs ran elsewhere;
  no vLLM GPU log: weights are the checkpoint's bytes and the reserve is review.reserved_gib (0);
* SmolLM2-135M bf16 on the A10G: KV = 22.48828125 x 0.9 GiB - checkpoint bytes; 2 x 30 layers x 3 KV heads x
  64 x 2 B = 23,040 B/token, so floor(KV bytes / 23,040) tokens, / 2,048 (max_model_len) requests;
* the bigger model quantized (SmolLM2 W8A8) against the smaller unquantized (tiny Llama bf16: 256 hidden, 2
  layers, a few MB) loses on memory (fewer concurrent requests) and is compared on accuracy only where both
  measured it (the tiny model has random weights: not compared);
* accuracy is not measured on every candidate, so the ranking is on the ceiling output tok/s, and the 2-layer
  model is far faster than the 30-layer one on the same CPU: a tiny-llama-shape candidate is named.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from clihelp import TINY, run_cli
from quantverdict.results.record import find_records, load

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_cross_model_grid_names_a_candidate(tmp_path: Path, stage_envs: dict, embedded_model: dict) -> None:
    tiny = [o for o in TINY if not o.startswith("bench.server.port")]
    proc = run_cli(
        tmp_path,
        "model=smollm2-135m,tiny-llama-shape",
        "scheme=bf16,w8a8",
        "review.target=a10g",
        *tiny,
        "eval.tasks=[arc_easy]",
        "eval.batch_invariance_check=false",
        "bench.server.port=8807",  # apart from the other integration tests' servers (test_eval_server: 8795)
        multirun=True,
        timeout=2400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    records = {(r["job"]["model"], r["job"]["scheme"]): r for r in map(load, find_records(tmp_path / "multirun"))}
    assert set(records) == {(m, s) for m in ("smollm2-135m", "tiny-llama-shape") for s in ("bf16", "w8a8")}
    assert all(r["status"] == "ok" for r in records.values()), [r.get("error") for r in records.values()]
    (grid,) = (tmp_path / "multirun").iterdir()
    md = (grid / "review" / "review.md").read_text()
    assert "## Across models on NVIDIA A10G" in md
    assert "not for where the jobs ran (CPU:" in md
    m = re.search(r"Across models, on NVIDIA A10G: deploy \*\*(\S+) (\S+) \(", md)
    assert m is not None, md[:3000]
    assert m.group(1) == "tiny-llama-shape"
    assert "Decided on memory and speed alone" in md
    # SmolLM2 bf16's KV tokens on the A10G, from its checkpoint bytes
    ck = records[("smollm2-135m", "bf16")]["memory"]["checkpoint"]["total_weight_bytes"]
    kv_bytes = 22.48828125 * 2**30 * 0.9 - ck
    tokens = math.floor(kv_bytes / 23_040)
    row = (
        f"| smollm2-135m bf16 (BF16) | {ck / 2**30:.2f} (checkpoint bytes) | 0.00 (review.reserved_gib) | "
        f"{kv_bytes / 2**30:.2f} | {tokens:,} | {tokens / 2048:.1f} x 2,048 tokens | yes |"
    )
    assert row in md
    line = next(
        ln for ln in md.splitlines() if ln.startswith("- smollm2-135m w8a8 (W8A8) vs tiny-llama-shape bf16 (BF16):")
    )
    assert "memory: tiny-llama-shape" in line and "accuracy: not compared" in line
    assert "### Decode step: TPOT = fixed + per-sequence cost" in md
