"""The dataset part of a ``vllm bench serve`` command line for ``bench.dataset``, and the check of a prompts file's
token counts against the server's context, made by the sweep client before its start gate.

``vllm bench serve`` flags (vLLM's ``vllm/benchmarks/datasets/datasets.py``, ``add_dataset_parser``; the same in
vLLM 0.26 and 0.32): ``random`` ``--dataset-name random --random-input-len --random-output-len``; ``jsonl`` and
``text`` ``--dataset-name custom --dataset-path --skip-chat-template --custom-output-len`` (-1: each line's
``output_tokens``); ``shared_prefix`` ``--dataset-name prefix_repetition --prefix-repetition-prefix-len
--prefix-repetition-suffix-len --prefix-repetition-num-prefixes --prefix-repetition-output-len``.

vLLM's custom dataset counts a prompt as ``len(tokenizer(prompt).input_ids)`` (special tokens the tokenizer adds
included, no chat template with ``--skip-chat-template``); :func:`prompt_length_problem` counts the same way, so a
file whose longest prompt and its output do not fit ``max_model_len`` fails the job before any measured point
(the server would answer those requests with an error, counted as failed). Standard library at import; the
tokenizer is ``transformers``' (the serve environment's).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

FILE_KINDS = ("jsonl", "text")


def dataset_args(dataset: dict[str, Any] | None, input_len: int, output_len: int) -> list[str]:
    """The dataset flags of a ``vllm bench serve`` command line.

    Args:
        dataset: the spec's ``dataset`` (:func:`quantverdict.serving.workload.client_dataset`): ``kind``, and
            ``path``/``output_tokens_from_file`` or ``prefix_len``/``num_prefixes``; None: ``random``.
        input_len: ``bench.input_len`` (random; shared_prefix: prefix + suffix).
        output_len: ``bench.output_len``.
    """
    ds = dataset or {"kind": "random"}
    kind = ds["kind"]
    if kind in FILE_KINDS:
        out = "-1" if ds.get("output_tokens_from_file") else str(output_len)
        return ["--dataset-name", "custom", "--dataset-path", str(ds["path"]), "--skip-chat-template"] + [
            "--custom-output-len",
            out,
        ]
    if kind == "shared_prefix":
        prefix = int(ds["prefix_len"])
        return [
            "--dataset-name",
            "prefix_repetition",
            "--prefix-repetition-prefix-len",
            str(prefix),
            "--prefix-repetition-suffix-len",
            str(input_len - prefix),
            "--prefix-repetition-num-prefixes",
            str(int(ds["num_prefixes"])),
            "--prefix-repetition-output-len",
            str(output_len),
        ]
    return ["--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len", str(output_len)]


def requests_to_send(dataset: dict[str, Any] | None, n: int) -> int:
    """``--num-prompts`` for ``n`` requests: vLLM's prefix-repetition dataset makes ``num_prefixes x (n //
    num_prefixes)`` prompts, so a shared-prefix run is rounded up to whole groups (e.g. 10 with 4 prefixes: 12);
    ``n`` for the other kinds."""
    if dataset and dataset.get("kind") == "shared_prefix":
        groups = max(1, int(dataset["num_prefixes"]))
        return int(math.ceil(n / groups)) * groups
    return n


def read_prompts(path: Path) -> list[tuple[int, str, int | None]]:
    """``(line number, prompt, output_tokens or None)`` of each non-blank line of a prompts file (validated by
    the orchestrator: :func:`quantverdict.config.workload.jsonl_file_errors`)."""
    out = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            obj = json.loads(line)
            n = obj.get("output_tokens")
            out.append((i, str(obj["prompt"]), int(n) if n is not None else None))
    return out


def prompt_length_problem(
    prompts: list[tuple[int, str, int | None]],
    prompt_tokens: list[int],
    output_len: int,
    max_model_len: int,
    path: str,
) -> str | None:
    """Why the longest request of a prompts file does not fit the context, or None when every one fits.

    Args:
        prompts: :func:`read_prompts`' lines.
        prompt_tokens: each prompt's token count (vLLM's count: ``len(tokenizer(prompt).input_ids)``).
        output_len: the tokens each request generates where its line gives no ``output_tokens``.
        max_model_len: the server's context (prompt + output tokens of one request).
        path: the file, for the message.

    E.g. lines of 100 and 900 prompt tokens, 128 out, context 1024: 900 + 128 = 1028 > 1024, line 2 named.
    """
    worst: tuple[int, int, int, int] | None = None  # (total, line, prompt tokens, output tokens)
    for (line, _, out), n in zip(prompts, prompt_tokens, strict=True):
        total = n + (out if out is not None else output_len)
        if worst is None or total > worst[0]:
            worst = (total, line, n, total - n)
    if worst is None or worst[0] <= max_model_len:
        return None
    over = sum(
        1 for (_, _, out), n in zip(prompts, prompt_tokens, strict=True) if n + (out or output_len) > max_model_len
    )
    return (
        f"bench.dataset: {over} of {len(prompts)} prompts of {path} do not fit the server's max_model_len "
        f"{max_model_len} (prompt + output tokens); the longest is line {worst[1]}: {worst[2]} prompt tokens + "
        f"{worst[3]} output tokens = {worst[0]}. Shorten or drop those lines (kind=text: lower "
        "bench.dataset.max_words), lower their output, or raise model.max_model_len"
    )


def check_prompt_lengths(spec: dict[str, Any]) -> int | None:
    """Count the prompts file's tokens with the checkpoint's tokenizer (``spec["tokenizer"]``) and raise when a
    request does not fit ``spec["max_model_len"]``; nothing for ``random``/``shared_prefix``, whose lengths the
    config decides (checked before the job).

    Returns:
        The longest prompt in tokens, or None where nothing was counted.

    Raises:
        ValueError: :func:`prompt_length_problem`'s message.
    """
    ds = spec.get("dataset") or {}
    if ds.get("kind") not in FILE_KINDS or not spec.get("max_model_len"):
        return None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(spec["tokenizer"])
    prompts = read_prompts(Path(ds["path"]))
    counts = [len(ids) for ids in tokenizer([p for _, p, _ in prompts])["input_ids"]]
    problem = prompt_length_problem(prompts, counts, int(spec["output_len"]), int(spec["max_model_len"]), ds["path"])
    if problem:
        raise ValueError(problem)
    return max(counts, default=0)
