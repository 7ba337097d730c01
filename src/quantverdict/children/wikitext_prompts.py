"""The built-in text workload (``bench.dataset.kind=text``): WikiText-2 test paragraphs as a prompts file of vLLM's
custom dataset (one ``{"prompt": ...}`` per line).

A paragraph is a line of the raw text that is neither blank nor a heading (`` = Title = ``, `` = = Section = = ``),
stripped of its surrounding spaces; it is kept when its length in whitespace-separated words lies in
``[min_words, max_words]`` (words, not tokens: the orchestrator that writes the file has no tokenizer; the sweep
client counts the tokens against ``max_model_len`` before the sweep), in the order of the text. The file is a
function of the text and the two bounds only; vLLM's custom dataset shuffles it with each point's seed.

:func:`build` is called by the orchestrator on the offline file (``data.offline_root``/wikitext-2-raw/wiki.test.raw).
As a child (``python -m quantverdict.children.wikitext_prompts SPEC RESULT``, in the serve environment, which has
``datasets``) it reads the hub's ``wikitext``/``wikitext-2-raw-v1`` test split and writes the same file. Standard
library only at import.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from quantverdict.children._child import child_main
from quantverdict.children.offline_data import _is_heading

HUB_SOURCE = "hub: wikitext / wikitext-2-raw-v1, split test"


def paragraphs(lines: Iterable[str], min_words: int, max_words: int) -> list[str]:
    """The paragraphs of WikiText raw ``lines`` whose word count is in ``[min_words, max_words]``, in order.

    E.g. ``[" = T = ", " a b c ", "", " d e "]`` with bounds 2..3: ``["a b c", "d e"]``; with 3..3: ``["a b c"]``.
    """
    out = []
    for line in lines:
        text = line.strip()
        if not text or _is_heading(line):
            continue
        if min_words <= len(text.split()) <= max_words:
            out.append(text)
    return out


def prompts_jsonl(texts: Iterable[str]) -> str:
    """One ``{"prompt": text}`` JSON line per text (vLLM's custom dataset), each ending in a newline."""
    return "".join(json.dumps({"prompt": t}, ensure_ascii=False) + "\n" for t in texts)


def build(lines: Iterable[str], min_words: int, max_words: int, out: Path) -> int:
    """Write the prompts file of :func:`paragraphs` to ``out``; return the number of prompts.

    Raises:
        ValueError: no paragraph has ``min_words``..``max_words`` words.
    """
    texts = paragraphs(lines, min_words, max_words)
    if not texts:
        raise ValueError(
            f"no WikiText paragraph has bench.dataset.min_words={min_words}..max_words={max_words} words; widen them"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(prompts_jsonl(texts), encoding="utf-8")
    return len(texts)


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Spec keys ``out``, ``min_words``, ``max_words``: the hub's WikiText-2 test rows into the prompts file.

    Returns:
        ``{"prompts": int, "source": str}``.
    """
    import datasets

    rows = datasets.load_dataset("wikitext", "wikitext-2-raw-v1", split="test")["text"]
    n = build(rows, int(spec["min_words"]), int(spec["max_words"]), Path(spec["out"]))
    return {"prompts": n, "source": HUB_SOURCE}


if __name__ == "__main__":
    child_main(run)
