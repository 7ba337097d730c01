"""``bench.capacity`` is refused before any work when it cannot search, each message naming the key and what is
allowed; the two capacity profiles compose."""

from __future__ import annotations

import pytest

from quantverdict.config.compose import compose
from quantverdict.config.schema import ConfigError

ON = ["bench=cpu-capacity"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["bench.capacity.ttft_ms=null"],
            "bench.capacity.enabled=true needs an objective: set at least one of bench.capacity.ttft_ms, "
            "bench.capacity.tpot_ms, bench.capacity.e2e_ms",
        ),
        (["bench.capacity.start=0"], "bench.capacity.start=0.0 must be > 0 (requests in flight)"),
        (
            ["bench.capacity.start=16"],
            "bench.capacity.max_load=8.0 must be finite and >= bench.capacity.start=16.0",
        ),
        (["bench.capacity.tolerance_pct=0"], "bench.capacity.tolerance_pct=0.0 must be > 0 (percent)"),
        (["bench.capacity.attainment_pct=120"], "bench.capacity.attainment_pct=120.0 must be in (0, 100]"),
        (["bench.capacity.tpot_ms=-5"], "bench.capacity.tpot_ms=-5.0 must be a finite number of ms > 0"),
        (["bench.capacity.start=1.5"], "bench.capacity.start=1.5 must be a whole number of requests"),
        (
            ["bench.mode=rate", "bench.capacity.start=inf"],
            "bench.capacity.start=inf must be a finite load > 0 (req/s); an unlimited rate cannot be doubled",
        ),
        (["bench.prefetch_prompts=true"], "bench.capacity.enabled=true needs bench.prefetch_prompts=false"),
    ],
)
def test_a_search_that_cannot_run_is_refused_naming_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        compose([*ON, *overrides])
    assert message in str(err.value)


def test_disabled_capacity_is_not_checked() -> None:
    # no objective, start 0: ignored while bench.capacity.enabled=false
    cfg = compose(["bench.capacity.start=0"])
    assert cfg.bench.capacity.enabled is False


def test_the_profiles_search_as_stated() -> None:
    cpu = compose(ON).bench.capacity
    assert (cpu.ttft_ms, cpu.attainment_pct, cpu.start, cpu.max_load, cpu.tolerance_pct) == (1000, 90, 1, 8, 50)
    gpu = compose(["bench=gpu-capacity"]).bench
    cap = gpu.capacity
    assert (cap.ttft_ms, cap.tpot_ms, cap.attainment_pct, cap.start, cap.max_load) == (1000, 25, 99, 8, 512)
    assert (gpu.mode, gpu.input_len, gpu.output_len, gpu.server_starts, gpu.prefetch_prompts) == (
        "concurrency",
        256,
        128,
        3,
        False,
    )


def test_the_search_off_keeps_the_job_id_and_on_changes_it() -> None:
    from quantverdict.orchestrate.resume import config_hash, hashed_config

    plain = compose([])
    assert "capacity" not in hashed_config(plain)["bench"]  # off: hashed as a config without the group
    assert config_hash(compose(["bench.capacity.ttft_ms=500"])) == config_hash(plain)  # unread while off
    assert config_hash(compose(["bench.capacity.enabled=true", "bench.capacity.ttft_ms=500"])) != config_hash(plain)
