"""Checks of ``bench.dataset`` (the sweep's traffic) before any work: the keys of each kind, the user's JSONL file
line by line, the offline WikiText file, and the lengths that the config alone decides against the context.

A prompt's token count needs the model's tokenizer, which the orchestrator does not load: the prompts of a JSONL
file or of the WikiText paragraphs are checked against ``max_model_len`` in the sweep client before its start gate
(:mod:`quantverdict.children.workload_check`). No bound on tokens from characters is used here: a byte-level BPE
token spans at least one byte, so bytes bound the tokens from above, never from below (one token can span a whole
word or more), and a prompt cannot be shown too long without the vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

from quantverdict.children.offline_data import WIKITEXT_TEST
from quantverdict.config.schema import DATASET_KINDS, BenchConfig, Config, DatasetConfig

JSONL_FORMAT = '{"prompt": "...", "output_tokens": N} per line (output_tokens optional: on every line or on none)'
MAX_LINE_ERRORS = 5  # the first problems of a JSONL file named, the rest counted


def request_shape(bench: BenchConfig) -> str:
    """What each request of the sweep sends, in words, from ``bench`` and its ``dataset`` alone (no file read).

    ``random``: ``"256 in / 128 out tokens"``; ``text``: ``"WikiText-2 paragraphs of 16-256 words in / 128 out
    tokens"``; ``jsonl``: ``"the prompts of FILE in / their output_tokens, else 128 out tokens"``; ``shared_prefix``:
    ``"256 in (a 128-token prefix shared by each of 1 groups) / 128 out tokens"``. The lengths actually sent are
    recorded per point (``input_len_dist``, ``output_len_dist``).
    """
    ds, out = bench.dataset, f"{bench.output_len} out tokens"
    kind = str(ds.kind)
    if kind == "text":
        return f"WikiText-2 paragraphs of {ds.min_words}-{ds.max_words} words in / {out}"
    if kind == "jsonl":
        return f"the prompts of {Path(str(ds.path)).name} in / their output_tokens, else {out}"
    if kind == "shared_prefix":
        return (
            f"{bench.input_len} in (a {ds.prefix_len}-token prefix shared by each of {ds.num_prefixes} groups) / {out}"
        )
    return f"{bench.input_len} in / {out}"


def jsonl_line_problem(line: str) -> tuple[str | None, bool]:
    """The problem of one non-blank line of a prompts file, and whether it has ``output_tokens``.

    Returns:
        ``(problem, has_output_tokens)``: problem None for a line ``{"prompt": str, "output_tokens": int >= 1}``
        (``output_tokens`` optional); else why, e.g. ``"is not JSON (Expecting value)"``.
    """
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        return f"is not JSON ({exc.msg})", False
    if not isinstance(obj, dict):
        return f"is a JSON {type(obj).__name__}, not an object", False
    prompt = obj.get("prompt")
    if not isinstance(prompt, str):
        what = "has no" if "prompt" not in obj else f"has a {type(prompt).__name__} as"
        return f'{what} "prompt" string', False
    if not prompt.strip():
        return 'has an empty "prompt"', False
    if "output_tokens" not in obj:
        return None, False
    n = obj["output_tokens"]
    if isinstance(n, bool) or not isinstance(n, int):
        return f'has "output_tokens": {json.dumps(n)}, not an integer', True
    if n < 1:
        return f'has "output_tokens": {n}, not a positive integer', True
    return None, True


def jsonl_file_errors(path_value: str | None, max_model_len: int | None = None) -> list[str]:
    """Problems of ``bench.dataset.path`` for ``kind=jsonl``: absent, missing, empty, lines that are not prompts
    (their 1-based numbers), ``output_tokens`` on some lines only (vLLM's custom dataset reads the column for
    every line or for none), an ``output_tokens`` that leaves no room for a prompt token in ``max_model_len``.
    Reads the whole file.

    Returns:
        One message per problem, each naming ``bench.dataset.path``; [] for a usable file.
    """
    if not path_value:
        return [f"bench.dataset.kind=jsonl needs bench.dataset.path, a file of {JSONL_FORMAT}"]
    key = f"bench.dataset.path={path_value!r}"
    path = Path(path_value).expanduser()
    if not path.is_file():
        return [f"{key} does not exist (or is not a file); expected {JSONL_FORMAT}"]
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        return [f"{key} is not UTF-8 text ({exc.reason} at byte {exc.start})"]
    lines = [(i, line) for i, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not lines:
        return [f"{key} is empty ({'0 bytes' if not text else 'only whitespace'}); expected {JSONL_FORMAT}"]
    bad: list[str] = []
    with_out: list[int] = []
    longest = (0, 0)  # (output_tokens, line)
    for i, line in lines:
        problem, has_out = jsonl_line_problem(line)
        if problem:
            bad.append(f"line {i} {problem}")
        elif has_out:
            with_out.append(i)
            longest = max(longest, (int(json.loads(line)["output_tokens"]), -i))
    errors = []
    if max_model_len is not None and longest[0] >= max_model_len:
        errors.append(
            f'{key}: line {-longest[1]} asks for "output_tokens": {longest[0]}, which leaves no room for its prompt '
            f"in the server's max_model_len {max_model_len} (bench.server.max_model_len or model.max_model_len)"
        )
    if bad:
        more = f" (and {len(bad) - MAX_LINE_ERRORS} more lines)" if len(bad) > MAX_LINE_ERRORS else ""
        errors.append(f"{key}: {'; '.join(bad[:MAX_LINE_ERRORS])}{more}; expected {JSONL_FORMAT}")
    elif with_out and len(with_out) < len(lines):
        missing = next(i for i, _ in lines if i not in set(with_out))
        errors.append(
            f'{key}: "output_tokens" is on {len(with_out)} of {len(lines)} prompt lines (line {missing} lacks it); '
            "give it on every line, or on none (then every request generates bench.output_len tokens)"
        )
    return errors


def dataset_errors(cfg: Config) -> list[str]:
    """Problems of ``bench.dataset`` (one message each, naming the key and what is allowed), when the job sweeps.

    ``kind`` one of :data:`~quantverdict.config.schema.DATASET_KINDS`; ``jsonl``: :func:`jsonl_file_errors`;
    ``text``: ``1 <= min_words <= max_words``, the offline file present when ``data.offline_root`` is set (without
    it the hub's copy is read: :func:`quantverdict.orchestrate.data_access.hub_needs`); ``shared_prefix``:
    ``1 <= prefix_len < bench.input_len`` (a request has at least one token of its own) and ``num_prefixes >= 1``.
    ``random`` and ``shared_prefix`` prompts are ``bench.input_len`` tokens, checked against the context with the
    other bench lengths (:func:`quantverdict.config.validate.validate`).
    """
    if not cfg.bench.enabled:
        return []
    ds: DatasetConfig = cfg.bench.dataset
    kind = str(ds.kind)
    if kind not in DATASET_KINDS:
        return [f"bench.dataset.kind={kind!r} is not allowed; allowed: {', '.join(DATASET_KINDS)}"]
    max_len = cfg.bench.server.max_model_len or cfg.model.max_model_len
    if kind == "jsonl":
        return jsonl_file_errors(ds.path, max_len)
    errors = []
    if ds.path and kind != "jsonl":
        errors.append(f"bench.dataset.path is read only with bench.dataset.kind=jsonl (kind={kind}); remove it")
    if kind == "text":
        if cfg.bench.output_len >= max_len:
            errors.append(
                f"bench.output_len={cfg.bench.output_len} leaves no room for a paragraph in the server's max_model_len "
                f"{max_len}; lower it or raise model.max_model_len"
            )
        if ds.min_words < 1 or ds.max_words < ds.min_words:
            errors.append(
                f"bench.dataset.min_words={ds.min_words} and max_words={ds.max_words} must satisfy "
                "1 <= min_words <= max_words (paragraph lengths in words)"
            )
        root = cfg.data.offline_root
        if root and str(root).strip() and Path(root).is_dir() and not (Path(root) / WIKITEXT_TEST).is_file():
            errors.append(
                f"bench.dataset.kind=text reads {WIKITEXT_TEST} under data.offline_root={root!r}, which has no such "
                "file; add it (see the data folder's SOURCES.md) or set data.offline_root=null to read the hub's copy"
            )
    if kind == "shared_prefix":
        if not 1 <= ds.prefix_len < cfg.bench.input_len:
            errors.append(
                f"bench.dataset.prefix_len={ds.prefix_len} must be in 1..bench.input_len - 1 "
                f"(bench.input_len={cfg.bench.input_len}: every request keeps at least one token of its own)"
            )
        if ds.num_prefixes < 1:
            errors.append(f"bench.dataset.num_prefixes={ds.num_prefixes} must be >= 1")
    return errors
