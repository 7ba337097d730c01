"""A key of a mapping set without Hydra's '+' (``review.gpu_price_per_hour={H100: 2.5}`` on ``pipelines.run``):
the error names the key and the form that composes, in-process through Hydra's compose API."""

from __future__ import annotations

import pytest

from quantverdict.config.overrides import check_command_line
from quantverdict.config.schema import ConfigError

pytestmark = pytest.mark.unit

MAPPING = (
    "review.gpu_price_per_hour.H100: review.gpu_price_per_hour is a mapping whose keys are yours to add, with "
    "Hydra's leading '+': '+review.gpu_price_per_hour={H100: VALUE}'"
)


@pytest.mark.parametrize("override", ["review.gpu_price_per_hour={H100: 2.5}", "review.gpu_price_per_hour.H100=2.5"])
def test_a_mapping_key_without_the_plus_names_the_form_that_composes(override: str) -> None:
    with pytest.raises(ConfigError) as refused:
        check_command_line([override])
    assert MAPPING in str(refused.value)


def test_the_mapping_with_the_plus_composes() -> None:
    check_command_line(["+review.gpu_price_per_hour={H100: 2.5}", "review.energy_usd_per_kwh=0.15"])
