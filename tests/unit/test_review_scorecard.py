"""Scorecard numbers (memory, paired accuracy from per-item samples, speed) worked out by hand."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from quantverdict.config.schema import ReviewConfig
from quantverdict.measure.kv_cache import (
    hybrid_paging,
    kv_bytes_per_token,
    paged_bytes_per_sequence,
    state_bytes_per_sequence,
)
from quantverdict.results.record import JobRecord
from quantverdict.review import build_review, sources
from quantverdict.review.accuracy import accuracy_section
from quantverdict.review.memory import memory_summary
from quantverdict.review.speed import load_point, raw_points, speed_points, speed_summary
from review_records import DIMS, KV_GIB_16x288, grid, point, record, write_samples

view = JobRecord.view  # the typed record the review reads

RC = ReviewConfig(log_to_mlflow=False, bootstrap_samples=2000)
GIB = 1024**3


def test_kv_bytes_per_token() -> None:
    # 2 (K, V) * 30 layers * 3 KV heads * 64 head_dim * 2 bytes (bf16) = 23,040
    assert kv_bytes_per_token(DIMS, 2) == 23040
    # head_dim from hidden / heads = 576 / 9 = 64; KV heads default to the attention heads (9): 3x more
    assert kv_bytes_per_token({"hidden_size": 576, "num_attention_heads": 9, "num_hidden_layers": 30}, 2) == 69120
    assert kv_bytes_per_token({}, 2) is None


QWEN35_9B = {
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_kv_layers": 8,  # full attention every 4th layer; the 24 Gated DeltaNet layers keep a fixed-size state
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 256,
}


def test_kv_bytes_per_token_counts_only_the_kv_layers_of_a_hybrid_model() -> None:
    # Qwen3.5-9B: 2 (K, V) * 8 full-attention layers * 4 KV heads * 256 head_dim * 2 bytes = 32,768
    assert kv_bytes_per_token(QWEN35_9B, 2) == 32768
    # counting all 32 layers would say 2 * 32 * 4 * 256 * 2 = 131,072: 4x the real cache
    assert kv_bytes_per_token({k: v for k, v in QWEN35_9B.items() if k != "num_kv_layers"}, 2) == 131072
    # fp8 KV cache: half of 32,768
    assert kv_bytes_per_token(QWEN35_9B, 1) == 16384


def test_memory_of_a_hybrid_model_uses_the_kv_layers() -> None:
    rec = record("bf16", weights_gib=17.0)
    rec["model"]["dims"] = QWEN35_9B
    m, _ = memory_summary(view(rec), replace(RC, memory_budget_gib=24.0))
    # 16 requests * 288 tokens = 4,608 tokens * 32,768 B = 150,994,944 B = 0.140625 GiB (4608 / 32768)
    assert m.kv_bytes_per_token == 32768
    assert m.kv_needed_gib == pytest.approx(0.140625)
    assert m.need_gib == pytest.approx(17.140625)
    # tokens that fit in the 7 GiB left: 7 * 2^30 / 32,768 = 229,376
    assert m.budget_kv_tokens == 229376


def test_memory_need_and_what_fits_the_budget() -> None:
    m, missing = memory_summary(view(record("gptq")), replace(RC, memory_budget_gib=0.22))
    assert not missing
    # 16 requests * (256 + 32) tokens = 4,608 tokens * 23,040 B = 106,168,320 B = 0.098877 GiB
    assert m.kv_needed_tokens == 4608
    assert m.kv_needed_gib == pytest.approx(KV_GIB_16x288) == pytest.approx(0.098877, abs=1e-6)
    assert m.need_gib == pytest.approx(0.10 + 0.098877, abs=1e-6)
    # (0.22 - 0.10) GiB = 128,849,018.9 B / 23,040 B = 5,592.4 -> 5,592 tokens; / 288 = 19.4 requests
    assert m.budget_kv_tokens == 5592
    assert m.budget_max_concurrency == pytest.approx(5592 / 288)
    # stated capacity, fp8 KV cache (1 byte) and a reserve: 10,000 * 11,520 B = 0.107288 GiB; + 0.5 GiB reserve
    m, _ = memory_summary(
        view(record("gptq")), replace(RC, kv_cache_tokens=10000, kv_cache_dtype_bytes=1, reserved_gib=0.5)
    )
    assert m.kv_needed_gib == pytest.approx(10000 * 11520 / GIB)
    assert m.need_gib == pytest.approx(0.10 + 10000 * 11520 / GIB + 0.5)


def test_memory_falls_back_to_checkpoint_bytes() -> None:
    rec = record("int8")
    rec["memory"]["server"] = {}
    m, missing = memory_summary(view(rec), RC)
    assert m.weights_source == "checkpoint bytes" and m.weights_gib == pytest.approx(0.15, abs=1e-9)
    assert any("no vLLM server memory" in s for s in missing)


def _rows(values: list[int]) -> list[dict]:
    return [{"doc_id": i, "acc": v, "acc_norm": v} for i, v in enumerate(values)]


def test_paired_accuracy_from_samples(tmp_path: Path) -> None:
    base, q = record("bf16", acc_norm=0.3), record("int8", acc_norm=0.4)
    # the X / Y pairs of test_review_stats: scheme 0.4, baseline 0.3, b = 2, c = 1
    write_samples(q, tmp_path, "arc_easy", _rows([1, 1, 1, 1, 0, 0, 0, 0, 0, 0]))
    write_samples(base, tmp_path, "arc_easy", _rows([0, 0, 1, 1, 0, 0, 0, 0, 0, 1]))
    deltas, refused, _ = accuracy_section(view(q), view(base), replace(RC, interval="normal"))
    assert refused is None
    arc = next(d for d in deltas if d.name == "arc_easy")
    assert arc.paired and arc.n == 10
    assert (arc.mcnemar_b, arc.mcnemar_c, arc.mcnemar_p) == (2, 1, pytest.approx(1.0))
    assert arc.delta == pytest.approx(0.1) and arc.recovery_pct == pytest.approx(400 / 3)
    assert arc.interval.low == pytest.approx(-0.251824, abs=1e-5)  # hand value in test_review_stats
    assert arc.recovery_interval.low == pytest.approx(100 * (4 / 3 - 1.377321), abs=1e-3)
    assert arc.significant is False


def test_paired_perplexity_from_document_samples(tmp_path: Path) -> None:
    base, q = record("bf16", wppl=20.0), record("gptq", wppl=20.0 * math.exp(4 / 150))
    # baseline minus scheme log-likelihood is [1, 3] nats over [50, 100] words -> see test_review_stats
    write_samples(
        base,
        tmp_path,
        "wikitext",
        [
            {"doc_id": 0, "loglikelihood": -99.0, "n_words": 50, "n_bytes": 250},
            {"doc_id": 1, "loglikelihood": -197.0, "n_words": 100, "n_bytes": 500},
        ],
    )
    write_samples(
        q,
        tmp_path,
        "wikitext",
        [
            {"doc_id": 0, "loglikelihood": -100.0, "n_words": 50, "n_bytes": 250},
            {"doc_id": 1, "loglikelihood": -200.0, "n_words": 100, "n_bytes": 500},
        ],
    )
    deltas, _, _ = accuracy_section(view(q), view(base), replace(RC, interval="normal"))
    w = next(d for d in deltas if d.metric == "word_perplexity")
    assert w.paired and w.delta_pct == pytest.approx(100 * math.expm1(4 / 150))  # +2.70%
    # L in [0.0266667 -+ 0.00871095] -> 100 * (exp(L) - 1) in [1.8118%, 3.6011%]
    assert w.interval.low == pytest.approx(100 * math.expm1(0.0266667 - 0.00871095), abs=1e-3)
    assert w.interval.high == pytest.approx(100 * math.expm1(0.0266667 + 0.00871095), abs=1e-3)
    assert w.significant is True


def test_samples_found_beside_a_moved_record(tmp_path: Path) -> None:
    base, q = record("bf16"), record("int8")
    for rec, vals in ((base, [1, 0, 1, 0]), (q, [1, 0, 0, 0])):
        d = tmp_path / rec["job"]["scheme"] / "eval"
        d.mkdir(parents=True)
        (d / "samples_arc_easy.jsonl").write_text(
            "".join(f'{{"doc_id": {i}, "acc_norm": {v}}}\n' for i, v in enumerate(vals))
        )
        rec["accuracy"]["samples"] = {"arc_easy": "/gone/eval/samples_arc_easy.jsonl"}
        rec["_review_dir"] = str(tmp_path / rec["job"]["scheme"])
    deltas, _, _ = accuracy_section(view(q), view(base), RC)
    assert next(d for d in deltas if d.name == "arc_easy").paired


def test_unpaired_fallback_is_said() -> None:
    deltas, _, _ = accuracy_section(view(record("int8", acc_norm=0.45)), view(record("bf16", acc_norm=0.5)), RC)
    arc = next(d for d in deltas if d.name == "arc_easy")
    assert not arc.paired and "unpaired interval from the two stderrs" in arc.note
    assert arc.interval.low == pytest.approx(-0.188590, abs=1e-5)  # hand value in test_review_stats


def test_speed_summary() -> None:
    sp, flags, missing = speed_summary(view(next(r for r in grid() if r["job"]["scheme"] == "gptq")), RC)
    assert not flags and not missing
    assert sp.low_load is not None and sp.ceiling is not None
    assert sp.low_load.itl_ms_p50 == 25.0 and sp.low_load.output_tok_s_per_request == pytest.approx(40.0)  # 1000 / 25
    assert sp.ceiling.output_tok_s == 270.0 and sp.ceiling.rps == pytest.approx(270 / 32)
    sp, _, _ = speed_summary(view(grid()[0]), RC)
    assert sp.at_load is not None and sp.at_load.label == "1 req/s"


def test_repeats_are_averaged_and_concurrency_loads() -> None:
    rec = record("bf16")
    rec["speed"] = {
        "mode": "concurrency",
        "points": [
            {**point(None, achieved=0.5, tok_s=16, ttft99=100, itl50=20, itl99=30, e2e50=700), "concurrency": 1},
            {
                **point(None, achieved=0.7, tok_s=22, ttft99=120, itl50=22, itl99=34, e2e50=720),
                "concurrency": 1,
                "repeat": 1,
            },
            {**point(None, achieved=3.0, tok_s=96, ttft99=400, itl50=40, itl99=80, e2e50=1500), "concurrency": 8},
        ],
    }
    mode, raw = raw_points(view(rec))
    pts = speed_points(mode, raw)
    assert mode == "concurrency" and [p.load for p in pts] == [1.0, 8.0]
    assert pts[0].achieved_rps == pytest.approx(0.6) and pts[0].repeats == 2  # (0.5 + 0.7) / 2
    # 2 req/s: the lowest concurrency whose achieved req/s reaches it is 8
    p, how = load_point(mode, pts, replace(RC, load_rps=2.0))
    assert p is not None and p.load == 8.0 and "lowest concurrency reaching 2 req/s" in how
    p, _ = load_point(mode, pts, replace(RC, load_rps=None, load_concurrency=4))
    assert p is not None and p.load == 8.0
    p, how = load_point("rate", pts, replace(RC, load_rps=None, load_concurrency=4))
    assert p is None and "open-loop" in how


def test_dedupe_prefers_finished_then_newest() -> None:
    old, new, failed = record("int8"), record("int8"), record("int8", status="failed")
    old["job"]["finished_at"], new["job"]["finished_at"], failed["job"]["finished_at"] = "1", "2", "3"
    old, new, failed = JobRecord.view(old), JobRecord.view(new), JobRecord.view(failed)
    kept, notes = sources.dedupe([old, failed, new])
    assert kept == [new] and len(notes) == 2


def test_review_json_is_strict(tmp_path: Path) -> None:
    import json

    from quantverdict.review import to_json

    review = build_review(grid(), RC, "test")
    text = json.dumps(to_json(review), allow_nan=False)  # no NaN / Infinity
    data = json.loads(text)
    assert data["verdicts"][0]["decision"] == "do not quantize"
    assert data["constraints"]["memory_budget_gib"] == 24.0
    card = next(c for c in data["scorecards"] if c["scheme"] == "gptq")
    assert card["checks"]["memory"]["outcome"] == "pass"


QWEN35_9B_STATE = {
    **QWEN35_9B,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
}


def test_hybrid_recurrent_state_is_counted_per_sequence() -> None:

    # per linear-attention layer: conv (4 - 1) * (2 * 16 * 128 + 32 * 128) = 24,576 elements, temporal
    # 32 * 128 * 128 = 524,288 elements; 548,864 * 2 B = 1,097,728 B; 24 layers -> 26,345,472 B (25.125 MiB)
    assert state_bytes_per_sequence(QWEN35_9B_STATE, 2) == 26_345_472
    assert state_bytes_per_sequence(QWEN35_9B, 2) == 0  # linear-attention sizes unknown: no term
    assert state_bytes_per_sequence({"num_hidden_layers": 30}, 2) == 0  # no linear-attention layers
    rec = record("bf16", weights_gib=17.0)
    rec["model"]["dims"] = QWEN35_9B_STATE
    m, _ = memory_summary(view(rec), replace(RC, memory_budget_gib=24.0))
    # vLLM pages it: 272-token blocks (see test_hybrid_paging_matches_vllm_on_the_h200), a 288-token request
    # takes 2 blocks = 544 token slots in each of the 8 KV layers: 16 requests * 544 * 32,768 B = 0.265625 GiB
    assert m.kv_needed_tokens == 16 * 544 and m.kv_needed_gib == pytest.approx(0.265625)
    # each state padded to a 1,114,112 B page: 16 * 24 * 1,114,112 B = 427,819,008 B = 0.3984375 GiB
    assert m.state_needed_gib == pytest.approx(0.3984375)
    assert m.need_gib == pytest.approx(17.0 + 0.265625 + 0.3984375)
    # 7 GiB left / ((2 * 8 + 24) pages * 1,114,112 B = 44,564,480 B a sequence) = 168.66 -> 168 sequences
    assert m.budget_max_concurrency == 168 and m.budget_kv_tokens == 168 * 288


def test_hybrid_paging_matches_vllm_on_the_h200() -> None:

    # state per layer 1,097,728 B (test above); attention per layer and token 2 * 4 * 256 * 2 = 4,096 B;
    # block = 16 * ceil(1,097,728 / (16 * 4,096)) = 16 * ceil(16.75) = 272 tokens, page 272 * 4,096 = 1,114,112 B
    # (vLLM 0.26's log for qwen3.5-9b-shape: "Setting attention block size to 272 tokens", "Padding mamba
    # page size by 1.49%": 1,114,112 / 1,097,728 = 1.0149)
    paging = hybrid_paging(QWEN35_9B_STATE, 2, 2)
    assert paging == {"block_tokens": 272, "page_bytes": 1_114_112, "kv_layers": 8, "state_layers": 24}
    # 4,096 tokens: ceil(4,096 / 272) = 16 blocks in 8 layers + 24 states = 152 pages = 169,345,024 B
    assert paged_bytes_per_sequence(paging, 4096) == 169_345_024
    # measured (docs/results/gpu-qwen3.5-9b-shape.md, H200, vLLM 0.26.0): "Available KV cache memory:
    # 107.84 GiB", "GPU KV cache size: 2,800,370 tokens", "Maximum concurrency for 4,096 tokens per request:
    # 683.68x". 107.84 * 2^30 / 169,345,024 = 683.76 -> 683 whole requests. vLLM floors to whole blocks of
    # 8 pages: its 12,990 blocks (107.84 is rounded; 12,990 * 8 * 1,114,112 B = 107.83 GiB) / 19 blocks a
    # request = 683.68, and its token figure is that times 4,096: 2,800,370.5 -> 2,800,370.
    assert 12_990 * 8 * 1_114_112 / paged_bytes_per_sequence(paging, 4096) == pytest.approx(683.68, abs=0.005)
    rec = record("bf16", weights_gib=16.71)
    rec["model"]["dims"] = QWEN35_9B_STATE
    rec["memory"]["server"] = {
        "weights_gib": 16.71,
        "kv_cache_gib": 107.84,
        "kv_cache_tokens": 2_800_370,
        "max_concurrency": 683.68,
        "max_concurrency_request_tokens": 4096,
    }
    m, missing = memory_summary(
        view(rec), replace(RC, memory_budget_gib=16.71 + 107.84, request_len_tokens=4096, reserved_gib=0.0)
    )
    assert m.budget_max_concurrency == 683
    # vLLM's bytes per "KV token" include the states: 107.84 GiB / 2,800,370 = 41,349 B; paged model:
    # 169,345,024 / 4,096 = 41,344 B (0.01% apart), while the per-layer K/V alone is 32,768 B (26% off)
    assert m.kv_bytes_per_token_measured == pytest.approx(41_349, abs=1)
    assert m.kv_bytes_per_token_paged == pytest.approx(41_344, abs=1)
    assert not missing
    assert hybrid_paging(QWEN35_9B, 2, 2) is None  # no linear-attention sizes: no paging model
