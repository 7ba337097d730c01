"""The request shape in the review: every speedup holds for the shape it was swept at (bench.input_len,
bench.output_len), the review says which, and a scheme swept at another shape than its baseline's is flagged and
kept out of the speed comparisons instead of being divided by it."""

from __future__ import annotations

from quantverdict.config.schema import ReviewConfig
from quantverdict.review import build_review
from quantverdict.review.document import RegimeReading
from quantverdict.review.render import markdown
from review_records import synthetic_grid, synthetic_record

RC = ReviewConfig(log_to_mlflow=False, bootstrap_samples=200)


def test_one_shape_is_stated_in_the_speed_and_regime_sections() -> None:
    recs = synthetic_grid()  # every job swept 1,024 in / 128 out
    for r in recs:
        r["config"]["bench"]["name"] = "gpu-concurrency"
    review = build_review(recs, RC, "t")
    assert {sc.speed.workload.text for sc in review.scorecards} == {
        "1,024 in / 128 out tokens per request (bench=gpu-concurrency)"
    }
    md = markdown(review)
    sentence = "Request shape: 1,024 in / 128 out tokens per request (bench=gpu-concurrency). Every speedup here"
    speed_part = md.split("### Speed (vLLM serving sweep)", 1)[1].split("###", 1)[0]
    regime_part = md.split("### Regime: where quantization pays", 1)[1].split("##", 1)[0]
    assert sentence in speed_part and sentence in regime_part
    assert "workload_mismatch" not in {f.code for f in review.flags}
    assert all(
        r.saturation_speedup and r.low_load_speedup for r in review.regime["llama3.1-8b-shape"]
    )  # compared as before


def test_a_scheme_swept_at_another_shape_is_not_compared() -> None:
    recs = synthetic_grid()
    gptq = next(r for r in recs if r["job"]["scheme"] == "gptq")
    gptq["config"]["bench"].update(name="gpu-concurrency-prefill", input_len=2048)
    review = build_review(recs, RC, "t")
    flagged = [f for f in review.flags if f.code == "workload_mismatch"]
    assert [f.scheme for f in flagged] == ["gptq"]
    why = "swept at 2,048 in / 128 out tokens per request (bench=gpu-concurrency-prefill), its baseline bf16 at " \
          "1,024 in / 128 out tokens per request"  # fmt: skip
    assert flagged[0].message == f"gptq (W4A16): {why}: kept out of speed comparisons"
    rows = {r.scheme: r for r in review.regime["llama3.1-8b-shape"]}
    assert rows["gptq"].low_load_speedup is None and rows["gptq"].saturation_speedup is None  # no ratio across shapes
    assert rows["gptq"].reading == RegimeReading.EXCLUDED
    plain = {r.scheme: r for r in build_review(synthetic_grid(), RC, "t").regime["llama3.1-8b-shape"]}
    assert plain["gptq"].saturation_speedup is not None  # compared when the shapes agree
    for other in ("fp8", "w8a8"):  # the others compare with bf16 as before
        assert (rows[other].low_load_speedup, rows[other].saturation_speedup) == (
            plain[other].low_load_speedup,
            plain[other].saturation_speedup,
        )
    (v,) = review.verdicts
    assert v.request_shape is None  # the shapes differ: each scheme's is named
    assert v.request_shapes["bf16 (BF16)"].startswith("1,024 in / 128 out tokens per request")


def test_cross_model_candidates_at_different_shapes_are_flagged() -> None:

    small = [synthetic_record(s, model="small-shape") for s in ("bf16", "gptq")]
    big = [synthetic_record(s) for s in ("bf16", "gptq")]
    for r in small:
        r["config"]["bench"]["input_len"] = 2048  # the small model swept prefill-heavy, the big one 1,024 in
    review = build_review(small + big, RC, "t")
    assert "workload_mismatch" not in {f.code for f in review.flags}  # each model against its own baseline: same
    cm = review.cross_model
    assert cm is not None
    flagged = {c.name: c.flags for c in cm.candidates}
    want = (
        "swept at 2,048 in / 128 out tokens per request, other candidates at 1,024 in / 128 out tokens per request: "
        "its speed figures and ratios here compare different request shapes"
    )
    assert [n for n, f in flagged.items() if want in f] == [c.name for c in cm.candidates if c.model == "small-shape"]
    assert all(flagged[c.name] for c in cm.candidates)  # the big model's candidates flagged the other way round


def test_no_shape_sentence_without_sweep_points() -> None:
    recs = synthetic_grid()
    for r in recs:
        r["speed"]["points"] = []
    review = build_review(recs, RC, "t")
    assert "Request shape" not in markdown(review)
