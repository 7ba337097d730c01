"""review.json is a typed document: a program reads the decision, the binding constraint and the three numbers from
fields, validated against the committed JSON schema (docs/schema/review.schema.json), never from sentences.

Numbers of :func:`review_records.grid` at a 0.22 GiB budget (see tests/unit/test_review_verdict.py): the KV cache
for 16 x 288 tokens is 4,608 x 23,040 B = 0.098876953125 GiB, so bf16 needs 0.25 + 0.098877 = 0.348877 GiB
(fails: memory binds), the 8-bit schemes 0.15 + 0.098877 = 0.248877 GiB (fail), the 4-bit ones 0.10 + 0.098877 =
0.198877 GiB (fit). gptq is chosen: E2E p50 900 ms at 1 req/s against awq's 950 ms. Its accuracy: arc_easy acc_norm
0.48 / 0.50 = 96.0% recovery (floor 95%), word perplexity 21.0 / 20.0 = +5.0% and token perplexity 41.6 / 40.0 =
+4.0% (limit +5%). Its speed at 1 req/s: 30 output tok/s, TTFT p99 300 ms, ITL p99 1.5 x 25 = 37.5 ms; ceiling 270
output tok/s at 270 / 32 = 8.4375 req/s (the unlimited rate); per-user speed 40 / 25 = 1.6x bf16's.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError

from quantverdict.config.schema import ReviewConfig
from quantverdict.measure import stats
from quantverdict.review import build_review, to_json, write_review
from quantverdict.review.document import (
    SCHEMA_PATH,
    SCHEMA_VERSION,
    AccuracyDelta,
    DeltaKind,
    Interval,
    Review,
    schema_text,
)
from quantverdict.review.flags import FlagCode
from review_records import grid, record, speed

RC = ReviewConfig(log_to_mlflow=False, bootstrap_samples=1000, floor_test="point", memory_budget_gib=0.22)
KV_GIB = 4608 * 23040 / 2**30  # 0.098876953125


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The review of :func:`review_records.grid` under :data:`RC`, written once for the tests that read its files."""
    return write_review(build_review(grid(), RC, "test"), tmp_path_factory.mktemp("review"))


def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def validate(data: dict[str, Any]) -> None:
    """``data`` against the committed JSON schema, by jsonschema (not by the pydantic models that wrote it)."""
    jsonschema.Draft202012Validator(schema()).validate(data)


def test_the_committed_schema_is_the_generated_one() -> None:
    # `make schema` rewrites it from quantverdict.review.document; a model change without it fails here
    assert SCHEMA_PATH.read_text() == schema_text()
    jsonschema.Draft202012Validator.check_schema(schema())


def test_a_program_reads_the_decision_and_the_three_numbers(written: dict[str, Path]) -> None:
    paths = written
    data = json.loads(paths["json"].read_text())
    validate(data)
    assert data["schema_version"] == SCHEMA_VERSION == 4

    # the decision, from fields
    (v,) = data["verdicts"]
    assert (v["model"], v["decision"], v["chosen_scheme"], v["lever"]) == ("m", "quantize", "gptq", "weights")
    assert v["binding"] == ["memory"]
    passed = {p["scheme"]: p for p in v["passed_over"]}
    assert passed["awq"]["reason"] == "slower_same_tier" and passed["awq"]["fails"] == []
    assert passed["fp8"]["reason"] == "fails_constraint" and passed["fp8"]["fails"] == ["memory", "latency"]
    fp8_itl = next(c for c in passed["fp8"]["criteria"] if c["metric"] == "itl_ms_p99")
    assert (fp8_itl["threshold"], fp8_itl["observed"], fp8_itl["outcome"]) == (200.0, 225.0, "fail")  # 1.5 x 150
    int8_mem = passed["int8"]["criteria"]
    assert [(c["metric"], c["threshold"], c["outcome"]) for c in int8_mem] == [("need_gib", 0.22, "fail")]
    assert int8_mem[0]["observed"] == pytest.approx(0.15 + KV_GIB)

    # the binding constraint: the baseline's memory check, with the number it failed on
    cards = {c["scheme"]: c for c in data["scorecards"]}
    bf16_mem = cards["bf16"]["checks"]["memory"]
    assert bf16_mem["outcome"] == "fail"
    (crit,) = bf16_mem["criteria"]
    assert (crit["limit"], crit["comparison"], crit["threshold"]) == ("memory_budget_gib", "<=", 0.22)
    assert crit["observed"] == pytest.approx(0.25 + KV_GIB)

    # the three numbers of the chosen scheme
    gptq = cards["gptq"]
    assert gptq["memory"]["need_gib"] == pytest.approx(0.10 + KV_GIB)
    assert gptq["memory"]["weights_gib"] == 0.10 and gptq["memory"]["kv_needed_gib"] == pytest.approx(KV_GIB)
    assert gptq["memory"]["kv_needed_tokens"] == 4608 and gptq["memory"]["budget_gib"] == 0.22
    by_metric = {d["metric"]: d for d in gptq["accuracy"]["deltas"]}
    assert by_metric["acc_norm"]["recovery_pct"] == pytest.approx(96.0)
    assert by_metric["word_perplexity"]["delta_pct"] == pytest.approx(5.0)
    assert by_metric["token_perplexity"]["delta_pct"] == pytest.approx(4.0)
    at = gptq["speed"]["at_load"]
    assert (at["label"], at["output_tok_s"], at["ttft_ms_p99"], at["itl_ms_p99"]) == ("1 req/s", 30.0, 300.0, 37.5)
    ceiling = gptq["speed"]["ceiling"]
    assert (ceiling["output_tok_s"], ceiling["lower_bound"]) == (270.0, False)
    assert ceiling["rps"] == pytest.approx(270 / 32)
    head = gptq["headline"]
    assert head["memory_need_gib"] == pytest.approx(0.10 + KV_GIB)
    assert (head["accuracy"]["metric"], head["accuracy"]["unit"]) == ("word_perplexity", "%")
    assert head["accuracy"]["delta"] == pytest.approx(5.0)  # the worst of the judged perplexity kinds
    assert head["speed_ratio_at_load"]["value"] == pytest.approx(1.6) and head["speed_ratio_at_load"]["load"] == 1.0

    # each check's criteria: what was held against which limit, and how it came out
    checks = gptq["checks"]
    assert {k: c["outcome"] for k, c in checks.items()} == {"memory": "pass", "accuracy": "pass", "latency": "pass"}
    acc = [(c["metric"], c["subject"], c["threshold"], c["outcome"]) for c in checks["accuracy"]["criteria"]]
    assert acc == [
        ("recovery_pct", "arc_easy acc_norm", 95.0, "pass"),
        ("perplexity_increase_pct", "wikitext word_perplexity", 5.0, "pass"),  # +5.0% is not over +5%
        ("perplexity_increase_pct", "token_perplexity", 5.0, "pass"),
    ]
    lat = {c["metric"]: (c["threshold"], c["observed"]) for c in checks["latency"]["criteria"]}
    assert lat == {"ttft_ms_p99": (2000.0, 300.0), "itl_ms_p99": (200.0, 37.5), "ceiling_rps": (1.0, 270 / 32)}

    # the same through the typed model
    doc = Review.model_validate(data)
    assert doc.verdict("m").chosen_scheme == "gptq" and doc.scheme("m", "gptq").memory.need_gib == pytest.approx(
        0.10 + KV_GIB
    )


def test_a_program_reads_the_chosen_scheme_by_following_fields(written: dict[str, Path]) -> None:
    # what a program outside this package does: load the file, follow the verdict to the chosen scheme's card, read
    # its three headline numbers; the schema makes every key on that path required (present, maybe null)
    paths = written
    data = json.loads(paths["json"].read_text())
    validate(data)
    defs = schema()["$defs"]
    assert {"schema_version", "verdicts", "scorecards"} <= set(schema()["required"])
    assert {"model", "decision", "chosen_scheme", "binding", "passed_over"} <= set(defs["ModelVerdict"]["required"])
    assert {"model", "scheme", "headline", "checks"} <= set(defs["Scheme"]["required"])
    assert {"memory_need_gib", "accuracy", "speed_ratio_c1", "speed_ratio_at_load"} <= set(defs["Headline"]["required"])
    assert defs["ConstraintKind"]["enum"] == ["memory", "accuracy", "latency"]

    (v,) = data["verdicts"]
    chosen = next(c for c in data["scorecards"] if (c["model"], c["scheme"]) == (v["model"], v["chosen_scheme"]))
    assert (chosen["scheme"], chosen["label"], v["binding"]) == ("gptq", "W4A16", ["memory"])
    head = chosen["headline"]
    assert head["memory_need_gib"] == pytest.approx(0.10 + KV_GIB)  # 0.198877 GiB <= the 0.22 GiB budget
    acc = head["accuracy"]  # the worse of word perplexity (+5.0%) and token perplexity (+4.0%)
    assert (acc["metric"], acc["unit"], acc["delta"], acc["kind"]) == (
        "word_perplexity",
        "%",
        pytest.approx(5.0),
        "perplexity",
    )
    for key in ("speed_ratio_c1", "speed_ratio_at_load"):  # ITL p50 40 / 25 ms at 1 req/s, the lowest load too
        ratio = head[key]
        assert (ratio["value"], ratio["load"], ratio["label"], ratio["repeats"]) == (
            pytest.approx(1.6),
            1.0,
            "1 req/s",
            1,
        )

    # the typed model reads the same file back to the same JSON
    doc = Review.model_validate_json(paths["json"].read_text())
    assert doc.model_dump(mode="json") == data
    assert doc.scheme("m", doc.verdict("m").chosen_scheme or "").headline.speed_ratio_at_load is not None
    with pytest.raises(KeyError, match="models: m"):
        doc.verdict("other")
    with pytest.raises(KeyError, match="schemes: bf16, int8, fp8, w8a8, gptq, awq"):
        doc.scheme("m", "nvfp4")


def test_what_the_pages_show_is_in_the_document(written: dict[str, Path]) -> None:
    # the pages read only the document: the job counts, where each constraint comes from, the sweep points, the
    # floor tests and the plots written beside review.md
    paths = written
    data = json.loads(paths["json"].read_text())
    assert data["jobs"] == {"total": 6, "finished": 6, "failed": 0, "interrupted": 0}
    settings = {s["key"]: s for s in data["constraint_settings"]}
    # RC sets log_to_mlflow=False and the 0.22 GiB budget; the default set (gpu.yaml) says True and 24.0
    assert (settings["review.memory_budget_gib"]["value"], settings["review.memory_budget_gib"]["source"]) == (
        0.22,
        "override",
    )
    assert settings["review.log_to_mlflow"]["set_file_value"] is True
    assert settings["review.load_rps"] == {
        "key": "review.load_rps",
        "value": 1.0,
        "source": "set file",
        "set_file": settings["review.load_rps"]["set_file"],
        "set_file_value": 1.0,
    }
    ft = data["floor_tests"]
    assert ft["mode"] == "point" and "arc_easy" in ft["point"] and ft["interval"] == {}
    gptq = next(c for c in data["scorecards"] if c["scheme"] == "gptq")
    one = next(p for p in gptq["speed"]["points"] if p["label"] == "1 req/s")
    assert (one["load"], one["output_tok_s"], one["ttft_ms_p99"], one["valid_repeats"]) == (1.0, 30.0, 300.0, 1)
    assert gptq["speed"]["points"][-1]["load"] == "inf"  # the unlimited rate, strict JSON
    assert [p["file"] for p in data["plots"]] == [f"plots/{p['name']}.png" for p in data["plots"]]
    assert {p["name"] for p in data["plots"]} >= {"memory", "accuracy"}
    assert all((paths["json"].parent / p["file"]).is_file() for p in data["plots"])
    md = paths["md"].read_text()  # the page says what the fields say
    assert "| review.memory_budget_gib | 0.22 | **set** (" in md and "| gptq (W4A16) | 1 req/s |" in md


def test_regime_claims_are_fields() -> None:
    # w8a8 against bf16: ITL p50 40 / 33 = 1.212x at low load, ceilings 400 / 300 = 1.333x; one run each, so the
    # 1.05x rule on the single value: pays at both
    data = to_json(build_review(grid(), RC, "test"))
    validate(data)
    (w8a8,) = [r for r in data["regime"]["m"] if r["scheme"] == "w8a8"]
    low, sat = w8a8["low_load_claim"], w8a8["saturation_claim"]
    assert (low["rule"], low["class"], sat["rule"], sat["class"]) == ("single run", "pays", "single run", "pays")
    assert low["speedup"] == pytest.approx(40 / 33) and sat["speedup"] == pytest.approx(400 / 300)
    assert w8a8["saturation_not_compared"] is None and low["low"] is None
    assert w8a8["reading"] == "keeps_paying"


def test_flags_carry_their_code_and_scheme() -> None:
    recs = grid()
    recs[2] = record("fp8", fallback=True, acc_norm=0.49, wppl=20.2, tppl=40.2, sp=speed(150.0, 100.0, e2e50=5000))
    data = to_json(build_review(recs, RC, "test"))
    validate(data)
    fallback = [f for f in data["flags"] if f["code"] == FlagCode.FALLBACK_KERNEL]
    assert [(f["model"], f["scheme"]) for f in fallback] == [("m", "fp8")]
    assert fallback[0]["message"].startswith("fp8 (FP8_DYNAMIC): the vLLM server log shows a fallback kernel")


def test_every_flag_code_is_in_the_schema() -> None:
    # a code added to FlagCode needs `make schema`, or the committed schema refuses the review.json that carries it
    assert set(schema()["$defs"]["FlagCode"]["enum"]) == {c.value for c in FlagCode}


def test_an_unknown_key_is_refused(tmp_path: Path) -> None:
    data = to_json(build_review(grid(), RC, "test"))
    top = {**data, "verdict_note": "deploy gptq"}
    with pytest.raises(ValidationError, match="verdict_note"):
        Review.model_validate(top)
    with pytest.raises(jsonschema.ValidationError, match="verdict_note"):
        validate(top)
    nested = json.loads(json.dumps(data))
    nested["scorecards"][0]["checks"]["memory"]["criteria"][0]["margin_gib"] = 0.1
    with pytest.raises(ValidationError, match="margin_gib"):
        Review.model_validate(nested)
    with pytest.raises(jsonschema.ValidationError, match="margin_gib"):
        validate(nested)


def test_the_json_reads_back_as_the_same_document() -> None:
    review = build_review(grid(), RC, "test")
    back = Review.model_validate(json.loads(json.dumps(to_json(review))))
    assert math.isinf(back.scheme("m", "gptq").speed.points[-1].load)  # written "inf", read back as infinity
    assert to_json(back) == to_json(review)


def test_a_number_that_is_not_finite_is_written_as_null() -> None:
    assert Interval.of(stats.Interval(0.5, math.nan, 1.0, "paired bootstrap")) is None and Interval.of(None) is None
    iv = Interval.of(stats.Interval(0.5, 0.25, 1.0, "paired bootstrap", n=40))
    assert iv is not None and (iv.estimate, iv.low, iv.high, iv.n, iv.unit) == (0.5, 0.25, 1.0, 40, "item")
    d = AccuracyDelta.new("kld", "refused", DeltaKind.KLD, math.nan, 0.0, delta_pct=math.inf, n=3)
    assert (d.value, d.baseline, d.delta_pct, d.n, d.interval, d.paired, d.note) == (
        None,
        0.0,
        None,
        3,
        None,
        False,
        "",
    )


def test_a_value_outside_the_schema_is_refused() -> None:
    data = to_json(build_review(grid(), RC, "test"))
    data["flags"].append({"code": "no_such_code", "model": "m", "scheme": "gptq", "message": "gptq (W4A16): made up"})
    with pytest.raises(ValueError, match="no_such_code"):
        Review.model_validate(data)


def test_a_decision_without_a_baseline_is_typed_too() -> None:
    # no bf16: no verdict. With no accuracy floor, int8 (0.248877 GiB <= 0.30, ITL p99 51 ms) passes every check
    # and is passed over for want of a verdict; fp8 fails latency (ITL p99 225 ms > 200 ms)
    recs = [r for r in grid() if r["job"]["scheme"] != "bf16"]
    rc = replace(RC, memory_budget_gib=0.30, min_recovery_pct=None, max_perplexity_increase_pct=None)
    data = to_json(build_review(recs, rc, "test"))
    validate(data)
    (v,) = data["verdicts"]
    assert (v["decision"], v["chosen_scheme"], v["binding"], v["kv_lever"]) == ("no baseline", None, [], None)
    passed = {p["scheme"]: (p["reason"], p["fails"]) for p in v["passed_over"]}
    assert passed["int8"] == ("no_verdict", []) and passed["fp8"] == ("fails_constraint", ["latency"])
    # with the floors, no delta can be computed without a baseline: accuracy cannot be checked
    data = to_json(build_review(recs, replace(RC, memory_budget_gib=0.30), "test"))
    gptq = next(p for p in data["verdicts"][0]["passed_over"] if p["scheme"] == "gptq")
    assert (gptq["reason"], gptq["not_checked"]) == ("not_checked", ["accuracy"])


def test_a_criterion_says_which_test_judged_it() -> None:
    # fp8 recovers 0.49 / 0.50 = 98.0% of acc_norm against a 99% floor: the point test fails it; its unpaired
    # interval (stderr 0.05 each) reaches above 99%, so the interval test passes it on the interval's upper end
    base = replace(RC, memory_budget_gib=None, min_recovery_pct=99.0, max_perplexity_increase_pct=None)
    for test, outcome in (("point", "fail"), ("interval", "pass")):
        data = to_json(build_review(grid(), replace(base, floor_test=test), "test"))
        fp8 = next(c for c in data["scorecards"] if c["scheme"] == "fp8")
        (crit,) = fp8["checks"]["accuracy"]["criteria"]
        assert (crit["test"], crit["outcome"], crit["threshold"]) == (test, outcome, 99.0)
        assert crit["observed"] == pytest.approx(98.0)
        delta = next(d for d in fp8["accuracy"]["deltas"] if d["metric"] == "acc_norm")
        judged = delta["recovery_interval"]["high"] if test == "interval" else delta["recovery_pct"]
        assert crit["judged"] == judged and (crit["judged"] > 99.0) == (test == "interval")


def test_a_load_beyond_the_ceiling_is_a_failed_criterion() -> None:
    # 20 req/s: bf16's ceiling is 300 / 32 = 9.375 req/s, below the load
    data = to_json(build_review(grid(), replace(RC, load_rps=20.0), "test"))
    bf16 = next(c for c in data["scorecards"] if c["scheme"] == "bf16")
    crit = next(c for c in bf16["checks"]["latency"]["criteria"] if c["metric"] == "ceiling_rps")
    assert (crit["threshold"], crit["observed"], crit["outcome"]) == (20.0, 9.375, "fail")
    assert bf16["checks"]["latency"]["outcome"] == "fail" and "latency" in data["verdicts"][0]["binding"]
