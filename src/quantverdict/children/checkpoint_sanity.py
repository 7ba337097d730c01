"""Sanity check of a quantized checkpoint against its source model (child, quantize environment).

Both models score the same fixed token windows (:data:`CHECK_PROMPTS`, tokenized by the checkpoint's
tokenizer); :func:`compare` reports whether every logit of the checkpoint is finite, the mean next-token NLL
of each, their token-perplexity ratio and the mean per-token KL(source || checkpoint) over the full
vocabulary. The verdict is :func:`quantverdict.measure.sanity.judge` with the bounds of
``quantize.sanity``. The quantize stage runs the same comparison on the checkpoint it has just made
(:mod:`quantverdict.children.quantize`); this child runs it on a cached checkpoint before it is reused
(:func:`quantverdict.orchestrate.caches.quantize`).

Cost, with the embedded SmolLM2-135M and its int8 checkpoint on two idle cores of an AMD EPYC (AVX2): 10.5 s
wall (1.1 s loading both models, 3.1 s decompressing the checkpoint at its first forward pass and scoring the
55 tokens twice, the rest starting the interpreter and importing torch, transformers and compressed-tensors),
more where other work shares the cores. A larger model costs about the time to read the source model and the
checkpoint from disk once more.

Spec (JSON): ``{"source_path": str, "checkpoint_path": str}``. Result: :func:`compare`'s keys plus
``load_s`` and ``score_s`` (seconds).

Imports only the standard library and the quantize environment's libraries (torch, transformers,
compressed-tensors through transformers), and :mod:`quantverdict.children.materialize` (same environment).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from quantverdict.children._child import child_main, progress
from quantverdict.children.materialize import model_class

# fixed prompts for the checks: finite logits, mean next-token NLL (nats) and KL divergence, source vs checkpoint
CHECK_PROMPTS = (
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Water boils at 100 degrees Celsius at sea level, but at higher altitudes it boils at a",
)


def load_model(path: Path, device: str, **kwargs: Any) -> Any:
    """The checkpoint at ``path`` in its own class (:func:`~quantverdict.children.materialize.model_class`
    of ``config.json``), on ``device``."""
    cls = model_class(json.loads((path / "config.json").read_text()).get("architectures"))
    if device != "cpu":
        kwargs["device_map"] = device
    return cls.from_pretrained(path, **kwargs)


def window_logprobs(model: Any, tokenizer: Any) -> list[tuple[Any, Any]]:
    """Per window of :data:`CHECK_PROMPTS`: (the ``T - 1`` target token ids, the ``[T - 1, vocab]`` float32
    next-token log-probabilities on CPU). A NaN or inf logit makes its row non-finite."""
    import torch

    device = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for prompt in CHECK_PROMPTS:
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"].to(device)
            logits = model(input_ids=ids).logits[0, :-1].float()
            out.append((ids[0, 1:].cpu(), torch.log_softmax(logits, dim=-1).cpu()))
    return out


def nll_of(windows: list[tuple[Any, Any]]) -> float:
    """Mean next-token NLL (nats/token) of :func:`window_logprobs`' windows."""
    total = sum(float(-lp.double().gather(1, t[:, None]).sum()) for t, lp in windows)
    return total / sum(int(t.numel()) for t, _ in windows)


def compare(source: list[tuple[Any, Any]], checkpoint: list[tuple[Any, Any]]) -> dict[str, Any]:
    """The checkpoint's windows against the source model's (both from :func:`window_logprobs`).

    Returns:
        ``{"finite": bool, "nll_source", "nll_checkpoint" (nats/token), "ppl_ratio" (exp of the NLL difference:
        token perplexity of the checkpoint over the source's), "mean_kld" (mean over tokens of
        sum_v p_source(v) (log p_source(v) - log p_checkpoint(v)), nats), "n_tokens"}``; non-finite values are
        reported as ``None`` (JSON has no NaN).

    Raises:
        ValueError: the windows differ in their target tokens or vocabulary size.
    """
    import torch

    finite = all(bool(torch.isfinite(lp).all()) for _, lp in checkpoint)
    kld_sum, n = 0.0, 0
    for (t_s, lp_s), (t_q, lp_q) in zip(source, checkpoint, strict=True):
        if not torch.equal(t_s, t_q) or lp_s.shape != lp_q.shape:
            raise ValueError("the source and the checkpoint were scored on different tokens or vocabularies")
        p, q = lp_s.double(), lp_q.double()
        kld_sum += float((p.exp() * (p - q)).sum())
        n += int(t_s.numel())
    nll_s, nll_q = nll_of(source), nll_of(checkpoint)
    ratio = float(torch.tensor(nll_q - nll_s, dtype=torch.float64).exp())

    def num(x: float) -> float | None:
        return round(x, 6) if x == x and abs(x) != float("inf") else None

    return {
        "finite": finite,
        "nll_source": num(nll_s),
        "nll_checkpoint": num(nll_q),
        "ppl_ratio": num(ratio),
        "mean_kld": num(kld_sum / n),
        "n_tokens": n,
    }


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Score the source model and the checkpoint on the check windows (see module doc)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from transformers import AutoTokenizer

    source_path, ckpt_path = Path(spec["source_path"]), Path(spec["checkpoint_path"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(ckpt_path)
    t0 = time.perf_counter()
    load_s = 0.0
    scored = []
    for path in (source_path, ckpt_path):  # one model in memory at a time
        t1 = time.perf_counter()
        model = load_model(path, device, dtype="auto")
        model.eval()
        load_s += time.perf_counter() - t1
        scored.append(window_logprobs(model, tokenizer))
        del model
    result = compare(*scored)
    progress(
        f"sanity check of {ckpt_path.name}: finite={result['finite']}, token perplexity ratio "
        f"{result['ppl_ratio']}, mean KLD {result['mean_kld']} nats over {result['n_tokens']} tokens"
    )
    return {**result, "load_s": round(load_s, 3), "score_s": round(time.perf_counter() - t0 - load_s, 3)}


if __name__ == "__main__":
    child_main(run)
