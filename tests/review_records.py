"""Hand-built records for the review tests (same layout as quantverdict.orchestrate.job writes).

Model dims are SmolLM2-135M's: 30 layers, 3 KV heads, head_dim 64, so with a bf16 KV cache one
token takes 2 × 30 × 3 × 64 × 2 = 23,040 bytes. Requests are 256 + 32 = 288 tokens; 16 concurrent
requests need 4,608 tokens = 106,168,320 bytes = 0.098877 GiB of KV cache.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from quantverdict import RECORD_SCHEMA_VERSION
from quantverdict.review.document import JobStatus, ModelVerdict, Review, Scheme
from quantverdict.review.words import say

GIB = 1024**3
# the made-up records' clock: any fixed instant would do, the review reads only the order of the times and how far
# apart they are
ORIGIN = datetime(2026, 1, 1)


def stamp(hours: float = 0.0, *, days: int = 0) -> str:
    """The time ``days`` days and ``hours`` hours after :data:`ORIGIN` in ISO 8601, as a record's ``job.started_at``
    and ``job.finished_at`` hold it (e.g. ``stamp(1.5)`` -> ``...T01:30:00``)."""
    return (ORIGIN + timedelta(days=days, hours=hours)).isoformat()


DIMS = {
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "intermediate_size": 1536,
    "vocab_size": 49152,
}
KV_GIB_16x288 = 4608 * 23040 / GIB  # 0.098876953125
SETTINGS = {
    "backend": "hf",
    "batch_size": 8,
    "max_length": 2048,
    "num_fewshot": 0,
    "limit": 100,
    "task_limits": {},
    "dtype": "float32",
}
TP = {"seq_len": 2048, "stride": 2048, "max_tokens": 8192}
LABELS = {
    "bf16": ("BF16", 16, 16),
    "int8": ("W8A16", 8, 16),
    "fp8": ("FP8_DYNAMIC", 8, 8),
    "w8a8": ("W8A8", 8, 8),
    "gptq": ("W4A16", 4, 16),
    "awq": ("W4A16", 4, 16),
}
WEIGHTS_GIB = {"bf16": 0.25, "int8": 0.15, "fp8": 0.15, "w8a8": 0.15, "gptq": 0.10, "awq": 0.10}


def point(
    rate: float | None,
    *,
    achieved: float,
    tok_s: float,
    ttft99: float,
    itl50: float,
    itl99: float,
    e2e50: float,
    out_total: float = 256,
    out_req: float = 256,
    failed: int = 0,
) -> dict[str, Any]:
    return {
        "offered_rate_rps": rate,
        "concurrency": None,
        "repeat": 0,
        "achieved_rps": achieved,
        "output_tok_s": tok_s,
        "total_tok_s": tok_s * 9,
        "ttft_ms_p50": ttft99 / 2,
        "ttft_ms_p90": ttft99 * 0.8,
        "ttft_ms_p99": ttft99,
        "tpot_ms_p50": itl50,
        "tpot_ms_p99": itl99,
        "itl_ms_p50": itl50,
        "itl_ms_p99": itl99,
        "e2e_ms_p50": e2e50,
        "e2e_ms_p99": e2e50 * 1.5,
        "completed": 8,
        "failed": failed,
        "output_tokens_total": out_total,
        "output_tokens_requested": out_req,
        "duration_s": 8.0,
    }


def speed(
    itl50: float, sat_tok_s: float, *, ttft99: float = 300.0, itl99: float | None = None, e2e50: float | None = None
) -> dict[str, Any]:
    """A two-point rate sweep: 1 req/s and unlimited."""
    itl99 = itl99 if itl99 is not None else itl50 * 1.5
    e2e50 = e2e50 if e2e50 is not None else ttft99 / 2 + 31 * itl50
    return {
        "mode": "rate",
        "server_start_s": 30.0,
        "points": [
            point(1.0, achieved=0.95, tok_s=30.0, ttft99=ttft99, itl50=itl50, itl99=itl99, e2e50=e2e50),
            point(
                None,
                achieved=sat_tok_s / 32,
                tok_s=sat_tok_s,
                ttft99=ttft99 * 5,
                itl50=itl50 * 3,
                itl99=itl99 * 4,
                e2e50=e2e50 * 4,
            ),
        ],
    }


def record(
    scheme: str,
    *,
    model: str = "m",
    acc_norm: float = 0.50,
    acc_norm_se: float = 0.05,
    wppl: float = 20.0,
    tppl: float = 40.0,
    sp: dict[str, Any] | None = None,
    weights_gib: float | None = None,
    status: str = "ok",
    settings: dict[str, Any] | None = None,
    fallback: bool = False,
    source: str = "local",
    baseline_note: str = "",
) -> dict[str, Any]:
    label, wbits, abits = LABELS[scheme]
    w = WEIGHTS_GIB[scheme] if weights_gib is None else weights_gib
    return {
        "schema_version": RECORD_SCHEMA_VERSION,
        "tool": {"name": "quantverdict", "version": "0.1.0"},
        "job": {
            "id": f"{model}_{scheme}_x",
            "model": model,
            "scheme": scheme,
            "scheme_label": label,
            "config_hash": "x",
            "output_dir": f"/nonexistent/{model}_{scheme}",
            "started_at": stamp(0),
            "finished_at": stamp(1),
        },
        "status": status,
        "failed_stage": None if status == "ok" else "benchmark",
        "error": None if status == "ok" else "RuntimeError: boom",
        "notes": [baseline_note] if baseline_note else [],
        "config": {
            "baseline_scheme": "bf16",
            "model": {"name": model, "dtype": "bfloat16", "source": source, "baseline_note": baseline_note},
            "scheme": {"name": scheme, "label": label, "weight_bits": wbits, "activation_bits": abits},
            "eval": {"headline": {"arc_easy": "acc_norm", "wikitext": "word_perplexity"}},
            "bench": {"mode": "rate", "input_len": 256, "output_len": 32, "server": {"kv_cache_dtype": "auto"}},
            "tracking": {"enabled": False, "uri": "", "experiment": "x"},
        },
        "model": {"dims": DIMS, "num_parameters": 134_515_008},
        "memory": {
            "checkpoint": {"total_weight_bytes": int(w * GIB), "effective_bits_per_weight": float(wbits)},
            "server": {
                "weights_gib": w,
                "kv_cache_gib": 1.0,
                "kv_cache_tokens": int(GIB // 23040),
                "max_concurrency": GIB // 23040 / 2048,
                "kernels": [{"kernel": "ExampleKernel", "method": "CompressedTensorsExample"}],
                "fallback": fallback,
            },
        },
        "accuracy": {
            "tasks": {
                "arc_easy": {
                    "acc": acc_norm,
                    "acc_stderr": acc_norm_se,
                    "acc_norm": acc_norm,
                    "acc_norm_stderr": acc_norm_se,
                    "n": 100,
                },
                "wikitext": {"word_perplexity": wppl, "byte_perplexity": 1.5, "bits_per_byte": 0.58, "n": 62},
            },
            "token_perplexity": {"token_perplexity": tppl, "n_tokens": 8192, **TP},
            "settings": {**SETTINGS, **(settings or {})},
            "samples": {},
        },
        "speed": sp if sp is not None else speed(40.0, 300.0),
    }


def blank_scheme(job_id: str, name: str, label: str, *, is_baseline: bool = False, gpus: int = 1) -> Scheme:
    """A finished job of model ``m`` as the review starts its scheme: 16-bit weights, every figure not yet known."""
    return Scheme(
        job_id=job_id,
        model="m",
        scheme=name,
        label=label,
        name=f"{name} ({label})",
        weight_tier=0,
        kv_cache="auto",
        is_baseline=is_baseline,
        status=JobStatus.OK,
        failed_stage=None,
        error=None,
        gpus=gpus,
    )


def write_samples(rec: dict[str, Any], tmp: Path, task: str, rows: list[dict[str, Any]]) -> None:
    """Put per-item rows where the record points (``accuracy.samples[task]``)."""
    path = tmp / f"{rec['job']['scheme']}_samples_{task}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rec["accuracy"]["samples"][task] = str(path)


def grid() -> list[dict[str, Any]]:
    """Six schemes with plausible numbers: 8-bit nearly lossless, 4-bit loses a little; W8A8 fastest
    at saturation, 4-bit fastest at low load."""
    return [
        record("bf16", acc_norm=0.50, wppl=20.0, tppl=40.0, sp=speed(40.0, 300.0, e2e50=1400)),
        record("int8", acc_norm=0.50, wppl=20.1, tppl=40.1, sp=speed(34.0, 290.0, e2e50=1200)),
        record("fp8", acc_norm=0.49, wppl=20.2, tppl=40.2, sp=speed(150.0, 100.0, e2e50=5000)),
        record("w8a8", acc_norm=0.49, wppl=20.3, tppl=40.3, sp=speed(33.0, 400.0, e2e50=1100)),
        record("gptq", acc_norm=0.48, wppl=21.0, tppl=41.6, sp=speed(25.0, 270.0, e2e50=900)),
        record("awq", acc_norm=0.485, wppl=20.8, tppl=41.2, sp=speed(26.0, 260.0, e2e50=950)),
    ]


# --- a synthetic model (random weights, model.source=synthetic) ---------------------------------------
#
# Llama-3.1-8B's dimensions: 32 layers, 8 KV heads, head_dim 128, so a bf16 KV cache takes
# 2 × 32 × 8 × 128 × 2 = 131,072 bytes per token. Requests are 1024 + 128 = 1152 tokens; 16 concurrent
# requests need 18,432 tokens × 131,072 B = 2,415,919,104 B = 2.25 GiB (18 × 2^27 = 2304 MiB).
#
# | scheme | weights GiB | need GiB | decode bytes | TPOT c=1 | ideal ms (/ 4.0e12 B/s) | efficiency |
# |---|---|---|---|---|---|---|
# | bf16 | 15.0 | 17.25 | 16.0e9 | 5.0 | 4.00 | 0.80 |
# | fp8  |  8.5 | 10.75 |  9.0e9 | 3.0 | 2.25 | 0.75 |
# | w8a8 |  8.5 | 10.75 |  9.0e9 | 3.125 | 2.25 | 0.72 |
# | gptq |  5.5 |  7.75 |  5.0e9 | 2.5 | 1.25 | 0.50 |
#
# Concurrency sweep (c = 1, 16, 64, 256): TPOT p50 and TTFT p50 per level below; ITL p50 = TPOT p50,
# ITL p99 = 1.5 × TPOT, TTFT p99 = 2 × TTFT p50, E2E p50 = TTFT p50 + 127 × TPOT (128 output tokens),
# achieved req/s = c / E2E, output tok/s = 128 × req/s. At c=16, E2E p50: bf16 60 + 127 × 6 = 822 ms,
# fp8 45 + 127 × 4 = 553 ms, w8a8 45 + 127 × 3.9 = 540.3 ms, gptq 70 + 127 × 4 = 578 ms.

SYN_MODEL = "llama3.1-8b-shape"
SYN_DIMS = {
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}
SYN_NOT_APPLICABLE = "synthetic model with random weights: accuracy is not applicable (memory and speed are real)"
SYN_COPY_BYTES_PER_S = 4.0e12
SYN_CONCURRENCIES = (1, 16, 64, 256)
# scheme -> (weights GiB, decode bytes, TPOT p50 ms per concurrency, TTFT p50 ms per concurrency)
SYN = {
    "bf16": (15.0, 16.0e9, (5.0, 6.0, 9.0, 20.0), (20.0, 60.0, 200.0, 800.0)),
    "fp8": (8.5, 9.0e9, (3.0, 4.0, 6.5, 14.0), (15.0, 45.0, 150.0, 600.0)),
    "w8a8": (8.5, 9.0e9, (3.125, 3.9, 6.0, 13.0), (15.0, 45.0, 140.0, 560.0)),
    "gptq": (5.5, 5.0e9, (2.5, 4.0, 10.0, 30.0), (20.0, 70.0, 260.0, 1100.0)),
}
SYN_BITS = {"bf16": None, "fp8": 8.0, "w8a8": 8.0, "gptq": 4.25}
SYN_KERNELS = {
    "bf16": [],
    "fp8": [{"kernel": "CutlassFP8ScaledMMLinearKernel", "method": "CompressedTensorsW8A8Fp8"}],
    "w8a8": [{"kernel": "CutlassScaledMMLinearKernel", "method": "CompressedTensorsW8A8Int8"}],
    "gptq": [{"kernel": "MarlinLinearKernel", "method": "CompressedTensorsWNA16"}],
}


def conc_point(c: int, tpot: float, ttft: float, output_len: int = 128) -> dict[str, Any]:
    """One closed-loop point at concurrency ``c`` (see the table above for the derived numbers)."""
    e2e = ttft + (output_len - 1) * tpot
    rps = c * 1000.0 / e2e
    n = max(32, 4 * c)
    return {
        "point": f"conc-{c}_r0",
        "offered_rate_rps": "inf",
        "concurrency": c,
        "repeat": 0,
        "valid": True,
        "achieved_rps": rps,
        "output_tok_s": rps * output_len,
        "total_tok_s": rps * (1024 + output_len),
        "ttft_ms_p50": ttft,
        "ttft_ms_p90": 1.6 * ttft,
        "ttft_ms_p99": 2.0 * ttft,
        "tpot_ms_p50": tpot,
        "tpot_ms_p99": 1.5 * tpot,
        "itl_ms_p50": tpot,
        "itl_ms_p99": 1.5 * tpot,
        "e2e_ms_p50": e2e,
        "e2e_ms_p99": 1.2 * e2e,
        "completed": n,
        "failed": 0,
        "output_tokens_total": n * output_len,
        "output_tokens_requested": n * output_len,
        "duration_s": n / rps,
    }


def synthetic_record(scheme: str, *, model: str = SYN_MODEL, with_roofline: bool = True) -> dict[str, Any]:
    """A finished job of a synthetic model: no accuracy (not applicable), real memory and speed."""
    label, wbits, abits = LABELS[scheme]
    w, decode, tpots, ttfts = SYN[scheme]
    tpot1 = tpots[0]
    speed_: dict[str, Any] = {
        "mode": "concurrency",
        "server_start_s": 60.0,
        "hbm_copy": {"copy_bytes_per_s": SYN_COPY_BYTES_PER_S, "copy_gbps": SYN_COPY_BYTES_PER_S / 1e9},
        "points": [conc_point(c, t, f) for c, t, f in zip(SYN_CONCURRENCIES, tpots, ttfts)],
    }
    if with_roofline:
        ideal = decode / SYN_COPY_BYTES_PER_S * 1e3
        speed_["roofline"] = {
            "decode_bytes": int(decode),
            "embedding_bytes": 128256 * 4096 * 2,
            "skipped_bytes": 0,
            "total_bytes": int(decode) + 128256 * 4096 * 2,
            "copy_bytes_per_s": SYN_COPY_BYTES_PER_S,
            "ideal_ms_per_token": ideal,
            "tpot_ms": tpot1,
            "efficiency": ideal / tpot1,
            "achieved_bytes_per_s": decode / (tpot1 / 1e3),
        }
    kv_gib = 100.0
    return {
        "schema_version": RECORD_SCHEMA_VERSION,
        "tool": {"name": "quantverdict", "version": "0.1.0"},
        "job": {
            "id": f"{model}_{scheme}_s",
            "model": model,
            "scheme": scheme,
            "scheme_label": label,
            "config_hash": "s",
            "output_dir": f"/nonexistent/{model}_{scheme}",
            "started_at": stamp(0, days=1),
            "finished_at": stamp(1, days=1),
        },
        "status": "ok",
        "failed_stage": None,
        "error": None,
        "notes": [],
        "environment": {
            "gpu": [
                {
                    "name": "NVIDIA H200",
                    "driver_version": "570.124.06",
                    "memory_total_mib": 143771.0,
                    "compute_cap": "9.0",
                }
            ],
            "serve": {"vllm": "0.11.0", "torch": "2.8.0"},
        },
        "stages": {
            "quantize": {"status": "ok", "wall_s": 120.0, "detail": ""},
            "evaluate": {"status": "not_applicable", "wall_s": None, "detail": SYN_NOT_APPLICABLE},
            "benchmark": {"status": "ok", "wall_s": 600.0, "detail": ""},
        },
        "config": {
            "baseline_scheme": "bf16",
            "model": {"name": model, "dtype": "bfloat16", "source": "synthetic"},
            "scheme": {"name": scheme, "label": label, "weight_bits": wbits, "activation_bits": abits},
            "eval": {"headline": {"arc_easy": "acc_norm", "wikitext": "word_perplexity"}},
            "bench": {
                "mode": "concurrency",
                "input_len": 1024,
                "output_len": 128,
                "server": {"kv_cache_dtype": "auto"},
            },
            "tracking": {"enabled": False, "uri": "", "experiment": "x"},
        },
        "model": {"dims": SYN_DIMS, "num_parameters": 8_030_261_248},
        "memory": {
            # as stages.memory writes it: None without quantized weights; 4-bit: + one bf16 scale per 64 = 4.25
            "checkpoint": {"total_weight_bytes": int(w * GIB), "effective_bits_per_weight": SYN_BITS[scheme]},
            "server": {
                "weights_gib": w,
                "kv_cache_gib": kv_gib,
                "kv_cache_tokens": int(kv_gib * GIB // 131072),  # 819,200
                "max_concurrency": kv_gib * GIB / 131072 / 4096,
                "kernels": SYN_KERNELS[scheme],
                "fallback": False,
            },
        },
        "accuracy": {"not_applicable": SYN_NOT_APPLICABLE},
        "speed": speed_,
    }


def synthetic_grid() -> list[dict[str, Any]]:
    """bf16, fp8, gptq W4A16 and w8a8 of the synthetic Llama-3.1-8B shape (numbers in the table above)."""
    return [synthetic_record(s) for s in ("bf16", "fp8", "gptq", "w8a8")]


def others(review: Review, v: ModelVerdict) -> list[str]:
    """The review's "Other schemes" lines of ``v``: each scheme passed over, with why (the Markdown's words)."""
    return [say("passed_over", v=v, p=p, doc=review) for p in v.passed_over]


def sentence(review: Review, v: ModelVerdict) -> str:
    """The verdict sentence the review writes for ``v`` (Markdown emphasis kept)."""
    return say("verdict", v=v, doc=review)
