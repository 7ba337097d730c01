"""Pure checks of the evaluate stage (the stage itself runs lm-eval in the serve environment)."""

from __future__ import annotations

import pytest

from quantverdict.children import batch_invariance, lmeval_adapter


def test_batch_invariance_judged_at_float32() -> None:
    # the same 3 requests at batch size 1 and 3: largest |difference| = |-7.25 - (-7.2502)| = 2e-4 > 1e-4
    bs1, bs3 = [-3.5, -12.0, -7.25], [-3.50001, -12.00003, -7.2502]
    out = batch_invariance.compare_loglikelihoods(bs1, bs3, "float32")
    assert out["max_abs_diff"] == pytest.approx(2e-4) and out["ok"] is False and out["tolerance"] == 1e-4
    out = batch_invariance.compare_loglikelihoods(bs1, [-3.50001, -12.00003, -7.25005], "float32")
    assert out["max_abs_diff"] == pytest.approx(5e-5) and out["ok"] is True  # |-7.25 + 7.25005|, 3e-5, 1e-5
    # bfloat16: recorded, not judged
    bf = batch_invariance.compare_loglikelihoods(bs1, bs3, "bfloat16")
    assert bf["ok"] is None and "defined at float32" in bf["note"]
    with pytest.raises(ValueError):
        batch_invariance.compare_loglikelihoods([1.0], [1.0, 2.0], "float32")


def test_batch_invariance_requests_are_padded_in_a_batch() -> None:
    # the check needs different lengths, or a batch of 3 would have no padding to get wrong
    lengths = {len(c) + len(x) for c, x in batch_invariance.BATCH_INVARIANCE_REQUESTS}
    assert len(batch_invariance.BATCH_INVARIANCE_REQUESTS) == 3 and len(lengths) == 3
    assert batch_invariance.BATCH_INVARIANCE_SIZES == (1, 3)
    assert batch_invariance.batch_invariance(object(), "vllm", "bfloat16") == {
        "skipped": "eval.backend=vllm: the engine forms its own batches; checked with the hf backend"
    }


def test_acc_norm_normalisation_is_stated_as_lm_eval_computes_it() -> None:
    # lm-eval 0.4.13 api/task.py: completion_len = len(choice) (characters); acc_bytes uses UTF-8 bytes
    assert "characters" in lmeval_adapter.NORMALIZATION and "not bytes" in lmeval_adapter.NORMALIZATION
