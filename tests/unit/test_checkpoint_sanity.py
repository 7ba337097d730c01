"""The checkpoint sanity verdict: bounds against the source model, and a stored verdict that holds only for the
bytes it judged (a checkpoint changed and checksummed again is judged again)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from quantverdict.config.compose import compose
from quantverdict.config.schema import ConfigError
from quantverdict.measure.sanity import SanityNumbers, judge
from quantverdict.orchestrate import caches

BOUNDS = {"max_ppl_ratio": 10.0, "max_mean_kld": 2.0}


def result(nll_source: float, nll_checkpoint: float | None, kld: float | None, finite: bool = True) -> dict:
    ratio = None if nll_checkpoint is None else math.exp(nll_checkpoint - nll_source)
    return {"finite": finite, "nll_source": nll_source, "nll_checkpoint": nll_checkpoint, "ppl_ratio": ratio,
            "mean_kld": kld, "n_tokens": 55}  # fmt: skip


def test_an_honest_4bit_checkpoint_passes() -> None:
    # SmolLM2-135M W4A16 GPTQ on the check prompts: NLL 1.954 -> 2.608 nats/token (ratio 1.92), KLD 0.43 nats
    assert judge(SanityNumbers.of(result(1.954, 2.608, 0.43)), **BOUNDS) is None


def test_zeroed_scales_fail_on_the_perplexity_ratio() -> None:
    # every weight_scale zeroed: NLL 106.56 nats/token, exp(104.606) = 10^45.43 = 2.69e45 times the source's perplexity
    reason = judge(SanityNumbers.of(result(1.954, 106.56, 106.46)), **BOUNDS)
    assert reason is not None and "2.69e+45x" in reason and "quantize.sanity.max_ppl_ratio=10.0" in reason


def test_a_perplexity_past_float_range_fails() -> None:
    numbers = SanityNumbers.of({**result(1.954, 700.0, 699.0), "ppl_ratio": None, "nll_checkpoint": 1000.0})  # e^998
    reason = judge(numbers, **BOUNDS)
    assert reason is not None and "infx" in reason and "vs 7.057" in reason  # exp(1.954) = 7.057


def test_kl_divergence_alone_can_fail() -> None:
    # perplexity within 10x (e^2.0 = 7.4x) but the distributions far apart: 2.5 nats/token
    reason = judge(SanityNumbers.of(result(2.0, 4.0, 2.5)), **BOUNDS)
    assert reason is not None and "2.5 nats/token" in reason and "max_mean_kld=2.0" in reason


def test_non_finite_logits_fail_even_where_only_finiteness_is_judged() -> None:
    nan = SanityNumbers.of(result(1.954, None, None, finite=False))
    assert "non-finite" in (judge(nan, **BOUNDS) or "")
    assert "non-finite" in (judge(nan, **BOUNDS, finite_only=True) or "")
    # a synthetic model's random weights: a large ratio says nothing, finite logits pass
    assert judge(SanityNumbers.of(result(10.8, 20.0, 9.0)), **BOUNDS, finite_only=True) is None


def test_a_checkpoint_past_float_range_names_an_infinite_perplexity() -> None:
    # NLL 800 nats/token: ratio and checkpoint NLL past float range, written as null; the source's exp(1.954) = 7.057
    numbers = SanityNumbers.of({**result(1.954, None, None), "n_tokens": 55})
    reason = judge(numbers, **BOUNDS)
    assert reason is not None and "infx" in reason and "(inf vs 7.057;" in reason


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"mean_kld": ...}, "the sanity result lacks mean_kld"),
        ({"finite": "yes"}, "the sanity result's finite is 'yes', not true or false"),
        ({"ppl_ratio": "1.9"}, "the sanity result's ppl_ratio is '1.9', not a number or null"),
        ({"nll_source": True}, "the sanity result's nll_source is True, not a number or null"),
    ],
)
def test_a_sanity_result_of_the_wrong_shape_is_refused_naming_the_key(change: dict, says: str) -> None:
    bad = {k: v for k, v in {**result(1.954, 2.608, 0.43), **change}.items() if v is not ...}
    with pytest.raises(ValueError, match=f"^{re.escape(says)}$"):
        SanityNumbers.of(bad)


def test_a_stored_verdict_judge_cannot_read_is_checked_again(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(bytes(1024))
    verdict = {"checked": "now", **result(1.954, 1.958, 0.0066), "bounds": {**BOUNDS, "finite_only": False}}
    del verdict["mean_kld"]  # a verdict file without the KL divergence: not a result judge reads
    caches.write_checksums(ckpt, verdict)
    caches.verify_checksums(ckpt)
    assert caches.recorded_sanity(ckpt) is None


def test_bounds_are_validated_naming_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        compose(["quantize.sanity.max_ppl_ratio=0.5", "quantize.sanity.max_mean_kld=0"])
    assert "quantize.sanity.max_ppl_ratio=0.5 must be >= 1" in str(err.value)
    assert "quantize.sanity.max_mean_kld=0.0 must be > 0" in str(err.value)


def test_a_stored_verdict_holds_only_for_the_bytes_it_judged(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(bytes(range(256)) * 4)
    (ckpt / "config.json").write_text("{}")
    verdict = {"checked": "now", **result(1.954, 1.958, 0.0066), "bounds": {**BOUNDS, "finite_only": False}}
    digest = caches.write_checksums(ckpt, verdict)
    assert caches.verify_checksums(ckpt) == digest  # the verdict file is checksummed too
    stored = caches.recorded_sanity(ckpt)
    assert stored is not None and stored["result"]["mean_kld"] == 0.0066
    # the weights changed after the check and the manifest written again to match them: the verdict no longer holds
    (ckpt / "model.safetensors").write_bytes(bytes(1024))
    caches.write_checksums(ckpt)
    caches.verify_checksums(ckpt)
    assert caches.recorded_sanity(ckpt) is None
    # nor with a file added
    caches.write_checksums(ckpt, verdict)
    (ckpt / "extra.safetensors").write_bytes(b"x")
    caches.write_checksums(ckpt)
    assert caches.recorded_sanity(ckpt) is None
    assert set(json.loads((ckpt / caches.CHECKSUMS).read_text())) == {
        "config.json",
        "extra.safetensors",
        "model.safetensors",
        caches.SANITY,
    }
