"""The sweep's traffic (``bench.dataset``) on the orchestrator's side: the prompts file a kind reads, written or
checked before the server starts, what the record says of it (``speed.workload``), and the dataset part of the
sweep client's spec.

* ``random``: vLLM's random dataset, ``bench.input_len`` tokens in, ``bench.output_len`` out (no file);
* ``jsonl``: the user's file (``bench.dataset.path``), read in place; its sha256 and line count recorded;
* ``text``: WikiText-2 test paragraphs written to ``<bench folder>/``:data:`TEXT_FILE` by
  :func:`quantverdict.children.wikitext_prompts.build`, from ``data.offline_root`` or, without it, the hub (a child in
  the serve environment); never into the checkout;
* ``shared_prefix``: vLLM's prefix-repetition dataset (no file).

Files are sent through vLLM's custom dataset (``--dataset-name custom``) without a chat template
(``--skip-chat-template``): the prompts reach ``/v1/completions`` as written.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from quantverdict.children import wikitext_prompts
from quantverdict.children.offline_data import WIKITEXT_TEST, read_wikitext_lines
from quantverdict.config.schema import BenchConfig, Config
from quantverdict.processes.envs import StageEnv
from quantverdict.processes.runner import run_stage
from quantverdict.results.record import Workload
from quantverdict.results.stage_results import WikitextPromptsResult

log = logging.getLogger(__name__)

TEXT_FILE = "workload.jsonl"  # the text workload's prompts, in the job's bench folder
TEXT_FETCH_TIMEOUT_S = 900.0


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def prompts_file(bench_cfg: BenchConfig, bench_dir: Path) -> Path | None:
    """The prompts file the sweep client reads for ``bench.dataset``: the user's (absolute) for ``jsonl``,
    ``bench_dir/``:data:`TEXT_FILE` for ``text``; None for the kinds vLLM makes up (``random``,
    ``shared_prefix``)."""
    ds = bench_cfg.dataset
    if ds.kind == "jsonl" and ds.path:
        return Path(ds.path).expanduser().resolve()
    if ds.kind == "text":
        return bench_dir.resolve() / TEXT_FILE
    return None


def output_tokens_from_file(path: Path) -> bool:
    """Whether a prompts file gives ``output_tokens`` (config validation made it every line or none, so the first
    prompt line says)."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                return "output_tokens" in json.loads(line)
    return False


def client_dataset(bench_cfg: BenchConfig, bench_dir: Path) -> dict[str, Any]:
    """The ``dataset`` key of the sweep client's spec: ``kind``; ``path`` of the prompts file and
    ``output_tokens_from_file`` (``jsonl``, ``text``); ``prefix_len``, ``num_prefixes`` (``shared_prefix``)."""
    ds = bench_cfg.dataset
    out: dict[str, Any] = {"kind": str(ds.kind)}
    path = prompts_file(bench_cfg, bench_dir)
    if path is not None:
        out["path"] = str(path)
        out["output_tokens_from_file"] = ds.kind == "jsonl" and path.is_file() and output_tokens_from_file(path)
    if ds.kind == "shared_prefix":
        out |= {"prefix_len": ds.prefix_len, "num_prefixes": ds.num_prefixes}
    return out


def prepare(cfg: Config, bench_dir: Path, env: StageEnv) -> Workload:
    """Write the prompts file ``bench.dataset`` needs (``text``) and describe the workload for the record.

    Args:
        cfg: the job's config (``bench.dataset``, ``bench.input_len``/``output_len``, ``data.offline_root``).
        bench_dir: the job's bench folder (the text workload's file goes there).
        env: the serve environment (reads the hub's WikiText without ``data.offline_root``).

    Returns:
        ``speed.workload``: ``kind``, and per kind ``source``, ``file``, ``sha256``, ``prompts``,
        ``output_tokens_from_file``, the word bounds, ``prefix_len``/``num_prefixes``.

    Raises:
        ValueError: no WikiText paragraph within the word bounds.
        quantverdict.processes.runner.StageError: the hub's WikiText could not be read.
    """
    ds = cfg.bench.dataset
    kind = str(ds.kind)
    if kind == "random":
        return Workload(kind=kind, input_len=cfg.bench.input_len, output_len=cfg.bench.output_len)
    if kind == "shared_prefix":
        return Workload(
            kind=kind,
            input_len=cfg.bench.input_len,
            output_len=cfg.bench.output_len,
            prefix_len=ds.prefix_len,
            num_prefixes=ds.num_prefixes,
        )
    path = prompts_file(cfg.bench, bench_dir)
    assert path is not None
    if kind == "jsonl":
        from_file = output_tokens_from_file(path)
        prompts = sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
        return Workload(
            kind=kind,
            source=str(path),
            file=str(path),
            sha256=sha256_of(path),
            prompts=prompts,
            output_tokens_from_file=from_file,
            output_len=None if from_file else cfg.bench.output_len,
        )
    root = cfg.data.offline_root
    if root:
        source = str(Path(root) / WIKITEXT_TEST)
        prompts = wikitext_prompts.build(read_wikitext_lines(Path(source)), ds.min_words, ds.max_words, path)
    else:
        spec = {"out": str(path), "min_words": ds.min_words, "max_words": ds.max_words}
        res = run_stage(env, "wikitext_prompts", spec, bench_dir, WikitextPromptsResult, TEXT_FETCH_TIMEOUT_S)
        source, prompts = res.source, res.prompts
    log.info("text workload: %d WikiText paragraphs of %d..%d words in %s", prompts, ds.min_words, ds.max_words, path)
    return Workload(
        kind=kind,
        source=source,
        file=str(path),
        sha256=sha256_of(path),
        prompts=prompts,
        output_tokens_from_file=False,
        output_len=cfg.bench.output_len,
        min_words=ds.min_words,
        max_words=ds.max_words,
    )
