"""The KL divergence's wiring: the server's top-k answer, the baseline cache (store, reuse, refuse),
the evaluate spec's key, the config checks. The math itself is tests/unit/test_kld.py."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from quantverdict.children import kld_baseline, served_logprobs
from quantverdict.config.compose import compose
from quantverdict.config.schema import ConfigError
from quantverdict.measure.kld import scheme_at_ids, token_stats, topk_from_full, topk_token_stats
from quantverdict.orchestrate import caches
from quantverdict.results.record import JobRecord

LN = math.log


def test_top_logprobs_are_read_as_the_k_largest_token_ids() -> None:
    # prompt [5, 7, 9]; position 1 holds the prompt token 7 outside the top-2 (vLLM adds it: k + 1 entries)
    answer = {
        "choices": [
            {
                "logprobs": {
                    "token_logprobs": [None, LN(0.1), LN(0.5)],
                    "tokens": ["token_id:5", "token_id:7", "token_id:9"],
                    "top_logprobs": [
                        None,
                        {"token_id:7": LN(0.1), "token_id:3": LN(0.6), "token_id:4": LN(0.2)},
                        {"token_id:9": LN(0.5), "token_id:2": LN(0.2), "token_id:1": LN(0.2)},
                    ],
                }
            }
        ]
    }
    tops = served_logprobs.parse_prompt_top_logprobs(answer, [5, 7, 9], top_k=2)
    assert tops[0] is None
    assert tops[1] == [(3, pytest.approx(LN(0.6))), (4, pytest.approx(LN(0.2)))]  # token 7 (0.1) dropped
    # a tie (ids 1 and 2 at 0.2): the lower id first
    assert tops[2] == [(9, pytest.approx(LN(0.5))), (1, pytest.approx(LN(0.2)))]
    assert served_logprobs.completion_body("m", [5, 7, 9], 2)["logprobs"] == 2
    with pytest.raises(RuntimeError, match="fewer than the 4 asked for"):
        served_logprobs.parse_prompt_top_logprobs(answer, [5, 7, 9], top_k=4)


PLAN = [(0, 2, 1), (2, 4, 1)]  # two windows of 2 tokens, one scored token each
IDS = [11, 2, 12, 1]  # targets: token 2 (window 0), token 1 (window 1)


def _spec(tmp_path: Path, role: str) -> dict:
    return {"role": role, "top_k": 2, "dir": str(tmp_path / "entry"), "key": "k1", "config_hash": "abc123"}


def _window(run: kld_baseline.KldRun, i: int, probs: list[float], target: int) -> None:
    # the server's form: the top-2 (id, ln p) pairs (ties: lower id first), and ln p of the target
    top = sorted(enumerate(probs), key=lambda p: (-p[1], p[0]))[:2]
    run.topk_window(i, [[(t, LN(p)) for t, p in top]], [LN(probs[target])])


def test_a_scheme_compares_with_the_stored_baseline_hand_worked(tmp_path: Path) -> None:
    base = kld_baseline.open_run(_spec(tmp_path, "baseline"), IDS, PLAN)
    assert base is not None and base.active
    _window(base, 0, [0.5, 0.3, 0.2], target=2)
    _window(base, 1, [0.6, 0.3, 0.1], target=1)
    stored = base.finish(2)
    assert stored["role"] == "baseline" and stored["stored_tokens"] == 2

    run = kld_baseline.open_run(_spec(tmp_path, "scheme"), IDS, PLAN)
    assert run is not None and run.refused is None
    _window(run, 0, [0.4, 0.4, 0.2], target=2)
    _window(run, 1, [0.3, 0.6, 0.1], target=1)
    out = run.finish(2)
    # window 0: known ids {0, 1}, rest {2}: 0.5 ln(0.5/0.4) + 0.3 ln(0.3/0.4) + 0.2 ln(0.2/0.2) = 0.025267
    # window 1: 0.6 ln(0.6/0.3) + 0.3 ln(0.3/0.6) + 0.1 ln(1) = 0.3 ln 2 = 0.207944
    assert out["mean_kld"] == pytest.approx((0.025267 + 0.207944) / 2, abs=1e-6)
    assert out["max_kld"] == pytest.approx(0.3 * LN(2), abs=1e-6)  # stored log-probs are float32
    # top-1: window 0 both token 0 (scheme tie 0.4/0.4: lower id), window 1 token 0 vs token 1
    assert out["top1_agreement_pct"] == pytest.approx(50.0)
    # Δp of the targets: 0.2 -> 0.2 and 0.3 -> 0.6: RMS = sqrt((0 + 0.09) / 2) = 0.212132
    assert out["rms_delta_p_pct"] == pytest.approx(21.2132, abs=1e-3)
    assert out["mean_delta_p_pct"] == pytest.approx(15.0)
    assert out["n_tokens"] == 2 and out["n_windows"] == 2 and out["kld_exact"] is False and out["top_k"] == 2
    assert out["baseline_config_hash"] == "abc123"


def test_a_scheme_without_a_stored_baseline_is_refused(tmp_path: Path) -> None:
    run = kld_baseline.open_run(_spec(tmp_path, "scheme"), IDS, PLAN)
    assert run is not None and not run.active
    assert "no stored baseline distributions" in str(run.refused)
    _window(run, 0, [0.4, 0.4, 0.2], target=2)  # ignored: nothing to compare with
    assert run.finish(2) == {"refused": run.refused, "role": "scheme"}


def test_a_scheme_with_other_text_or_settings_is_refused(tmp_path: Path) -> None:
    base = kld_baseline.open_run(_spec(tmp_path, "baseline"), IDS, PLAN)
    assert base is not None
    _window(base, 0, [0.5, 0.3, 0.2], target=2)
    _window(base, 1, [0.6, 0.3, 0.1], target=1)
    base.finish(2)
    other_text = kld_baseline.open_run(_spec(tmp_path, "scheme"), [11, 2, 12, 3], PLAN)
    assert other_text is not None and "text_key: stored" in str(other_text.refused)
    other_k = kld_baseline.open_run({**_spec(tmp_path, "scheme"), "top_k": 3}, IDS, PLAN)
    assert other_k is not None and "top_k: stored 2 vs this job 3" in str(other_k.refused)
    # another key for the same model: refused, naming the stored entry and which key fields differ
    spec = {**_spec(tmp_path, "scheme"), "dir": str(tmp_path / "other"), "key_fields": {"dtype": "float32"}}
    (tmp_path / "entry" / kld_baseline.META_FILE).write_text(
        json.dumps(
            {
                **json.loads((tmp_path / "entry" / kld_baseline.META_FILE).read_text()),
                "key_fields": {"dtype": "bfloat16"},
            }
        )
    )
    other_key = kld_baseline.open_run(spec, IDS, PLAN)
    assert (
        other_key is not None
        and "baseline entries with other settings (entry): dtype: 'bfloat16' vs 'float32'" in str(other_key.refused)
    )
    # the baseline job writes again over its entry (a rerun): the new one is read back
    again = kld_baseline.open_run(_spec(tmp_path, "baseline"), IDS, PLAN)
    assert again is not None
    _window(again, 0, [0.4, 0.4, 0.2], target=2)
    _window(again, 1, [0.6, 0.3, 0.1], target=1)
    again.finish(2)
    rerun = kld_baseline.open_run(_spec(tmp_path, "scheme"), IDS, PLAN)
    assert rerun is not None and rerun.base is not None
    assert np.exp(rerun.base[0].logprobs[0]).tolist() == pytest.approx([0.4, 0.4])


def test_the_baseline_and_its_schemes_share_one_cache_key(tmp_path: Path) -> None:
    env = SimpleNamespace(python="/envs/serve-x/bin/python")
    base = caches.kld_spec(compose(["scheme=bf16"]), env, tmp_path, "bfloat16", served=False)  # type: ignore[arg-type]
    awq = caches.kld_spec(compose(["scheme=awq"]), env, tmp_path, "bfloat16", served=False)  # type: ignore[arg-type]
    f32 = caches.kld_spec(compose(["scheme=awq"]), env, tmp_path, "float32", served=False)  # type: ignore[arg-type]
    assert base is not None and awq is not None and f32 is not None
    assert (base["role"], awq["role"]) == ("baseline", "scheme")
    assert base["dir"] == awq["dir"] and base["key"] == awq["key"]
    assert f32["key"] != base["key"]  # another compute dtype: another baseline
    assert base["config_hash"] != awq["config_hash"]
    off = compose(["scheme=awq", "eval.kld.enabled=false"])
    assert caches.kld_spec(off, env, tmp_path, "bfloat16", served=False) is None  # type: ignore[arg-type]


def test_kld_settings_are_checked_before_any_work() -> None:
    with pytest.raises(ConfigError, match=r"eval.kld.top_k=0 must be >= 1"):
        compose(["eval.kld.top_k=0"])
    with pytest.raises(ConfigError, match=r"exceeds vLLM's default --max-logprobs \(20\)"):
        compose(
            [
                "eval.backend=server",
                "eval.kld.top_k=21",
                "eval.token_perplexity.seq_len=2047",
                "eval.token_perplexity.stride=2047",
            ]
        )
    window = ["eval.token_perplexity.seq_len=2047", "eval.token_perplexity.stride=2047"]
    compose(["eval.backend=server", "eval.kld.top_k=21", *window, "bench.server.extra_args=['--max-logprobs=21']"])
    with pytest.raises(ConfigError, match=r"review.min_top1_agreement_pct=101"):
        compose(["review.min_top1_agreement_pct=101"])
    with pytest.raises(ConfigError, match=r"review.gpu_price_per_hour.H200=0"):
        compose(["+review.gpu_price_per_hour.H200=0"])
    with pytest.raises(ConfigError, match=r"review.energy_usd_per_kwh=-0.1 must be a price in USD per kWh > 0"):
        compose(["review.energy_usd_per_kwh=-0.1"])


def test_top1_ties_go_to_the_lowest_id_in_both_forms() -> None:
    # baseline P = (0.2, 0.5, 0.3): top-2 ids [1, 2]; scheme Q = (0.4, 0.4, 0.2): tokens 0 and 1 tie on top.
    # Full form: argmax(Q) = 0 (first index) != argmax(P) = 1: no agreement. The top-k form's scheme columns are
    # [1, 2, 0] (the baseline's ids, then the scheme's best other), so its first maximal column is token 1: it
    # must still pick token 0, the lowest id among the tied maxima.
    p = np.log(np.array([[0.2, 0.5, 0.3]]))
    q = np.log(np.array([[0.4, 0.4, 0.2]]))
    t = np.array([2])
    full = token_stats(p, q, t)
    base = topk_from_full(p, 2, t)
    assert base.ids.tolist() == [[1, 2]]
    scheme = scheme_at_ids(q, base.ids, t)
    assert scheme.ids.tolist() == [[1, 2, 0]]
    assert full.top1_agree.tolist() == topk_token_stats(base, scheme).top1_agree.tolist() == [False]


def test_the_record_reads_accuracy_kld_and_writes_it_back_unchanged() -> None:
    data = {
        "schema_version": 2,
        "tool": {"name": "quantverdict", "version": "x"},
        "accuracy": {"token_perplexity": {"token_perplexity": 19.1}, "kld": {"mean_kld": 0.0102, "top_k": 20}},
    }
    rec = JobRecord.from_dict(data)
    assert rec.accuracy.kld == {"mean_kld": 0.0102, "top_k": 20}
    assert rec.to_dict()["accuracy"] == data["accuracy"]
    assert JobRecord.from_dict({**data, "accuracy": {}}).accuracy.kld is None  # a record without KL divergence
