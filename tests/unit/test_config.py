"""Config composition and validation: bad input is refused before any work, naming key and allowed values."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from quantverdict.config import ConfigError, closest
from quantverdict.settings import compose

SCHEMES = ["bf16", "awq", "gptq", "int8", "fp8", "w8a8"]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_composes(scheme: str) -> None:
    cfg = compose([f"scheme={scheme}"])
    assert cfg.scheme.name == scheme
    assert cfg.model.name == "smollm2-135m"


def test_scheme_labels_are_the_field_names() -> None:
    labels = {s: compose([f"scheme={s}"]).scheme.label for s in SCHEMES}
    assert labels == {"bf16": "BF16", "awq": "W4A16", "gptq": "W4A16", "int8": "W8A16", "fp8": "FP8_DYNAMIC", "w8a8": "W8A8"}


def test_unknown_scheme_lists_the_options() -> None:
    with pytest.raises(ConfigCompositionException) as err:
        compose(["scheme=awk"])
    assert "awq" in str(err.value) and "gptq" in str(err.value)


def test_unknown_key_is_rejected() -> None:
    with pytest.raises(ConfigCompositionException) as err:
        compose(["bench.rate=4"])
    assert "bench.rate" in str(err.value)


def test_appended_unknown_key_is_not_silently_dropped() -> None:
    with pytest.raises(ConfigError) as err:
        compose(["+bench.rate=4"])
    assert "unknown config key 'bench.rate'" in str(err.value)
    assert "did you mean 'rates'" in str(err.value)


def test_wrong_type_is_rejected() -> None:
    with pytest.raises((ConfigCompositionException, ValidationError)) as err:
        compose(["bench.num_prompts=many"])
    assert "num_prompts" in str(err.value)


def test_bad_values_are_collected_into_one_error() -> None:
    with pytest.raises(ConfigError) as err:
        compose(["eval.backend=hff", "eval.tasks=[arc_esay]", "bench.mode=closed", "data.offline_root=/nonexistent"])
    msg = str(err.value)
    assert "eval.backend='hff'" in msg and "did you mean 'hf'" in msg
    assert "eval.tasks[0]='arc_esay'" in msg and "did you mean 'arc_easy'" in msg
    assert "bench.mode='closed'" in msg and "allowed: rate, concurrency" in msg
    assert "data.offline_root='/nonexistent'" in msg and "data.offline_root=null" in msg


def test_request_longer_than_context_is_refused() -> None:
    # 2000 in + 100 out = 2100 > max_model_len 2048 of smollm2-135m
    with pytest.raises(ConfigError, match="exceeds the server's max_model_len 2048"):
        compose(["bench.input_len=2000", "bench.output_len=100"])


def test_closest() -> None:
    assert closest("gtpq", ["bf16", "gptq", "awq"]) == " (did you mean 'gptq'?)"
    assert closest("zzzz", ["bf16", "gptq"]) == ""
