"""Candidates across models on a deployment target: figures a person worked out from the records.

H200 records of the GPU study, copied to tests/fixtures/gpu-records (vLLM 0.26, bench.server.gpu_memory_utilization
0.9, H200 143,771 MiB = 140.4013671875 GiB, so vLLM's budget there is 126.36123046875 GiB), reviewed for the A10G
(23,028 MiB = 22.48828125 GiB x 0.9 = 20.239453125 GiB):

| job | vLLM weights | vLLM KV | reserve = 126.36123 - w - KV | A10G KV = 20.239453 - w - reserve |
|---|---|---|---|---|
| qwen3.5-9b-shape bf16 | 16.71 | 107.84 | 1.81123046875 | 1.71822265625 GiB |
| qwen3.5-9b-shape gptq | 9.41 | 115.14 | 1.81123046875 | 9.01822265625 GiB |
| llama3.1-8b-shape bf16 | 15.00 | 109.49 | 1.87123046875 | 3.36822265625 GiB |

Qwen3.5-9B pages a 4,096-token sequence in (16 x 8 + 24) x 1,114,112 = 169,345,024 B (measure/kv_cache.py):
1.71822265625 GiB = 1,844,929,... B -> 10 sequences (40,960 tokens); 9.01822265625 GiB -> 57.18 -> 57 (233,472
tokens). Llama-3.1-8B: 131,072 B/token = 8,192 tokens a GiB: 3.36822265625 x 8192 = 27,592.48 -> 27,592
tokens = 6.74 requests of 4,096 tokens, fewer than the 16 the GPU set asks: flagged.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from quantverdict.config.schema import ReviewConfig, TargetConfig
from quantverdict.review import build_review, gpus, to_json
from quantverdict.review.constraints import load_set
from quantverdict.review.crossmodel import (
    ROOFLINE_BYTES,
    speed_vs_bytes,
    target_price,
    vllm_int_arg,
)
from quantverdict.review.document import Candidate, TargetFit, VllmFigures
from quantverdict.review.render import markdown
from quantverdict.review.sources import load_dir
from review_records import record, synthetic_grid, write_samples

# three H200 records of the committed GPU study, copied: the unit tier reads no committed results
RECORDS = Path(__file__).resolve().parents[1] / "fixtures" / "gpu-records"
JOBS = ("qwen3.5-9b-shape/bf16", "qwen3.5-9b-shape/gptq", "llama3.1-8b-shape/bf16")


def _grid(tmp: Path, edit: dict[str, dict] | None = None) -> Path:
    for job in JOBS:
        shutil.copytree(RECORDS / job, tmp / job.replace("/", "_"))
    for job, change in (edit or {}).items():
        p = tmp / job.replace("/", "_") / "record.json"
        rec = json.loads(p.read_text())
        rec["config"]["bench"]["server"].update(change)
        p.write_text(json.dumps(rec))
    return tmp


def _review(src: Path, **kw: object):  # type: ignore[no-untyped-def]
    rc = replace(load_set("gpu"), log_to_mlflow=False, bootstrap_samples=1000, **kw)
    records, _ = load_dir(src)
    return build_review(records, rc, str(src), [])


def test_memory_on_the_a10g_from_h200_records(tmp_path: Path) -> None:
    cm = _review(_grid(tmp_path), target="a10g").cross_model
    assert cm is not None and cm.target is not None and cm.target.gpu == "NVIDIA A10G"
    by = {f"{c.model} {c.scheme}": c for c in cm.candidates}
    bf16, gptq, llama = (
        by["qwen3.5-9b-shape bf16"].target,
        by["qwen3.5-9b-shape gptq"].target,
        by["llama3.1-8b-shape bf16"].target,
    )
    assert bf16.reserve_gib == pytest.approx(1.81123046875) and gptq.reserve_gib == pytest.approx(1.81123046875)
    assert llama.reserve_gib == pytest.approx(1.87123046875)
    assert bf16.kv_gib == pytest.approx(1.71822265625)
    assert (bf16.kv_tokens, bf16.max_concurrency) == (40_960, 10.0)
    assert gptq.kv_gib == pytest.approx(9.01822265625)
    assert (gptq.kv_tokens, gptq.max_concurrency) == (233_472, 57.0)
    assert llama.kv_gib == pytest.approx(3.36822265625)
    assert llama.kv_tokens == 27_592 and llama.max_concurrency == pytest.approx(27_592 / 4096)
    assert (
        by["llama3.1-8b-shape bf16"].flags
        and "6.7 max-length (4,096-token) requests" in by["llama3.1-8b-shape bf16"].flags[0]
    )
    # vLLM's figures are those of the H200's own budget, said so
    assert by["qwen3.5-9b-shape gptq"].vllm.kv_gib == 115.14
    assert by["qwen3.5-9b-shape gptq"].vllm.how == "the budget where the job ran"
    # the bigger model quantized (9B W4A16) against the smaller unquantized (8B bf16): memory and speed each
    # named, accuracy not measured (random weights); 57 vs 6.7 -> "57 vs 7"
    (c,) = cm.comparisons
    assert (c.bigger, c.smaller) == ("qwen3.5-9b-shape gptq (W4A16)", "llama3.1-8b-shape bf16 (BF16)")
    assert (c.memory_winner, c.memory_bigger) == ("qwen3.5-9b-shape", 57.0)
    assert c.memory_smaller == pytest.approx(27_592 / 4096)
    assert (c.tasks, c.speed_winner) == (0, "llama3.1-8b-shape")
    assert (round(c.speed_bigger or 0), round(c.speed_smaller or 0)) == (1220, 9710)
    assert (
        cm.target is not None
        and cm.target.gpu == "NVIDIA A10G"
        and cm.target.budget_gib == pytest.approx(20.2395, 1e-5)
    )
    assert not cm.ran_on_target and any(line.startswith("GPU: NVIDIA H200") for line in cm.ran)
    # review.json carries the same result: the target, the chosen candidate and each candidate's A10G figures
    cmj = to_json(_review(tmp_path, target="a10g"))["cross_model"]
    assert cmj["target"]["gpu"] == "NVIDIA A10G" and cmj["chosen"] == cm.chosen
    by_name = {c["name"]: c for c in cmj["candidates"]}
    assert by_name["qwen3.5-9b-shape gptq (W4A16)"]["target"]["max_concurrency"] == 57.0
    assert cmj["comparisons"] == [c.model_dump(mode="json") for c in cm.comparisons]
    # the first screen opens on the question asked: the cross-model verdict before the per-model ones
    full = markdown(_review(tmp_path, target="a10g"))
    assert full.startswith("# quantverdict review\n\n> Across models, on NVIDIA A10G: deploy **")
    assert full.index("> Across models") < full.index("## llama3.1-8b-shape")
    # the comparison and the target note in words (crossmodel_text.j2)
    assert (
        "- qwen3.5-9b-shape gptq (W4A16) vs llama3.1-8b-shape bf16 (BF16): memory: qwen3.5-9b-shape (57 vs 7 "
        "concurrent max-length requests on a10g); accuracy: not compared (not measured on both); speed: "
        "llama3.1-8b-shape (ceiling 1220 vs 9710 output tok/s)\n"
    ) in full
    assert (
        "GiB x vLLM memory fraction 0.9 = 20.24 GiB" in full and "not for where the jobs ran (GPU: NVIDIA H200" in full
    )


def test_a_job_served_at_the_targets_budget_shows_vllms_figures_beside(tmp_path: Path) -> None:
    # the 9B gptq served on the H200 with gpu_memory_utilization = 20.239453125 / 140.4013671875 = 0.144154:
    # vLLM's budget is the A10G's (the record's KV figures are left as they are; only the budget is judged)
    src = _grid(tmp_path, {"qwen3.5-9b-shape/gptq": {"gpu_memory_utilization": 0.144154}})
    cm = _review(src, target="a10g").cross_model
    assert cm is not None
    gptq = next(c for c in cm.candidates if c.scheme == "gptq")
    # 0.144154 x 140.4013671875 = 20.2394 GiB, within 2% of the target's 20.2395
    assert gptq.vllm.how == "the target's budget: memory fraction x GPU memory = 20.24 GiB"
    # a fixed KV cache (--kv-cache-memory-bytes) 9.01822265625 GiB = 9,683,... bytes; the reserve then comes
    # from review.reserved_gib (vLLM's own overhead is not in the log), here the measured 1.81123046875
    kv = int(9.01822265625 * 2**30)
    src2 = _grid(tmp_path / "b", {"qwen3.5-9b-shape/gptq": {"extra_args": ["--kv-cache-memory-bytes", str(kv)]}})
    cm2 = _review(src2, target="a10g", reserved_gib=1.81123046875).cross_model
    assert cm2 is not None
    g2 = next(c for c in cm2.candidates if c.scheme == "gptq")
    # 9.01822265625 x 2^30 = 9,683,242,844 bytes: the target's KV budget (within 5%)
    assert g2.vllm.how == "the target's budget: --kv-cache-memory-bytes 9,683,242,844 = 9.02 GiB"


def test_emulating_the_a10g_on_the_h200_flags_the_h200s_batch_limits(tmp_path: Path) -> None:
    # served at the A10G's budget but with vLLM's H200 defaults (1024 sequences, 8,192 batched tokens: 143,771 MiB
    # >= 70 GiB and not an A100); on the A10G (22.49 GiB) vLLM picks 256 and 2,048
    src = _grid(tmp_path, {"qwen3.5-9b-shape/gptq": {"gpu_memory_utilization": 0.144154, "max_num_seqs": None}})
    gptq = next(c for c in _review(src, target="a10g").cross_model.candidates if c.scheme == "gptq")  # type: ignore[union-attr]
    assert any("max_num_seqs 1024, max_num_batched_tokens 8,192" in f and "picks 256, 2,048" in f for f in gptq.flags)
    # the same job with the A10G's limits set: no flag
    src2 = _grid(
        tmp_path / "b",
        {
            "qwen3.5-9b-shape/gptq": {
                "gpu_memory_utilization": 0.144154,
                "max_num_seqs": 256,
                "extra_args": ["--max-num-batched-tokens", "2048"],
            }
        },
    )
    g2 = next(c for c in _review(src2, target="a10g").cross_model.candidates if c.scheme == "gptq")  # type: ignore[union-attr]
    assert not any("max_num_seqs" in f for f in g2.flags)


def test_a_job_without_a_server_borrows_the_largest_measured_reserve(tmp_path: Path) -> None:
    # the 9B bf16 with its vLLM figures removed (as a bench.enabled=false job): no overhead of its own, so it takes
    # the largest measured on the others: llama3.1-8b-shape bf16's 1.87123046875 GiB (above the gptq's 1.81123...)
    src = _grid(tmp_path)
    p = src / "qwen3.5-9b-shape_bf16" / "record.json"
    rec = json.loads(p.read_text())
    rec["memory"]["server"] = None
    p.write_text(json.dumps(rec))
    cm = _review(src, target="a10g").cross_model
    assert cm is not None
    bf16 = next(c for c in cm.candidates if c.model == "qwen3.5-9b-shape" and c.scheme == "bf16")
    assert bf16.target.reserve_gib == pytest.approx(1.87123046875)
    assert bf16.target.reserve_how == "no server ran: vLLM's overhead measured for llama3.1-8b-shape bf16 (BF16)"


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["--kv-cache-memory-bytes", "7140383539"], 7_140_383_539),
        # vLLM's human_readable_int: lowercase decimal, uppercase binary (integers only), no "Gi" form
        (["--x", "--kv-cache-memory-bytes=8g"], 8_000_000_000),
        (["--x", "--kv-cache-memory-bytes=8G"], 8 * 2**30),
        (["--kv-cache-memory-bytes", "6.65g"], 6_650_000_000),
        (["--kv-cache-memory-bytes", "6.65G"], None),
        (["--kv-cache-memory-bytes", "6.65Gi"], None),
        (["--gpu-memory-utilization", "0.9"], None),
    ],
)
def test_parse_kv_cache_memory_bytes(args: list[str], want: int | None) -> None:
    assert vllm_int_arg(args, "--kv-cache-memory-bytes") == want


def _rows(values: list[int]) -> list[dict]:
    return [{"doc_id": i, "acc": v, "acc_norm": v} for i, v in enumerate(values)]


def test_absolute_accuracy_paired_across_models(tmp_path: Path) -> None:
    # "big" (2 GiB at 16 bits) quantized to 0.6 GiB against "small" (1 GiB) unquantized, on the same 10 items:
    # big awq [1,1,1,1,0,0,0,0,0,0] (0.4), small bf16 [0,0,1,1,0,0,0,0,0,1] (0.3): +0.1, paired normal interval
    # low -0.251824 (the hand value of test_review_stats): not significant -> neither wins accuracy
    big_base = record("bf16", model="big", acc_norm=0.45, weights_gib=2.0)
    big_q = record("awq", model="big", acc_norm=0.4, weights_gib=0.6)
    small = record("bf16", model="small", acc_norm=0.3, weights_gib=1.0)
    write_samples(big_q, tmp_path, "arc_easy", _rows([1, 1, 1, 1, 0, 0, 0, 0, 0, 0]))
    small["job"]["scheme"] = "bf16"
    (tmp_path / "s").mkdir()
    write_samples(small, tmp_path / "s", "arc_easy", _rows([0, 0, 1, 1, 0, 0, 0, 0, 0, 1]))
    for rec in (big_base, big_q, small):
        d = tmp_path / "grid" / rec["job"]["id"]
        d.mkdir(parents=True)
        (d / "record.json").write_text(json.dumps(rec))
    records, _ = load_dir(tmp_path / "grid")
    rc = ReviewConfig(log_to_mlflow=False, interval="normal", memory_budget_gib=24.0)
    cm = build_review(records, rc, str(tmp_path / "grid"), []).cross_model
    assert cm is not None and cm.target is None
    (row,) = cm.paired
    assert (row.bigger, row.smaller, row.task, row.n) == ("big awq (W4A16)", "small bf16 (BF16)", "arc_easy", 10)
    assert row.difference == pytest.approx(0.1) and round(row.low or 0.0, 4) == -0.2518 and not row.significant
    (c,) = cm.comparisons
    assert c.memory_winner == "big"
    assert (c.memory_bigger, c.memory_smaller) == (pytest.approx(0.6), pytest.approx(1.0))
    assert (c.tasks, c.accuracy_winner, c.wins_bigger, c.wins_smaller) == (1, None, 0, 0)
    # the absolute scores, with each model's own quantization delta beside: big awq 0.4 - 0.45 = -0.05
    doc = build_review(records, rc, str(tmp_path / "grid"), [])
    assert doc.cross_model is not None and not hasattr(doc.cross_model, "error")
    assert (
        "big awq (W4A16) vs small bf16 (BF16): memory: big (weights 0.60 vs 1.00 GiB); accuracy: neither (no "
        "significant difference) (0 of 1 tasks significantly better for the bigger, 0 for the smaller)"
    ) in markdown(doc)
    by = {c.name: c.scores["arc_easy"] for c in doc.cross_model.candidates}  # type: ignore[union-attr]
    big, small = by["big awq (W4A16)"], by["small bf16 (BF16)"]
    assert (big.metric, big.value, big.n, big.own_delta_kind) == ("acc_norm", 0.4, 100, "score")
    assert big.own_delta == pytest.approx(-0.05)
    assert (small.value, small.n, small.own_delta) == (0.3, 100, None)  # the baseline: no own delta


def test_one_model_without_a_target_has_no_section() -> None:
    rc = ReviewConfig(log_to_mlflow=False)
    rv = build_review([record("bf16"), record("awq")], rc, "one-model", [])
    assert rv.cross_model is None and to_json(rv)["cross_model"] is None


def test_decode_fit_and_byte_ratio_of_a_synthetic_grid() -> None:
    # review_records.SYN bf16: TPOT 5, 6, 9, 20 ms at c = 1, 16, 64, 256. Means 84.25 seqs and 10 ms;
    # Sxy = 83.25x5 + 68.25x4 + 20.25x1 + 171.75x10 = 2,427; Sxx = 41,496.75; Syy = 142
    # -> 2,427 / 41,496.75 = 0.0584864 ms/seq = 58.49 µs/seq, fixed 10 - 0.0584864 x 84.25 = 5.07253 ms,
    # R^2 = 2,427^2 / (41,496.75 x 142) = 0.999625
    rc = replace(load_set("gpu"), log_to_mlflow=False, target="h100")
    cm = build_review(synthetic_grid(), rc, "synthetic", []).cross_model
    assert cm is not None
    bf16 = next(c for c in cm.candidates if c.scheme == "bf16")
    fit = bf16.decode_fit
    assert fit is not None and fit.points == 4
    assert fit.per_seq_us == pytest.approx(1000 * 2427 / 41496.75)
    assert fit.fixed_us == pytest.approx(1000 * (10 - 84.25 * 2427 / 41496.75))
    assert fit.r2 == pytest.approx(2427**2 / (41496.75 * 142))
    # bytes per step from the roofline (every candidate has it): bf16 16.0e9, gptq 5.0e9 -> gptq predicted
    # 16 / 5 = 3.2x bf16 (reference: the only model's baseline)
    assert cm.reference == bf16.name and bf16.step_bytes == 16.0e9
    gptq = next(c for c in cm.candidates if c.scheme == "gptq")
    assert gptq.ceiling_tok_s is not None and bf16.ceiling_tok_s is not None
    measured = gptq.ceiling_tok_s / bf16.ceiling_tok_s
    r = gptq.speed_vs_bytes
    assert r is not None and r.predicted_ratio == pytest.approx(3.2)
    assert r.measured_ratio == pytest.approx(measured) and r.measured_over_predicted == pytest.approx(measured / 3.2)


def _cand(name: str, tok_s: float, gb: float, how: str, weights_gib: float | None = None) -> Candidate:
    """A candidate with a ceiling and bytes per decode step, nothing else."""
    model, scheme = name.split()
    return Candidate(
        name=name,
        model=model,
        scheme=scheme,
        weights_gib=weights_gib,
        weights_how="",
        target=TargetFit(),
        vllm=VllmFigures(),
        ceiling_tok_s=tok_s,
        ceiling_lower_bound=False,
        step_bytes=gb * 1e9,
        step_bytes_how=how,
        decode_fit=None,
        decode_fit_itl=None,
        fit_levels=0,
        scores={},
        why_not=[],
        flags=[],
    )


def test_seed_ratio_rendered() -> None:
    # the seed: 4B fp16 (8.61 GB/step, 1,092 tok/s) as reference, 9B AWQ (11.21 GB/step, 821 tok/s):
    # measured 821 / 1092 = 0.75, predicted 8.61 / 11.21 = 0.77, measured / predicted = 0.98
    four, nine = _cand("4b bf16", 1092, 8.61, "weights GiB"), _cand("9b awq", 821, 11.21, "weights GiB")
    r = speed_vs_bytes(four, nine, 1, None)
    assert r is not None
    assert [round(v, 2) for v in (r.measured_ratio, r.predicted_ratio)] == [0.75, 0.77]
    assert round(r.measured_over_predicted, 2) == 0.98
    assert r.by_weights_ratio is None and r.usd_per_mtok_ceiling is None  # bytes are the weights; no price


def test_roofline_bytes_beside_the_all_weights_prediction() -> None:
    # bytes a step streams (roofline: embeddings looked up, not read): 4B 8.0 GB, 9B AWQ 7.6 GB -> predicted
    # 8.0 / 7.6 = 1.05; measured 4,216 / 5,427 = 0.78 -> 0.74 of it. All weights (the seed's method): 7.94 / 9.49
    # = 0.84 -> measured / that 0.78 / 0.837 = 0.93
    four = _cand("4b bf16", 5427, 8.0, ROOFLINE_BYTES, weights_gib=7.94)
    nine = _cand("9b awq", 4216, 7.6, ROOFLINE_BYTES, weights_gib=9.49)
    r = speed_vs_bytes(four, nine, 1, None)
    assert r is not None
    ratios = (r.measured_ratio, r.predicted_ratio, r.measured_over_predicted)
    assert [round(v, 2) for v in ratios] == [0.78, 1.05, 0.74]
    assert [round(v or 0.0, 2) for v in (r.by_weights_ratio, r.measured_over_by_weights)] == [0.84, 0.93]


def test_price_per_hour_gives_cost_per_million_tokens() -> None:
    # $1.006 per GPU-hour: 1.006 / (1,092 tok/s x 3,600 s) x 1e6 = $0.2559; at 821 tok/s $0.3404
    four, nine = _cand("4b bf16", 1092, 8.61, "weights GiB"), _cand("9b awq", 821, 11.21, "weights GiB")
    usd = [r.usd_per_mtok_ceiling if (r := speed_vs_bytes(four, c, 1, 1.006)) else None for c in (four, nine)]
    assert usd == [pytest.approx(1.006 / (1092 * 3600) * 1e6), pytest.approx(1.006 / (821 * 3600) * 1e6)]
    assert [round(u or 0.0, 3) for u in usd] == [0.256, 0.340]
    # the 9b served with TP=2 holds two GPUs at the same 821 tok/s: 2 x $0.3404 = $0.681
    r = speed_vs_bytes(four, nine, 2, 1.006)
    assert r is not None and round(r.usd_per_mtok_ceiling or 0.0, 3) == 0.681


def test_the_target_price_applies_only_where_the_records_ran_on_the_target_gpu() -> None:
    a10g = TargetConfig(name="a10g", gpu="NVIDIA A10G", memory_gib=22.48828125, price_per_hour=1.006)
    a100 = TargetConfig(name="a100-80gb", gpu="NVIDIA A100 80GB", memory_gib=80.0, price_per_hour=1.5)

    def price(env: list[str], target: TargetConfig, ran: list[str], **prices: float) -> tuple[float | None, str]:
        return target_price(ReviewConfig(log_to_mlflow=False, gpu_price_per_hour=prices), env, target, ran)

    h100 = ["GPU: NVIDIA H100 80GB HBM3 (x1)", "CPU: x"]
    # A100 80GB's "80GB" alone does not make an H100 80GB HBM3 the target's GPU
    assert not gpus.gpu_kind_matches(a100.gpu, h100[0]) and gpus.gpu_kind_matches(a100.gpu, "NVIDIA A100-SXM4-80GB")
    assert price(h100, a100, []) == (None, "not comparable: ran on NVIDIA H100 80GB HBM3")
    on = ["GPU: NVIDIA A10G (x1)"]
    assert price(on, a10g, on) == (1.006, "target a10g price_per_hour")
    assert price(on, a10g, on, A10G=1.2) == (1.2, "review.gpu_price_per_hour.A10G")
    assert price(on, replace(a10g, price_per_hour=None), on) == (None, "")


def test_a_difference_inside_the_interval_goes_to_the_less_aggressive_scheme(tmp_path: Path) -> None:
    # model m: bf16 0.50, w8a8 0.52 (arc_easy acc_norm, stderr 0.05 each: the unpaired 95% interval of +0.02 is
    # +0.02 +- 1.96 x 0.0707 = [-0.119, +0.159], not significant) -> w8a8 scores as bf16's 0.50 and bf16 (less
    # aggressive) is named; model n's bf16 (0.30) is lower
    rc = ReviewConfig(log_to_mlflow=False, max_perplexity_increase_pct=None)
    recs = [record("bf16", acc_norm=0.50), record("w8a8", acc_norm=0.52), record("bf16", model="n", acc_norm=0.30)]
    for rec in recs:
        (tmp_path / rec["job"]["id"]).mkdir()
        (tmp_path / rec["job"]["id"] / "record.json").write_text(json.dumps(rec))
    records, _ = load_dir(tmp_path)
    cm = build_review(records, rc, str(tmp_path), []).cross_model
    assert cm is not None and cm.chosen is not None
    assert cm.chosen == "m bf16 (BF16)", [(c.name, c.why_not) for c in cm.candidates]
    chosen = next(c for c in cm.candidates if c.name == cm.chosen)
    assert cm.score_tasks == ["arc_easy"] and chosen.mean_score == pytest.approx(0.5)


def test_pairing_across_models_uses_doc_hash_when_present(tmp_path: Path) -> None:
    # the same 4 items, listed in another order (doc_id differs) but with the same doc_hash: big [1,1,0,0] on
    # items a,b,c,d; small lists d,c,b,a with [0,0,1,0] -> small on a,b,c,d = [0,1,0,0]. Paired on the hash the
    # differences are [1,0,0,0]: mean +0.25, sd 0.5, se 0.25, 95% interval 0.25 -+ 1.959964 x 0.25 =
    # [-0.2400, +0.7400] (paired on doc_id they would be [1,1,-1,0]: sd 0.957, [-0.688, +1.188])
    big_base = record("bf16", model="big", weights_gib=2.0)
    big_q = record("awq", model="big", weights_gib=0.6)
    small = record("bf16", model="small", weights_gib=1.0)
    rows = lambda keys, vals: [  # noqa: E731
        {"doc_id": i, "doc_hash": k, "acc": v, "acc_norm": v} for i, (k, v) in enumerate(zip(keys, vals))
    ]
    write_samples(big_q, tmp_path, "arc_easy", rows("abcd", [1, 1, 0, 0]))
    (tmp_path / "s").mkdir()
    write_samples(small, tmp_path / "s", "arc_easy", rows("dcba", [0, 0, 1, 0]))
    for rec in (big_base, big_q, small):
        d = tmp_path / "grid" / rec["job"]["id"]
        d.mkdir(parents=True)
        (d / "record.json").write_text(json.dumps(rec))
    records, _ = load_dir(tmp_path / "grid")
    cm = (
        build_review(records, ReviewConfig(log_to_mlflow=False, interval="normal"), str(tmp_path / "grid"), [])
    ).cross_model
    assert cm is not None
    (row,) = cm.paired
    assert row.difference == pytest.approx(0.25) and row.n == 4
    assert (round(row.low or 0.0, 4), round(row.high or 0.0, 4)) == (-0.24, 0.74)


def test_cross_model_flags_reach_the_honesty_section_and_the_target_budget_is_labelled(tmp_path: Path) -> None:
    # llama3.1-8b-shape bf16 holds 6.74 max-length requests on the A10G, fewer than the 16 asked: flagged in
    # "Across models" and, so that the honesty section does not say "nothing flagged", there too
    doc = _review(_grid(tmp_path), target="a10g", memory_budget_gib=20.2395)
    md = markdown(doc)
    honesty = md[md.index("## Honesty checks") :]
    assert "llama3.1-8b-shape bf16 (BF16), across models: fits the stated load, but its 3.37 GiB" in honesty
    # 20.2395 GiB = 22.48828125 x 0.9 rounded to 4 places: the target's, not a value the user set
    (budget,) = [s for s in doc.constraint_settings if s.key == "review.memory_budget_gib"]
    assert (budget.value, budget.source, budget.set_file, budget.set_file_value) == (
        20.2395,
        "target",
        "gpu.yaml",
        24.0,
    )


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["--max-num-batched-tokens", "2048"], 2048),
        (["--max-num-batched-tokens=2k"], 2000),  # vLLM's human-readable ints: k = x1000, K = x1024
        (["--max-num-batched-tokens", "2K"], 2048),
        (["--max-num-seqs", "256"], None),  # another flag
    ],
)
def test_vllm_int_arg(args: list[str], want: int | None) -> None:
    assert vllm_int_arg(args, "--max-num-batched-tokens") == want
