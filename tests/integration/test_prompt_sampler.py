"""The prompts the sweep client's worker processes make (bench.prefetch_prompts) are the ones vLLM's benchmark
client samples itself: the same text, lengths and request ids, for a seed and size whose prompts vLLM pads after
re-tokenizing. No server: vLLM's sampling is stopped right after it sampled.

Set QV_SERVE_PYTHON (serve interpreter) and QV_EMBEDDED_MODEL (bf16 checkpoint directory) to skip building the stage
environment / materializing the model through the shared fixtures.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from quantverdict.processes.envs import StageEnv

pytestmark = pytest.mark.integration


SAME_PROMPTS = """
import asyncio, json, sys
from concurrent.futures import ProcessPoolExecutor
import multiprocessing
from quantverdict.children import prompt_sampler
from quantverdict.children.vllm_cli import bench_parser, install_alias
install_alias()
from vllm.benchmarks import serve as vbench
argv = json.loads(sys.argv[1])
ns = bench_parser(vbench)[0].parse_args(argv)
# what main_async itself samples (its own tokenizer and argument handling), stopped right after sampling
class Sampled(Exception):
    pass
made = {}
vllm_get_samples = vbench.get_samples
def grab(args, tokenizer):
    made["reqs"] = vllm_get_samples(args, tokenizer)
    raise Sampled
vbench.get_samples = grab
try:
    asyncio.run(vbench.main_async(ns))
except Sampled:
    pass
here = made["reqs"]
with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
    there, prefix, _ = pool.submit(prompt_sampler.sample, argv).result()
there = prompt_sampler.reprefix(there, prefix, ns.request_id_prefix)
fields = lambda r: (r.prompt, r.prompt_len, r.expected_output_len, r.request_id)
print(json.dumps({"n": len(here), "same": [fields(a) == fields(b) for a, b in zip(here, there)],
                  "n_there": len(there), "prefixes_differ": prefix != ns.request_id_prefix}))
"""


def test_prompts_made_by_the_worker_are_the_ones_vllm_samples(serve_env: StageEnv, model_path: str) -> None:
    # a seed and size whose prompts vLLM pads after re-tokenizing (random tail tokens from its generator)
    argv = ["--backend", "vllm", "--base-url", "http://127.0.0.1:1", "--model", "m", "--tokenizer", model_path]
    argv += ["--dataset-name", "random", "--random-input-len", "256", "--random-output-len", "16"]
    argv += ["--num-prompts", "300", "--seed", "10", "--ignore-eos"]
    res = subprocess.run(
        [serve_env.python, "-c", SAME_PROMPTS, json.dumps(argv)],
        env={**os.environ, **serve_env.env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["n"] == out["n_there"] == 300 and all(out["same"])
    assert out["prefixes_differ"]  # vLLM draws a request-id prefix per parse: the worker's was swapped for ours
