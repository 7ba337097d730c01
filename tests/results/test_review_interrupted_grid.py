"""A sweep that stopped before its planned top loads, on the committed records of an interrupted H200 grid (decode
shape 128 in / 1,024 out): bf16 measured concurrency 16, 64 and 256, three repeats each; the machine was lost while
W4A16 (GPTQ, Machete) ran, after its three repeats at concurrency 16. Its best level is a floor under the server's
capacity: a lower-bound ceiling, an upper-bound cost, and only the low-load claim stands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from quantverdict.config.schema import ReviewConfig
from quantverdict.review import build_review
from quantverdict.review.document import RegimeReading
from quantverdict.review.export import to_document
from quantverdict.review.sources import load_dir

DECODE = (
    Path(__file__).resolve().parents[2] / "docs" / "results" / "gpu-cache-free" / "decode-interrupted-grid" / "records"
)
STOPPED = "gptq's sweep has no valid point at concurrency 64, concurrency 256"


def _row(review: Any, scheme: str) -> dict[str, Any]:
    model = next(iter(review.regime))
    return next(r for r in review.regime[model] if r["scheme"] == scheme)


def _card(review: Any, scheme: str) -> Any:
    return next(c for c in review.cards if c.scheme == scheme)


def test_the_interrupted_decode_grid_claims_low_load_only() -> None:
    records, _ = load_dir(DECODE)
    review = build_review(
        records, ReviewConfig(log_to_mlflow=False, bootstrap_samples=200, gpu_price_per_hour={"H200": 3.5}), "t"
    )
    gptq, bf16 = _card(review, "gptq"), _card(review, "bf16")
    assert gptq.speed["stopped_before"] == ["concurrency 64", "concurrency 256"]
    assert gptq.speed["ceiling_kind"] == "lower_bound"  # its best level (16) is a floor
    assert bf16.speed["stopped_before"] == [] and bf16.speed["ceiling_kind"] == "closed_loop_max"
    row = _row(review, "gptq")
    assert row["sat_gap"] == STOPPED
    assert row["sat"] is None and row["sat_claim"] is None and row["sat_range"] is None
    # the low-load claim stands: ITL p50 at concurrency 16, three repeats paired on one GPU
    assert row["low_claim"]["rule"] == "paired t" and row["low_claim"]["class"] == "pays"
    assert row["reading"] == RegimeReading.SATURATION_NOT_MEASURED
    # output tok/s at concurrency 16, gptq / bf16 by repeat: 3,574.1 / 2,823.2, 3,579.1 / 2,824.1, 3,582.7 /
    # 2,819.3 = 1.2660, 1.2673, 1.2708; geometric mean 1.2680
    tok = next(p for p in row["paired"] if p["metric"] == "output_tok_s")
    assert (tok["load"], tok["pairs"], tok["verdict"]) == (16, 3, "faster")
    assert tok["speedup"] == pytest.approx(1.2680, abs=2e-4)
    flagged = [f.message for f in review.flags if f.code == "sweep_incomplete"]
    assert flagged == [
        "gptq (W4A16): speed: no valid point at concurrency 64, concurrency 256 of the planned sweep (concurrency 16, "
        "concurrency 64, concurrency 256) (job interrupted in stage benchmark): its ceiling is a lower bound, and no "
        "speedup at saturation is claimed against it or from it"
    ]
    # $3.5 per GPU-hour / (3,825.3 tok/s x 3,600 s) x 1e6 = $0.254 per million tokens: at most that
    bf16, gptq = to_document(review).cost.schemes  # type: ignore[union-attr]
    assert gptq.ceiling_lower_bound and round(gptq.ceiling_tok_s or 0.0) == 3825
    assert gptq.usd_per_mtok_ceiling == pytest.approx(3.5 / (gptq.ceiling_tok_s * 3600) * 1e6)  # type: ignore[operator]
    assert round(gptq.usd_per_mtok_ceiling or 0.0, 3) == 0.254
    # bf16's sweep is complete; its c=256 steady windows (15.9-16.1 s) are shorter than two lifetimes (E2E p50
    # 15.2-15.3 s), so its ceiling is the whole run's median, 15,662 tok/s: $3.5 / (15,662 x 3,600) x 1e6 = $0.062
    assert not bf16.ceiling_lower_bound and round(bf16.ceiling_tok_s or 0.0) == 15662
    assert round(bf16.usd_per_mtok_ceiling or 0.0, 3) == 0.062
