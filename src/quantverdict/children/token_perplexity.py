"""Token perplexity of a checkpoint on the WikiText-2 test text (child, serve environment).

Two implementations over the same text, tokenization and windows (:func:`quantverdict.measure.perplexity.window_plan`):
:func:`token_perplexity`, a transformers forward pass per window (eval.backend hf and vllm), and
:func:`server_token_perplexity`, the echoed prompt log-probabilities of the job's vLLM server
(eval.backend=server, :mod:`quantverdict.children.served_logprobs`). Imports torch and transformers
inside the functions that use them; everything else is the standard library and stdlib-only project
modules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from quantverdict.children._child import progress
from quantverdict.children.kld_baseline import KldRun, open_run
from quantverdict.children.offline_data import WIKITEXT_TEST, read_wikitext_lines, wikitext_hf_rows
from quantverdict.children.served_logprobs import (
    SERVER_TIMEOUT_S,
    completions_url,
    prompt_logprobs,
    prompt_logprobs_topk,
    window_nll,
)
from quantverdict.measure.perplexity import perplexities, scored_slices, window_plan

TOKEN_PPL_TEXT = "WikiText-2 raw v1 test rows joined with '\\n\\n' (GPTQ), no special tokens added"


def wikitext_test_text(offline_root: str | None) -> str:
    """The WikiText-2 raw v1 test rows joined with ``"\\n\\n"`` (:data:`TOKEN_PPL_TEXT`): from the offline
    data folder when one is given, else from the Hugging Face hub (``datasets``)."""
    if offline_root:
        rows = wikitext_hf_rows(read_wikitext_lines(Path(offline_root) / WIKITEXT_TEST))
    else:
        import datasets

        rows = datasets.load_dataset("wikitext", "wikitext-2-raw-v1", split="test")["text"]
    return "\n\n".join(rows)


def _score_windows(
    plan: list[tuple[int, int, int]], nll: Callable[[tuple[int, int, int]], float], workers: int = 1
) -> tuple[float, int, list[float]]:
    """Summed negative log-likelihood (nats), number of scored tokens, and each window's NLL over ``plan``.

    ``nll(window)`` scores one ``(begin, end, n_scored)`` window; with ``workers > 1`` windows are scored
    by a thread pool (requests to a server), but always summed in plan order, so the sum does not depend
    on which window finished first. The third value lists the windows' NLLs (nats) in plan order.
    """
    pool = ThreadPoolExecutor(max_workers=workers) if workers > 1 else None
    results: Iterable[float] = pool.map(nll, plan) if pool else map(nll, plan)
    nll_sum, n_scored_total = 0.0, 0
    per_window: list[float] = []
    try:
        for i, (window, value) in enumerate(zip(plan, results)):
            nll_sum += value
            n_scored_total += window[2]
            per_window.append(float(value))
            if (i + 1) % 4 == 0 or i + 1 == len(plan):
                progress(f"token perplexity: window {i + 1}/{len(plan)}, {n_scored_total} tokens scored")
    finally:
        if pool:
            pool.shutdown(wait=True, cancel_futures=True)
    return nll_sum, n_scored_total, per_window


def _token_ppl_summary(
    nll_sum: float, n_scored: int, plan: list[tuple[int, int, int]], n_text_tokens: int, per_window: list[float]
) -> dict[str, Any]:
    """The token-perplexity result: totals plus ``window_nll`` (nats) and ``window_n_tokens`` in window order."""
    if len(per_window) != len(plan):
        raise ValueError(f"{len(per_window)} window NLLs for {len(plan)} windows")
    return {
        "token_perplexity": perplexities(nll_sum, n_tokens=n_scored)["token_perplexity"],
        "nll_sum": nll_sum,
        "n_tokens": n_scored,
        "n_windows": len(plan),
        "n_text_tokens": n_text_tokens,
        "window_nll": per_window,
        "window_n_tokens": [int(w[2]) for w in plan],
    }


def token_perplexity(
    model: Any,
    tokenizer: Any,
    text: str,
    seq_len: int,
    stride: int,
    max_tokens: int | None,
    kld: dict[str, Any] | None = None,
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
        kld: ``spec["kld"]`` (:mod:`quantverdict.children.kld_baseline`): also store (baseline) or compare
            (scheme) the next-token distributions of the same windows; None: perplexity only.

    Returns:
        ``{"token_perplexity", "nll_sum" (nats), "n_tokens" (scored), "n_windows", "n_text_tokens",
        "window_nll" (list[float], summed NLL in nats per window, in window order),
        "window_n_tokens" (list[int], scored tokens per window)}``, plus ``"kld"`` (the record's
        ``accuracy.kld``, :meth:`KldRun.finish`) when ``kld`` is given.
    """
    import torch
    import torch.nn.functional as F

    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    n_text_tokens = int(ids.numel())
    if max_tokens is not None:
        ids = ids[:max_tokens]
    plan = window_plan(int(ids.numel()), seq_len, stride)
    device = next(model.parameters()).device
    run = open_run(kld, ids.tolist(), plan)
    index = {w: i for i, w in enumerate(plan)}

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
        if run is not None and run.active:  # the full vocabulary's log-probabilities, float32
            run.hf_window(index[window_plan_entry], F.log_softmax(pred, dim=-1).cpu().numpy(), target.cpu().numpy())
        return float(F.cross_entropy(pred, target, reduction="sum").double())

    with torch.inference_mode():
        nll_sum, n_scored_total, per_window = _score_windows(plan, nll)
    return _with_kld(_token_ppl_summary(nll_sum, n_scored_total, plan, n_text_tokens, per_window), run, len(plan))


def _with_kld(result: dict[str, Any], run: KldRun | None, n_windows: int) -> dict[str, Any]:
    if run is None:
        return result
    kld = run.finish(n_windows)
    if "refused" in kld:
        progress(f"KL divergence refused: {kld['refused']}")
    elif run.role == "baseline":
        progress(f"KL divergence: stored the baseline's top-{run.top_k} distributions in {kld['entry']}")
    else:
        progress(
            f"KL divergence: mean {kld['mean_kld']:.5f} nats, top-1 agreement {kld['top1_agreement_pct']:.2f} % "
            f"over {kld['n_tokens']} tokens"
        )
    return {**result, "kld": kld}


def server_token_perplexity(
    tokenizer: Any,
    text: str,
    seq_len: int,
    stride: int,
    max_tokens: int | None,
    server: dict[str, Any],
    workers: int,
    kld: dict[str, Any] | None = None,
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
        kld: as in :func:`token_perplexity`; the server answers each window's top-``kld["top_k"]``
            log-probabilities in the same request (``prompt_logprobs``).

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
    run = open_run(kld, ids, plan)
    index = {w: i for i, w in enumerate(plan)}

    def nll(window_plan_entry: tuple[int, int, int]) -> float:
        begin, end, n_scored = window_plan_entry
        if run is None or not run.active:
            return window_nll(prompt_logprobs(url, model, ids[begin:end], SERVER_TIMEOUT_S), begin, end, n_scored)
        token_lps, tops = prompt_logprobs_topk(url, model, ids[begin:end], run.top_k, SERVER_TIMEOUT_S)
        _, targets = scored_slices(begin, end, n_scored)
        run.topk_window(index[window_plan_entry], tops[targets], token_lps[targets])  # type: ignore[arg-type]
        return window_nll(token_lps, begin, end, n_scored)

    nll_sum, n_scored_total, per_window = _score_windows(plan, nll, workers)
    return _with_kld(_token_ppl_summary(nll_sum, n_scored_total, plan, n_text_tokens, per_window), run, len(plan))
