"""Builders of per-item data for the review tests: lm-eval sample rows with hashes, token-perplexity windows
(the per-window keys of ``accuracy.token_perplexity`` that the paired interval reads) and ``vllm bench serve
--save-detailed`` results."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def with_token_windows(rec: dict[str, Any], window_nll: list[float], window_n_tokens: list[int]) -> dict[str, Any]:
    """``rec`` with per-window token perplexity data: ``window_nll`` (summed NLL, nats, per window) and
    ``window_n_tokens`` (scored tokens per window), and the totals they imply
    (``token_perplexity = exp(sum(nll) / sum(tokens))``). Returns ``rec`` (changed in place)."""
    tp = rec["accuracy"].setdefault("token_perplexity", {})
    nll, tok = float(sum(window_nll)), int(sum(window_n_tokens))
    tp.update(
        token_perplexity=math.exp(nll / tok),
        nll_sum=nll,
        n_tokens=tok,
        n_windows=len(window_nll),
        window_nll=list(window_nll),
        window_n_tokens=list(window_n_tokens),
    )
    return rec


def mc_rows(
    values: list[int], *, doc_hashes: list[str] | None = None, prompt_hashes: list[str] | None = None
) -> list[dict[str, Any]]:
    """Multiple-choice rows as ``samples_<task>.jsonl`` holds them (``acc`` = ``acc_norm`` = value), with
    lm-eval's ``doc_hash`` / ``prompt_hash`` when given."""
    rows: list[dict[str, Any]] = []
    for i, v in enumerate(values):
        row: dict[str, Any] = {"doc_id": i, "acc": v, "acc_norm": v}
        if doc_hashes is not None:
            row["doc_hash"] = doc_hashes[i]
        if prompt_hashes is not None:
            row["prompt_hash"] = prompt_hashes[i]
        rows.append(row)
    return rows


def bench_result(
    requests: list[tuple[float, float, int] | None], *, duration_s: float, start_gap_s: float = 0.5
) -> dict[str, Any]:
    """A ``vllm bench serve --save-result --save-detailed`` result of hand-chosen requests.

    Args:
        requests: per request ``(ttft_s, e2e_s, output_tokens)``, or None for a failed request (vLLM logs it
            with 0 tokens, empty ITLs and an error string). The output tokens arrive evenly after the first:
            ``n - 1`` ITL gaps of ``(e2e - ttft) / (n - 1)``.
        duration_s: the benchmark duration (vLLM's ``duration``).
        start_gap_s: seconds between request sends.
    """
    ttfts, itls, lats, lens, starts, errors = [], [], [], [], [], []
    for i, r in enumerate(requests):
        starts.append(i * start_gap_s)
        if r is None:
            ttfts.append(0.0)
            itls.append([])
            lats.append(0.0)
            lens.append(0)
            errors.append("boom")
            continue
        ttft, e2e, n = r
        ttfts.append(ttft)
        itls.append([(e2e - ttft) / (n - 1)] * (n - 1) if n > 1 else [])
        lats.append(e2e)
        lens.append(n)
        errors.append("")
    done = sum(1 for r in requests if r is not None)
    return {
        "duration": duration_s,
        "completed": done,
        "failed": len(requests) - done,
        "request_throughput": done / duration_s,
        "ttfts": ttfts,
        "itls": itls,
        "latencies": lats,
        "output_lens": lens,
        "start_times": starts,
        "errors": errors,
    }


def write_bench_result(tmp: Path, name: str, result: dict[str, Any]) -> str:
    """Write ``result`` as ``<tmp>/<name>.json`` and return its path (what a sweep point's ``result_file`` holds)."""
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(result))
    return str(path)
