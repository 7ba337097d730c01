"""The review's Validity section and its speed numbers: medians over valid repeats, saturation, the ceiling's
interval, fallback kernels kept out of speed comparisons, the evaluate stage's own checks.

Numbers of :func:`review_records.grid` (rate sweep, 1 req/s and unlimited): bf16 ITL p50 40 ms at 1 req/s,
300 out tok/s at the unlimited rate; w8a8 33 ms and 400 tok/s.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from quantverdict.config.schema import ReviewConfig
from quantverdict.results.record import JobRecord
from quantverdict.review import build_review, to_json
from quantverdict.review.document import MinMax, RegimeReading
from quantverdict.review.render import markdown
from quantverdict.review.speed import raw_points, speed_points, speed_summary
from review_records import grid, point, record

view = JobRecord.view  # the typed record the review reads

RC = ReviewConfig(log_to_mlflow=False, bootstrap_samples=1000)


def _rep(p: dict, repeat: int, **kw: float) -> dict:  # type: ignore[type-arg]
    return {**p, "repeat": repeat, **kw}


def test_a_repeat_with_short_outputs_is_left_out_not_averaged() -> None:
    # Fails on the old review, which averaged every repeat: (30 + 12) / 2 = 21 instead of 30.
    rec = record("bf16")
    good = point(1.0, achieved=0.95, tok_s=30.0, ttft99=300, itl50=40, itl99=60, e2e50=1400)
    short = _rep(
        point(1.0, achieved=0.95, tok_s=12.0, ttft99=300, itl50=40, itl99=60, e2e50=1400, out_total=100, out_req=256), 1
    )
    rec["speed"] = {"mode": "rate", "points": [good, short]}
    pts = speed_points(*raw_points(view(rec)))
    # 100 of 256 tokens (39% < 90%): invalid; the level's tok/s is the valid repeat's 30
    assert pts[0].output_tok_s == 30.0 and pts[0].valid_repeats == 1 and pts[0].repeats == 2
    _, flags, _ = speed_summary(view(rec), RC)
    (flag,) = flags
    assert flag.code == "speed_point_short" and "1 req/s (repeat 1): 100 of 256" in flag.message


def test_repeats_give_a_median_and_a_range() -> None:
    rec = record("bf16")
    # three repeats of the unlimited-rate point: 280, 300, 340 tok/s -> median 300, range 280..340
    base = point(None, achieved=9.0, tok_s=300.0, ttft99=1500, itl50=120, itl99=240, e2e50=5000)
    low = point(1.0, achieved=0.95, tok_s=30.0, ttft99=300, itl50=40, itl99=60, e2e50=1400)
    rec["speed"] = {
        "mode": "rate",
        "points": [
            low,
            _rep(low, 1, itl_ms_p50=44.0),
            _rep(low, 2, itl_ms_p50=38.0),
            base,
            _rep(base, 1, output_tok_s=280.0),
            _rep(base, 2, output_tok_s=340.0),
        ],
    }
    sp, _, _ = speed_summary(view(rec), RC)
    assert sp.ceiling is not None and sp.low_load is not None
    assert sp.ceiling.output_tok_s == 300.0 and sp.ceiling.output_tok_s_range == MinMax(min=280.0, max=340.0)
    assert sp.low_load.itl_ms_p50 == 40.0 and sp.low_load.itl_ms_p50_range == MinMax(min=38.0, max=44.0)
    assert sp.ceiling.kind == "saturated" and sp.repeats == 3


def test_regime_uses_the_interval_not_one_run() -> None:
    recs = grid()
    bf16, w8a8 = recs[0], next(r for r in recs if r["job"]["scheme"] == "w8a8")
    # one run each: w8a8 400 / 300 = 1.33x at saturation -> "keeps paying"
    review = build_review(recs, RC, "t")
    assert next(r for r in review.regime["m"] if r.scheme == "w8a8").reading == RegimeReading.KEEPS_PAYING
    # now two repeats each, with run-to-run spread: bf16 saturation 300 and 420 tok/s, w8a8 400 and 410.
    # medians 360 and 405 -> 1.125x, but the range [400/420, 410/300] = [0.95, 1.37] straddles 1.05
    for rec, other in ((bf16, 420.0), (w8a8, 410.0)):
        sat = rec["speed"]["points"][1]
        rec["speed"]["points"].append(_rep(sat, 1, output_tok_s=other))
    review = build_review(recs, RC, "t")
    row = next(r for r in review.regime["m"] if r.scheme == "w8a8")
    assert row.saturation_speedup == pytest.approx(405 / 360)
    assert (row.saturation_range.min, row.saturation_range.max) == pytest.approx((400 / 420, 410 / 300))
    # the two repeats pair by index: ratios 400 / 300 = 1.3333 and 410 / 420 = 0.9762, logs 0.28768 and
    # -0.02410, mean 0.13179 (geometric mean 1.1409), sd 0.22046, t(1) = 12.706: half-width 12.706 x 0.22046 /
    # sqrt(2) = 1.98075 -> 95% CI exp(-1.84896) = 0.157 to exp(2.11254) = 8.27: no difference established
    sat = row.saturation_claim
    assert sat.rule == "paired t" and sat.pairs == 2 and sat.verdict == "no difference established"
    assert sat.speedup == pytest.approx(1.1409, abs=1e-4)
    assert (sat.low, sat.high) == (pytest.approx(0.1574, abs=1e-3), pytest.approx(8.269, abs=1e-2))
    assert row.reading == RegimeReading.PAYS_AT_LOW_LOAD_ONLY  # an interval over 1 does not pay at saturation


def test_saturated_points_and_ceiling_in_the_validity_section() -> None:
    recs = grid()
    bf16 = recs[0]
    # 10 req/s achieved only 5 req/s: saturated (5 < 0.9 x 10, and 10 is not under 90% of the 9.4 req/s
    # the burst sustained), named in the Validity section
    bf16["speed"]["points"][0].update(offered_rate_rps=10.0, achieved_rps=5.0)
    review = build_review(recs, RC, "t")
    line = next(v for v in review.validity if v.startswith("bf16 (BF16): 2 speed points"))
    assert "saturated: 10 req/s" in line and "no invalid point" in line
    assert "ceiling 300.0 out tok/s (one run: no spread) at unlimited rate" in line
    md = markdown(review)
    assert "### Validity" in md and "saturated: 10 req/s" in md
    assert to_json(review)["validity"] == review.validity


def test_a_lower_bound_ceiling_does_not_fail_the_load() -> None:
    # only finite rates, none saturated: the ceiling is above the sweep, not below the load
    recs = grid()
    for r in recs:
        r["speed"]["points"] = r["speed"]["points"][:1]  # the 1 req/s point only (0.95 achieved: kept up)
    review = build_review(recs, replace(RC, load_rps=1.0), "t")
    c = review.scheme("m", "bf16").checks.latency
    assert "ceiling >= 0.95 req/s" in c.text and "below" not in c.shortfall


def test_fallback_scheme_is_relabelled_and_kept_out_of_speed_comparisons() -> None:
    recs = grid()
    fp8 = next(r for r in recs if r["job"]["scheme"] == "fp8")
    fp8["memory"]["server"].update(
        fallback=True,
        fallback_lines=["Your GPU does not have native support for FP8 computation"],
        kernels=[{"kernel": "MarlinFP8ScaledMMLinearKernel", "method": "CompressedTensorsW8A8Fp8"}],
    )
    review = build_review(recs, RC, "t")
    card = next(c for c in review.scorecards if c.scheme == "fp8")
    assert card.label == "FP8_DYNAMIC (weight-only fallback)" and card.speed.comparable is False
    row = next(r for r in review.regime["m"] if r.scheme == "fp8")
    assert row.low_load_speedup is None and row.saturation_speedup is None
    assert row.reading == RegimeReading.EXCLUDED
    why = review.scheme("m", "fp8").speed.excluded_why
    assert why is not None and why.startswith("ran as FP8_DYNAMIC (weight-only fallback)")
    (fallback,) = [f for f in review.flags if f.code == "fallback_kernel"]
    assert fallback.scheme == "fp8" and "relabelled FP8_DYNAMIC (weight-only fallback)" in fallback.message


def test_batch_invariance_failure_and_eval_settings_are_surfaced() -> None:
    recs = grid()
    int8 = next(r for r in recs if r["job"]["scheme"] == "int8")
    int8["accuracy"]["checks"] = {
        "batch_invariance": {
            "max_abs_diff": 3e-3,
            "ok": False,
            "tolerance": 1e-4,
            "batch_sizes": [1, 3],
            "dtype": "float32",
            "n_requests": 3,
        },
        "perplexity_family": {"max_rel_diff": 0.0, "ok": True},
    }
    recs[0]["accuracy"]["checks"] = {
        "batch_invariance": {
            "max_abs_diff": 2e-6,
            "ok": True,
            "tolerance": 1e-4,
            "batch_sizes": [1, 3],
            "dtype": "float32",
            "n_requests": 3,
        },
    }
    review = build_review(recs, RC, "t")
    (bi,) = [f for f in review.flags if f.code == "batch_variance"]
    assert bi.scheme == "int8" and "by up to 0.003" in bi.message  # max_abs_diff 3e-3 > 1e-4
    assert any("bf16 (BF16): batch invariance ok: max |delta log-likelihood| 2e-06" in v for v in review.validity)
    assert any("int8 (W8A16): eval batch_size 8, dtype float32, max_length 2048" in v for v in review.validity)
    # mismatched settings are still refused and flagged
    recs[2]["accuracy"]["settings"]["batch_size"] = 1
    review = build_review(recs, RC, "t")
    (refused,) = [f for f in review.flags if f.code == "accuracy_refused"]
    assert "batch_size: 1 vs baseline 8" in refused.message


def test_mixed_serving_dtypes_are_flagged() -> None:
    from quantverdict.review.memory import dtype_flags, served_compute_dtype

    def rec(dtype: dict | None, config_dtype: str = "auto") -> dict:
        speed = {"points": [{"point": "rate-inf_r0"}], **({"dtype": dtype} if dtype else {})}
        return {
            "speed": speed,
            "config": {"bench": {"server": {"dtype": config_dtype}}, "model": {"dtype": "bfloat16"}},
        }

    base = rec({"value": "float32", "chosen_by": "cpu", "why": "AVX512: bf16 is emulated"})
    w4 = rec({"value": "bfloat16", "chosen_by": "kernel", "why": "the W4A16 kernel takes 16-bit activations only"})
    (flag,) = dtype_flags(view(w4), view(base))
    assert flag.code == "dtype_mismatch" and "16-bit activations only" in flag.message
    assert dtype_flags(view(rec({"value": "float32", "chosen_by": "cpu", "why": ""})), view(base)) == []

    # older records (read migrated): the config's dtype, and "auto" is the checkpoint's (the model's dtype)
    def older(config_dtype: str = "auto") -> JobRecord:
        return JobRecord.from_dict({**rec(None, config_dtype), "schema_version": 2, "tool": {"name": "quantverdict"}})

    assert served_compute_dtype(older("float32")) == "float32" and served_compute_dtype(older()) == "bfloat16"
    (older_flag,) = dtype_flags(older(), older("float32"))
    assert older_flag.code == "dtype_mismatch" and "bfloat16, its baseline in float32" in older_flag.message
    assert dtype_flags(view({"speed": {"points": []}}), older("float32")) == []  # nothing served, nothing to compare
    # "auto" (vLLM's own choice, as GPU jobs record it) is the checkpoint's dtype: no mismatch with bfloat16
    auto = rec({"value": "auto", "chosen_by": "config", "why": "bench.server.dtype"})
    assert served_compute_dtype(view(auto)) == "bfloat16"
    assert dtype_flags(view(auto), view(rec({"value": "bfloat16", "chosen_by": "config", "why": ""}))) == []


def test_gpu_windows_give_energy_per_token_and_flag_idle_gaps_and_clock_drift() -> None:
    rec = record("gptq")
    idle = {"energy_per_output_token_j": 0.0708, "idle_fraction": 0.056, "idle_longest_s": 0.4, "drifting": False}
    drift = {"energy_per_output_token_j": 0.0720, "idle_fraction": 0.01, "sm_clock_drift_rel": 0.14, "drifting": True}
    hot = {
        "energy_per_output_token_j": 0.0700,
        "idle_fraction": 0.0,
        "throttle_reasons": ["sw_power_cap", "hw_slowdown"],
    }
    low = point(1.0, achieved=0.95, tok_s=30.0, ttft99=300, itl50=40, itl99=60, e2e50=1400)
    one = {**low, "offered_rate_rps": None, "concurrency": 1}
    one["gpu"] = {"energy_per_output_token_j": 1.6, "idle_fraction": 0.1}
    top = {**low, "offered_rate_rps": None, "concurrency": 256, "server_start": 1}
    rec["speed"] = {
        "mode": "concurrency",
        "points": [
            one,
            {**top, "gpu": idle},
            {**top, "repeat": 1, "server_start": 2, "gpu": drift},
            {**top, "repeat": 2, "server_start": 3, "gpu": hot},
        ],
    }
    pts = speed_points(*raw_points(view(rec)))
    # median of 0.0708, 0.0720, 0.0700 J is 0.0708; concurrency 1 has one window of 1.6 J
    assert [p.energy_per_output_token_j for p in pts] == [1.6, 0.0708]
    _, flags, _ = speed_summary(view(rec), RC)
    # 10% idle at concurrency 1 is the load's (one request at a time), not flagged; 5.6% > 2% at 256 is. One repeat
    # per start (the record's bench.repeats): repeats 1 and 2 are starts 2 and 3's only points, named by start alone
    assert [(f.code, f.message.split(":")[0]) for f in flags] == [
        ("gpu_idle", "speed point concurrency 256 (start 1)"),
        ("gpu_clock", "speed point concurrency 256 (start 2)"),
        ("gpu_clock", "speed point concurrency 256 (start 3)"),
    ]
    assert "drifted by 14%" in flags[1].message and "slowed (hw_slowdown)" in flags[2].message


def test_an_idle_window_names_the_host_process_that_held_the_gpu_back() -> None:
    rec = record("gptq")
    low = point(1.0, achieved=0.95, tok_s=30.0, ttft99=300, itl50=40, itl99=60, e2e50=1400)
    top = {**low, "offered_rate_rps": None, "concurrency": 256, "server_start": 1}
    gpu = {"idle_fraction": 0.246, "idle_longest_s": 1.2}

    def host(api: float, engine: float, client: float) -> dict[str, Any]:
        roles = {"api_server": api, "engine_core": engine, "worker": 0.0, "other": 0.0}
        return {"gpu_idle": {"samples": 44, "client_cpu_pct_median": client, "server_cpu_pct_median_by_role": roles}}

    rec["speed"] = {
        "mode": "concurrency",
        "points": [
            # the API server at a full core (>= 90%) while the engine core waits (<= 10%): the front end
            {**top, "gpu": gpu, "host": host(100.0, 0.0, 70.0)},
            # the API server at 40%, the client at a full core: the client
            {**top, "repeat": 1, "server_start": 2, "gpu": gpu, "host": host(40.0, 0.0, 100.0)},
            # the API server busy but the engine core too (30% > 10%), the client at 50%: no process named
            {**top, "repeat": 2, "server_start": 3, "gpu": gpu, "host": host(95.0, 30.0, 50.0)},
            # no host samples: no process named
            {**top, "repeat": 3, "server_start": 4, "gpu": gpu},
        ],
    }
    _, flags, _ = speed_summary(view(rec), RC)
    assert [f.code for f in flags] == ["gpu_idle"] * 4
    front, client, neither, unsampled = (f.message for f in flags)
    assert "24.6% of the window (longest gap 1.2 s)" in front
    assert "API server process ran at a median 100% of one core and the engine core at 0%" in front
    assert "--api-server-count" in front
    assert "the sweep client ran at a median 100% of one core: the client held the GPU back" in client
    for message in (neither, unsampled):
        assert "API server process ran" not in message and "sweep client ran" not in message
        assert "the host (scheduler, API server or client) held it back" in message
