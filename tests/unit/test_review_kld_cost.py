"""The KL divergence and the cost in the review, on hand-built records (tests/review_records.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from quantverdict.config.schema import ReviewConfig
from quantverdict.measure.cost import energy_usd_per_mtok
from quantverdict.results.record import JobRecord
from quantverdict.review import build_review, constraints, gpus
from quantverdict.review import document as doc
from quantverdict.review.core import to_json
from quantverdict.review.cost import cost_notes, scheme_cost
from quantverdict.review.render import markdown
from review_records import blank_scheme, grid, others, sentence, synthetic_grid

RC = ReviewConfig(log_to_mlflow=False, bootstrap_samples=1000, floor_test="point")


def _kld(mean: float, lo: float, hi: float, top1: float, t_lo: float, t_hi: float) -> dict[str, Any]:
    return {
        "mean_kld": mean,
        "median_kld": mean / 2,
        "p99_kld": mean * 10,
        "max_kld": mean * 30,
        "top1_agreement_pct": top1,
        "rms_delta_p_pct": 3.0,
        "mean_delta_p_pct": -0.4,
        "n_tokens": 4094,
        "n_windows": 2,
        "kld_exact": False,
        "top_k": 20,
        "confidence": 0.95,
        "mean_kld_ci_low": lo,
        "mean_kld_ci_high": hi,
        "top1_agreement_pct_ci_low": t_lo,
        "top1_agreement_pct_ci_high": t_hi,
        "interval_method": "paired percentile bootstrap over 2 windows (10000 resamples, seed 0)",
        "interval_note": None,
        "role": "scheme",
    }


def kld_grid() -> list[dict[str, Any]]:
    """grid() with KLDs: int8 0.002 nats / 98.5 %, gptq 0.08 [0.06, 0.10] / 85 % [83, 87], awq refused,
    the others without a KLD (records made before jobs measured it); bf16 stored the baseline."""
    recs = grid()
    by = {r["job"]["scheme"]: r for r in recs}
    by["bf16"]["accuracy"]["kld"] = {"role": "baseline", "top_k": 20, "stored_tokens": 4094}
    by["int8"]["accuracy"]["kld"] = _kld(0.002, 0.0018, 0.0022, 98.5, 98.0, 99.0)
    by["gptq"]["accuracy"]["kld"] = _kld(0.08, 0.06, 0.10, 85.0, 83.0, 87.0)
    by["awq"]["accuracy"]["kld"] = {"refused": "no stored baseline distributions at /x", "role": "scheme"}
    return recs


def _review(records: list[dict[str, Any]], **kw: Any) -> Any:
    review = build_review(records, replace(RC, **kw), "test")
    return review, review.verdicts[0], {sc.scheme: sc.checks for sc in review.scorecards}


def test_kld_rows_stand_beside_the_perplexity_delta() -> None:
    review, _, _ = _review(kld_grid())
    md = markdown(review)
    lines = md.splitlines()
    at = lines.index(next(x for x in lines if x.startswith("| int8 (W8A16) | token_perplexity | token_perplexity |")))
    mean, top1 = lines[at + 1], lines[at + 2]  # the next two rows of the accuracy table
    assert mean.startswith("| int8 (W8A16) | kld | mean KLD (nats) | 0.002 nats (median 0.001, p99 0.02, max 0.06; ")
    assert "top-20 lower bound)" in mean and "[0.0018, 0.0022]" in mean and "4094 tokens / 2 windows" in mean
    # top-1 agreement 98.5 %: -1.50 points, interval [98.0, 99.0] -> [-2.00, -1.00]
    assert top1.startswith("| int8 (W8A16) | kld | top-1 agreement | 98.50% vs 100% (RMS Δp 3.00%, mean Δp -0.40%)")
    assert "-1.50 pts [-2.00, -1.00]" in top1
    awq = [line for line in md.splitlines() if line.startswith("| awq (W4A16) |") and "| kld |" in line]
    assert len(awq) == 1 and "KL divergence not compared: no stored baseline distributions" in awq[0]


def test_no_kld_limit_leaves_the_checks_as_they_were() -> None:
    r_plain, v_plain, c_plain = _review(grid())
    r_kld, v_kld, c_kld = _review(kld_grid())
    assert sentence(r_plain, v_plain) == sentence(r_kld, v_kld)
    assert {s: c.accuracy.outcome for s, c in c_plain.items()} == {s: c.accuracy.outcome for s, c in c_kld.items()}


def test_max_mean_kld_fails_the_scheme_over_it() -> None:
    review, v, checks = _review(kld_grid(), max_mean_kld=0.05)
    assert checks["int8"].accuracy.outcome == "pass"
    assert "mean KLD 0.002 nats <= 0.05" in checks["int8"].accuracy.text
    gptq = checks["gptq"].accuracy
    assert gptq.outcome == "fail" and "mean KLD 0.08 nats is over the 0.05 limit" in gptq.shortfall
    assert gptq.excess == pytest.approx((0.08 - 0.05) / 0.05)
    # a scheme without a KLD cannot pass the limit: unknown, with why
    assert checks["fp8"].accuracy.outcome == "unknown"
    assert "no KL divergence in the record" in checks["fp8"].accuracy.text
    assert checks["awq"].accuracy.outcome == "unknown" and "no stored baseline" in checks["awq"].accuracy.text
    assert checks["bf16"].accuracy.outcome == "pass"  # the reference
    assert v.decision == "do not quantize"
    assert any(o.startswith("gptq") and "mean KLD 0.08 nats is over the 0.05 limit" in o for o in others(review, v))


def test_min_top1_agreement_and_the_interval_test() -> None:
    _, _, checks = _review(kld_grid(), min_top1_agreement_pct=90.0)
    gptq = checks["gptq"].accuracy
    assert gptq.outcome == "fail" and "top-1 agreement 85.00% is 5.00 points below 90%" in gptq.shortfall
    assert checks["int8"].accuracy.outcome == "pass"
    # interval test: gptq's mean KLD interval [0.06, 0.10] lies over 0.05 (fails) but reaches under 0.07 (passes)
    _, _, over = _review(kld_grid(), max_mean_kld=0.05, floor_test="interval")
    assert over["gptq"].accuracy.outcome == "fail"
    _, _, under = _review(kld_grid(), max_mean_kld=0.07, floor_test="interval")
    assert "mean KLD 0.08 nats (interval test: its interval starts at 0.06) <= 0.07" in under["gptq"].accuracy.text
    assert under["gptq"].accuracy.outcome == "pass"


def test_the_verdict_in_usd_per_million_output_tokens() -> None:
    rc = {"load_rps": None, "load_concurrency": 16, "memory_budget_gib": 12.0}
    review, v, _ = _review(synthetic_grid(), **rc, gpu_price_per_hour={"H200": 3.5})
    md = markdown(review)
    # fp8 at concurrency 16: E2E p50 45 + 127 x 4 = 553 ms -> 16 / 0.553 s x 128 = 3,703.4 output tok/s;
    # $3.50 / (3,703.4 x 3,600 tok/h) x 1e6 = $0.2625 per million output tokens
    assert v.chosen_scheme == "w8a8" or v.chosen_scheme == "fp8"
    line = next(line for line in md.splitlines() if line.startswith("**Cost**"))
    assert "NVIDIA H200 at $3.5 per GPU-hour" in line
    fp8 = next(line for line in md.splitlines() if line.startswith("- fp8 (FP8_DYNAMIC) on 1 GPU: $"))
    assert fp8.startswith("- fp8 (FP8_DYNAMIC) on 1 GPU: $0.263/Mtok at the stated load (3,703 tok/s)")
    # bf16: 60 + 127 x 6 = 822 ms -> 2,491.5 tok/s -> $0.3902
    assert any(
        line.startswith("- bf16 (BF16) on 1 GPU: $0.390/Mtok at the stated load (2,491 tok/s)")
        for line in md.splitlines()
    )
    # no price, or a price for another GPU kind: no cost line
    for prices in ({}, {"A100": 1.5}, {"H20": 1.0}):
        review, _, _ = _review(synthetic_grid(), **rc, gpu_price_per_hour=prices)
        assert "**Cost**" not in markdown(review)


def test_unset_kld_limits_and_prices_keep_the_label() -> None:
    # the committed review docs/results/gpu-review-llama3.1-8b-shape is labelled gpu-98355e53 (made before jobs
    # measured the KL divergence)
    rc = constraints.load_set("gpu")
    made = replace(
        rc, memory_budget_gib=80.0, concurrent_requests=64, load_rps=None, load_concurrency=64, log_to_mlflow=False
    )
    assert constraints.label(made) == "gpu-98355e53"
    assert constraints.label(replace(made, max_mean_kld=0.05)) != "gpu-98355e53"
    assert constraints.label(replace(made, gpu_price_per_hour={"H200": 3.5})) != "gpu-98355e53"


def test_a_tensor_parallel_job_pays_for_every_gpu_it_used() -> None:
    # hand-worked: $3.5 per GPU-hour, 1000 output tok/s -> 3.5 / (1000 x 3600) x 1e6 = 3.5 / 3.6 = $0.9722/Mtok
    # on one GPU; a TP=2 server at the same tok/s holds two GPUs -> $1.9444/Mtok
    at = doc.AtLoad.model_validate(dict.fromkeys(doc.AtLoad.model_fields) | {"label": "c=4", "load": 4, "spread": {}})
    top = doc.Ceiling.model_validate(dict.fromkeys(doc.Ceiling.model_fields) | {"kind": "saturated", "lower_bound": 0})
    at.output_tok_s = top.output_tok_s = 1000.0
    speed = doc.Speed.unmeasured("concurrency").model_copy(update={"at_load": at, "ceiling": top})
    one = blank_scheme("a", "bf16", "BF16", is_baseline=True)
    one.speed = speed
    two = one.model_copy(update={"job_id": "b", "gpus": 2})
    assert scheme_cost(one, 3.5).usd_per_mtok_at_load == pytest.approx(0.97222, abs=1e-5)
    assert scheme_cost(two, 3.5).usd_per_mtok_at_load == pytest.approx(1.94444, abs=1e-5)
    assert scheme_cost(two, 3.5).usd_per_mtok_ceiling == pytest.approx(1.94444, abs=1e-5)
    # the card takes the GPUs from the record: environment.gpus_used, else bench.server.tensor_parallel_size
    assert gpus.job_gpus(JobRecord.view({"environment": {"gpus_used": 2}})) == 2
    assert gpus.job_gpus(JobRecord.view({"config": {"bench": {"server": {"tensor_parallel_size": 4}}}})) == 4
    assert gpus.job_gpus(JobRecord.view({})) == 1
    # through the review: bf16 served with TP=2 at the same 2,491.5 tok/s -> 2 x $0.3902 = $0.7804/Mtok
    recs = synthetic_grid()
    bf16 = next(r for r in recs if r["job"]["scheme"] == "bf16")
    bf16.setdefault("environment", {})["gpus_used"] = 2
    review, _, _ = _review(
        recs, load_rps=None, load_concurrency=16, memory_budget_gib=12.0, gpu_price_per_hour={"H200": 3.5}
    )
    md = markdown(review)
    assert any(
        line.startswith("- bf16 (BF16) on 2 GPUs: $0.780/Mtok at the stated load (2,491 tok/s)")
        for line in md.splitlines()
    )


def test_review_json_carries_the_cost_when_a_price_applies() -> None:
    rc = {"load_rps": None, "load_concurrency": 16, "memory_budget_gib": 12.0}
    review, _, _ = _review(synthetic_grid(), **rc, gpu_price_per_hour={"H200": 3.5})
    cost = to_json(review)["cost"]
    assert (cost["gpu"], cost["gpu_kind"], cost["usd_per_gpu_hour"]) == ("NVIDIA H200", "H200", 3.5)
    fp8 = next(s for s in cost["schemes"] if s["scheme"] == "fp8")
    # as above: 3,703.4 output tok/s at concurrency 16 on 1 GPU -> $0.2625 per million output tokens
    assert fp8["gpus"] == 1 and fp8["usd_per_mtok_at_load"] == pytest.approx(0.2625, abs=1e-4)
    review, _, _ = _review(synthetic_grid(), **rc)
    assert to_json(review)["cost"] is None  # no price for the GPU: the key is there, null


def test_the_cost_line_takes_an_energy_price() -> None:
    # hand-worked: 0.0692 J per output token x 1e6 tokens = 69,200 J = 69,200 / 3.6e6 = 0.0192222 kWh; at $0.15
    # per kWh -> $0.00288333 per million output tokens
    assert energy_usd_per_mtok(0.0692, 0.15) == pytest.approx(0.00288333, rel=1e-5)
    with pytest.raises(ValueError, match="usd_per_kwh"):
        energy_usd_per_mtok(0.0692, 0.0)
    # through the review: every fp8 point's window at 0.05 J per output token and every bf16 point's at 0.08 J
    # (the median of a level's repeats is that value), at $0.20 per kWh -> fp8 0.05 x 1e6 / 3.6e6 x 0.20 =
    # $0.0027778/Mtok, bf16 0.08 x 1e6 / 3.6e6 x 0.20 = $0.0044444/Mtok, at the stated load and at the ceiling alike
    recs = synthetic_grid()
    for r in recs:
        j = {"fp8": 0.05, "bf16": 0.08}.get(r["job"]["scheme"])
        for p in r["speed"]["points"] if j else []:
            p["gpu"] = {"energy_per_output_token_j": j}
    rc = {"load_rps": None, "load_concurrency": 16, "memory_budget_gib": 12.0, "gpu_price_per_hour": {"H200": 3.5}}
    review, _, _ = _review(recs, **rc, energy_usd_per_kwh=0.20)
    cost = to_json(review)["cost"]
    assert cost["usd_per_kwh"] == 0.20
    by = {s["scheme"]: s for s in cost["schemes"]}
    assert by["fp8"]["energy_usd_per_mtok_at_load"] == pytest.approx(0.0027778, rel=1e-4)
    assert by["fp8"]["energy_usd_per_mtok_ceiling"] == pytest.approx(0.0027778, rel=1e-4)
    assert by["bf16"]["energy_usd_per_mtok_at_load"] == pytest.approx(0.0044444, rel=1e-4)
    # a scheme whose windows measured no energy has no energy cost, and the GPU-hour cost is unchanged by the price
    other = next(s for s in by if s not in ("fp8", "bf16"))
    assert by[other]["energy_usd_per_mtok_at_load"] is None
    assert by["fp8"]["usd_per_mtok_at_load"] == pytest.approx(0.2625, abs=1e-4)
    md = markdown(review).splitlines()
    assert any("GPU energy at $0.2 per kWh (review.energy_usd_per_kwh)" in line for line in md)
    fp8_line = next(line for line in md if line.startswith("- fp8 (FP8_DYNAMIC) on 1 GPU: $0.263/Mtok"))
    assert fp8_line.endswith("; GPU energy $0.00278/Mtok at the stated load, $0.00278/Mtok at the ceiling")
    # without an electricity price: no energy figures
    review, _, _ = _review(recs, **rc)
    assert to_json(review)["cost"]["schemes"][0]["energy_usd_per_mtok_at_load"] is None


def test_a_price_that_prices_nothing_is_said_in_the_notes() -> None:
    rc = {"load_rps": None, "load_concurrency": 16, "memory_budget_gib": 12.0}
    # the synthetic grid ran on an NVIDIA H200: an electricity price alone gives no cost line, and the notes say why
    review, _, _ = _review(synthetic_grid(), **rc, energy_usd_per_kwh=0.15)
    assert to_json(review)["cost"] is None
    assert (
        "review.energy_usd_per_kwh=0.15 adds no cost line alone: the cost line needs review.gpu_price_per_hour for "
        "the GPU the records ran on, NVIDIA H200 ({WORD: USD per GPU-hour}, WORD a word of its name)"
    ) in review.notes
    assert any(
        line.startswith("- review.energy_usd_per_kwh=0.15 adds no cost line") for line in markdown(review).split("\n")
    )
    # a price for another GPU kind: said too
    review, _, _ = _review(synthetic_grid(), **rc, gpu_price_per_hour={"A100": 1.5})
    assert (
        "review.gpu_price_per_hour={A100: 1.5} gives no cost line: no kind in it is a word of the records' GPU, "
        "NVIDIA H200"
    ) in review.notes
    # a price that applies, or no price at all: no such note
    for prices in ({"H200": 3.5}, {}):
        review, _, _ = _review(
            synthetic_grid(), **rc, gpu_price_per_hour=prices, energy_usd_per_kwh=0.15 if prices else None
        )
        assert not [n for n in review.notes if n.startswith(("review.gpu_price_per_hour", "review.energy_usd_per_kwh"))]
    # the records' environment without a GPU, or with two kinds
    priced = replace(RC, gpu_price_per_hour={"H100": 2.5})
    assert cost_notes(priced, ["CPU: x86_64 (2 cores)"]) == [
        "review.gpu_price_per_hour={H100: 2.5} gives no cost line: the records name no GPU"
    ]
    assert cost_notes(priced, ["GPU: NVIDIA H100 (x)", "GPU: NVIDIA A100 (y)"]) == [
        "review.gpu_price_per_hour={H100: 2.5} gives no cost line: the records ran on several GPU kinds "
        "(NVIDIA A100, NVIDIA H100)"
    ]
