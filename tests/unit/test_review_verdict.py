"""The verdict on hand-built records: quantize just enough, and say why with the numbers.

Numbers of :func:`review_records.grid` (one model, the KV cache for 16 x 288 tokens is 0.098877 GiB):

| scheme | weights GiB | need GiB | arc_easy acc_norm | word ppl | ITL p50 / p99 at 1 req/s | E2E p50 |
|---|---|---|---|---|---|---|
| bf16 | 0.25 | 0.348877 | 0.500 | 20.0 | 40 / 60 | 1400 |
| int8 | 0.15 | 0.248877 | 0.500 | 20.1 (+0.5%) | 34 / 51 | 1200 |
| fp8 | 0.15 | 0.248877 | 0.490 (98%) | 20.2 (+1%) | 150 / 225 | 5000 |
| w8a8 | 0.15 | 0.248877 | 0.490 (98%) | 20.3 (+1.5%) | 33 / 49.5 | 1100 |
| gptq | 0.10 | 0.198877 | 0.480 (96%) | 21.0 (+5%) | 25 / 37.5 | 900 |
| awq | 0.10 | 0.198877 | 0.485 (97%) | 20.8 (+4%) | 26 / 39 | 950 |
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from quantverdict.config.schema import ReviewConfig
from quantverdict.review import build_review
from quantverdict.review.document import RegimeReading
from review_records import grid, others, record, sentence, speed

# the point test throughout (these records' tasks have 100 items: floor_test auto would test them on the
# interval); the interval and auto tests are named where used
RC = ReviewConfig(log_to_mlflow=False, bootstrap_samples=1000, floor_test="point")


def verdict(records: list[dict], **kw: object):  # type: ignore[no-untyped-def]
    review = build_review(records, replace(RC, **kw), "test")
    assert len(review.verdicts) == 1
    return review, review.verdicts[0]


def test_no_constraint_binding_means_do_not_quantize() -> None:
    # defaults: 24 GiB budget, 95% recovery, +5% perplexity, TTFT p99 2 s / ITL p99 200 ms at 1 req/s
    review, v = verdict(grid())
    assert v.decision == "do not quantize" and v.chosen_scheme == "bf16"
    assert not v.binding
    # the sentence cites the three numbers: memory 0.348877 GiB of 24 GiB, the accuracy reference, the latency
    assert "0.349 GiB" in sentence(review, v) and "24.0 GiB budget" in sentence(review, v)
    assert "accuracy reference" in sentence(review, v)
    assert "TTFT p99 300 ms <= 2,000 ms" in sentence(review, v) and "ITL p99 60 ms <= 200 ms" in sentence(review, v)
    assert any(o.startswith("int8 (W8A16): would also pass") for o in others(review, v))
    # fp8's ITL p99 at 1 req/s is 1.5 * 150 = 225 ms: 25 ms (12%) over the 200 ms SLO
    assert any("fp8" in o and "ITL p99 225 ms is 25 ms (12%) over the 200 ms SLO" in o for o in others(review, v))


def test_all_constraints_off_means_do_not_quantize() -> None:
    _, v = verdict(
        grid(),
        memory_budget_gib=None,
        min_recovery_pct=None,
        max_perplexity_increase_pct=None,
        ttft_ms_p99=None,
        itl_ms_p99=None,
    )
    assert v.decision == "do not quantize"


def test_budget_only_4bit_meets() -> None:
    # 0.22 GiB: bf16 needs 0.348877 (0.128877 over = 59%), 8-bit 0.248877 (0.028877 over), 4-bit 0.198877 fits;
    # gptq (E2E p50 900 ms) beats awq (950 ms) at the load
    review, v = verdict(grid(), memory_budget_gib=0.22)
    assert v.decision == "quantize" and v.chosen_scheme == "gptq"
    assert v.binding == ["memory"]
    assert review.scheme("m", "bf16").checks.memory.shortfall == "0.129 GiB (59%) over the 0.220 GiB budget"
    assert "needs 0.199 GiB" in sentence(review, v) and "<= 0.220 GiB budget" in sentence(review, v)
    assert "worst recovery 96.0%" in sentence(review, v)  # 100 * 0.48 / 0.50
    assert "ITL p99 38 ms <= 200 ms" in sentence(review, v)  # 1.5 * 25 = 37.5
    assert "ahead of awq" in sentence(review, v)
    assert any(o.startswith("int8 (W8A16): fails memory: 0.029 GiB (13%) over") for o in others(review, v))
    assert review.scheme("m", "gptq").checks.memory.outcome == "pass"
    assert review.scheme("m", "int8").checks.memory.outcome == "fail"


def test_budget_that_8bit_meets_prefers_8bit_over_4bit() -> None:
    # 0.30 GiB: 8-bit needs 0.248877 and fits; fp8 fails latency (ITL p99 225 ms); w8a8 (E2E 1100 ms) beats
    # int8 (1200 ms); the 4-bit schemes fit too but are more aggressive
    review, v = verdict(grid(), memory_budget_gib=0.30)
    assert v.chosen_scheme == "w8a8"
    assert (
        "least aggressive scheme that meets all three (8-bit tier; E2E p50 1,100 ms at the load, ahead of int8)"
        in sentence(review, v)
    )
    assert any(
        o.startswith("gptq (W4A16): passes all three too, not chosen (more aggressive)") for o in others(review, v)
    )
    assert any(o.startswith("int8 (W8A16): passes all three too, not chosen (same tier") for o in others(review, v))


def test_strict_recovery_floor_moves_to_the_lossless_8bit_scheme() -> None:
    # 0.30 GiB: w8a8 wins the 8-bit tier on speed; with recovery >= 99.5% only int8 (0.500 / 0.500 = 100%)
    # is left in it (w8a8 and fp8 recover 0.49 / 0.50 = 98%), ahead of the 4-bit schemes (96%, 97%)
    review, v = verdict(grid(), memory_budget_gib=0.30, min_recovery_pct=99.5)
    assert v.chosen_scheme == "int8"
    assert any(
        o.startswith("w8a8 (W8A8): fails accuracy: arc_easy recovery 98.0% is 1.5 points below the 99.5% floor")
        for o in others(review, v)
    )


def test_accuracy_floor_only_bf16_meets() -> None:
    # recovery >= 99.5% and perplexity +0.1% at most: int8 keeps acc_norm (100%) but word ppl rises 0.5%;
    # everything else loses more. Memory does not bind -> keep bf16
    review, v = verdict(grid(), min_recovery_pct=99.5, max_perplexity_increase_pct=0.1)
    assert v.decision == "do not quantize"
    for scheme in ("int8", "fp8", "w8a8", "gptq", "awq"):
        assert review.scheme("m", scheme).checks.accuracy.outcome == "fail"
    int8 = review.scheme("m", "int8").checks.accuracy
    assert "word_perplexity rises +0.5%, 0.4 points over the +0.1% limit" in int8.shortfall
    # with a memory budget that bf16 misses, nothing is left
    review, v = verdict(grid(), min_recovery_pct=99.5, max_perplexity_increase_pct=0.1, memory_budget_gib=0.30)
    assert v.decision == "no scheme meets all three" and v.chosen_scheme is None
    assert "bf16 (BF16) fails memory" in sentence(
        review, v
    ) and "the closest is int8 (W8A16): fails accuracy" in sentence(review, v)


def test_latency_slo_binding_picks_a_faster_scheme() -> None:
    # ITL p99 <= 55 ms: bf16 has 60 (5 ms over); int8 51 and w8a8 49.5 pass; w8a8 is faster at the load
    review, v = verdict(grid(), itl_ms_p99=55.0)
    assert v.binding == ["latency"]
    assert review.scheme("m", "bf16").checks.latency.shortfall == "ITL p99 60 ms is 5 ms (9%) over the 55 ms SLO"
    assert v.chosen_scheme == "w8a8"


def test_load_beyond_the_ceiling_fails() -> None:
    # 9 req/s: the unlimited-rate point stands for it; bf16's ceiling is 300 / 32 = 9.375 req/s (holds),
    # TTFT p99 there is 5 * 300 = 1500 ms, ITL p99 4 * 60 = 240 ms > 200 -> bf16 fails latency at that load
    review, _v = verdict(grid(), load_rps=9.0)
    bf16 = review.scheme("m", "bf16").checks.latency
    assert bf16.outcome == "fail" and "ITL p99 240 ms" in bf16.text
    assert "nearest measured rate above 9 req/s" in bf16.text
    # 20 req/s is beyond every ceiling: fails with the ceiling cited
    review, _ = verdict(grid(), load_rps=20.0)
    assert "ceiling 9.38 req/s is below the 20 req/s load" in review.scheme("m", "bf16").checks.latency.shortfall


def test_interval_floor_gives_the_benefit_of_the_doubt() -> None:
    # fp8 recovers 98% of acc_norm; floor 99%: fails on the point estimate, but its unpaired 95% interval
    # (stderr 0.05 each) reaches well above 99% -> passes with floor_test=interval
    review, _ = verdict(grid(), min_recovery_pct=99.0, max_perplexity_increase_pct=None)
    fp8 = review.scheme("m", "fp8").checks.accuracy
    assert fp8.outcome == "fail" and "not significant" in fp8.shortfall
    review, _ = verdict(grid(), min_recovery_pct=99.0, max_perplexity_increase_pct=None, floor_test="interval")
    assert review.scheme("m", "fp8").checks.accuracy.outcome == "pass"
    # the citation must not claim the 98% estimate is >= 99%: it names the interval that reaches the floor
    cite = review.scheme("m", "fp8").checks.accuracy.cite
    assert "98.0% >= 99%" not in cite and "interval, up to" in cite and "does not rule out the 99% floor" in cite


def test_partial_records_never_win_and_say_why() -> None:
    recs = grid()
    gptq = next(r for r in recs if r["job"]["scheme"] == "gptq")
    gptq.update(status="failed", failed_stage="benchmark", error="RuntimeError: server died", speed={})
    review, v = verdict(recs, memory_budget_gib=0.22)
    assert v.chosen_scheme == "awq"  # gptq would have won but its latency could not be checked
    assert any(
        o.startswith(
            "gptq (W4A16): its job failed in stage benchmark (RuntimeError: server died); cannot be checked "
            "on latency (no speed results)"
        )
        for o in others(review, v)
    )
    card = next(c for c in review.scorecards if c.scheme == "gptq")
    assert any("job failed in stage benchmark: RuntimeError: server died" in m for m in card.missing)


def test_missing_everything_does_not_crash() -> None:
    bare = record("awq")
    for key in ("memory", "accuracy", "speed", "model"):
        bare[key] = {}
    bare["status"] = "failed"
    review, v = verdict([record("bf16"), bare], memory_budget_gib=0.22)
    assert v.decision == "no scheme meets all three"
    checks = review.scheme("m", "awq").checks
    assert {c.outcome for c in (checks.memory, checks.accuracy, checks.latency)} == {"unknown"}


def test_mismatched_eval_settings_are_excluded() -> None:
    recs = grid()
    next(r for r in recs if r["job"]["scheme"] == "awq")["accuracy"]["settings"]["limit"] = 50
    review, _v = verdict(recs, memory_budget_gib=0.22)
    awq = review.scheme("m", "awq").checks.accuracy
    assert awq.outcome == "unknown" and "limit: 50 vs baseline 100" in awq.text
    assert ("accuracy_refused", "awq") in {(f.code, f.scheme) for f in review.flags}


def test_no_baseline_no_verdict() -> None:
    _, v = verdict([r for r in grid() if r["job"]["scheme"] != "bf16"])
    assert v.decision == "no baseline"


def test_honesty_flags() -> None:
    recs = grid()
    recs[0] = record(
        "bf16", source="pypi_gguf", baseline_note="dequantized from GGUF Q4_1.", sp=speed(40.0, 300.0, e2e50=1400)
    )
    fp8 = next(r for r in recs if r["job"]["scheme"] == "fp8")
    fp8["memory"]["server"].update(fallback=True, fallback_lines=["Your GPU does not have native support for FP8"])
    fp8["speed"]["points"][1]["output_tokens_total"] = 200  # of 256 requested
    review, _ = verdict(recs)
    raised = {(f.code, f.scheme) for f in review.flags}
    assert ("gguf_baseline", "bf16") in raised
    assert ("fallback_kernel", "fp8") in raised
    # 200 of 256 output tokens is 78% < 90%: the point is invalid, not merely short
    (short,) = [f for f in review.flags if f.code == "speed_point_short"]
    assert short.scheme == "fp8" and "200 of 256" in short.message
    assert not [f for f in review.flags if f.code == "speed_point_short_kept"]


def test_two_models_two_verdicts() -> None:
    a = grid()
    b = [record(s, model="other", sp=speed(40.0, 300.0)) for s in ("bf16", "int8")]
    review = build_review(a + b, replace(RC, memory_budget_gib=0.30), "test")
    by_model = {v.model: v for v in review.verdicts}
    assert by_model["m"].chosen_scheme == "w8a8" and by_model["other"].chosen_scheme == "int8"


def test_regime_analysis() -> None:
    review, _v = verdict(grid())
    rows = {r.scheme: r for r in review.regime["m"]}
    # gptq: 40 / 25 = 1.6x at low load; 270 / 300 = 0.9x at saturation
    assert rows["gptq"].low_load_speedup == pytest.approx(1.6) and rows["gptq"].saturation_speedup == pytest.approx(0.9)
    assert rows["gptq"].reading == RegimeReading.PAYS_AT_LOW_LOAD_ONLY
    # w8a8: 40 / 33 = 1.21x and 400 / 300 = 1.33x
    assert rows["w8a8"].reading == RegimeReading.KEEPS_PAYING


def test_a_baseline_without_results_gives_no_verdict() -> None:
    recs = grid()
    recs[0].update(speed={})  # e.g. bench.enabled=false
    review, v = verdict(recs)
    assert v.decision == "baseline not checked" and v.chosen_scheme is None
    assert "bf16 (BF16) could not be checked on latency" in sentence(review, v)
    assert "review.ttft_ms_p99=null review.itl_ms_p99=null" in sentence(review, v)
    # with the SLO off, the verdict is back
    review, v = verdict(recs, ttft_ms_p99=None, itl_ms_p99=None)
    assert v.decision == "do not quantize"


def test_a_failed_job_is_never_chosen() -> None:
    # int8 has every number but its server did not start: not deployable as measured
    recs = grid()
    int8 = next(r for r in recs if r["job"]["scheme"] == "int8")
    int8.update(status="failed", failed_stage="benchmark", error="ServerError: no WNA16 kernel for uint8b128")
    # (0.30 GiB and a 99.5% recovery floor: int8 is the only scheme that would pass, see above)
    review, v = verdict(recs, memory_budget_gib=0.30, itl_ms_p99=None, ttft_ms_p99=None, min_recovery_pct=99.5)
    assert v.decision == "no scheme meets all three"
    assert any(
        o.startswith("int8 (W8A16): its job failed in stage benchmark (ServerError: no WNA16 kernel")
        for o in others(review, v)
    )
    # a baseline that did not finish gives no verdict, even when its numbers pass
    recs = grid()
    recs[0].update(status="failed", failed_stage="benchmark", error="ServerError: boom")
    review, v = verdict(recs)
    assert v.decision == "baseline not checked" and "did not finish" in sentence(review, v)


def test_an_interrupted_job_is_said_so_and_never_chosen() -> None:
    # the GPU machine was given back while int8's server was starting: no error, status "interrupted"
    recs = grid()
    int8 = next(r for r in recs if r["job"]["scheme"] == "int8")
    int8.update(status="interrupted", failed_stage="benchmark")
    review, v = verdict(recs, memory_budget_gib=0.30, itl_ms_p99=None, ttft_ms_p99=None, min_recovery_pct=99.5)
    assert v.decision == "no scheme meets all three"
    assert any(o.startswith("int8 (W8A16): its job was interrupted in stage benchmark") for o in others(review, v))
