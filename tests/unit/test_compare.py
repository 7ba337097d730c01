"""Deltas against the baseline: computed only for identical eval settings; values worked out by hand."""

from __future__ import annotations

import pytest

from quantverdict.results.baseline import AccuracyDeltas, accuracy_deltas, eval_mismatch, find_baseline, pct_change
from quantverdict.results.record import JobRecord

view = JobRecord.view  # the typed record the joins read

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


def rec(scheme: str, acc_norm: float, wppl: float, tppl: float, **settings: object) -> dict:
    return {
        "job": {"model": "m", "scheme": scheme, "finished_at": "t"},
        "config": {"baseline_scheme": "bf16"},
        "accuracy": {
            "settings": {**SETTINGS, **settings},
            "tasks": {"arc_easy": {"acc": 0.4, "acc_norm": acc_norm}, "wikitext": {"word_perplexity": wppl}},
            "token_perplexity": {"token_perplexity": tppl, **TP},
        },
    }


HEADLINE = {"arc_easy": "acc_norm", "wikitext": "word_perplexity"}


def test_deltas_by_hand() -> None:
    base, q = rec("bf16", 0.50, 20.0, 40.0), rec("awq", 0.45, 21.0, 42.0)
    d = accuracy_deltas(view(q), view(base), HEADLINE)
    arc, wiki, tp = d.of("arc_easy"), d.of("wikitext"), d.token_perplexity
    assert arc is not None and wiki is not None and tp is not None and d.refused is None
    assert (arc.metric, arc.higher_is_better, arc.delta_pct) == ("acc_norm", True, None)
    assert arc.delta == pytest.approx(-0.05)  # 0.45 - 0.50
    assert arc.recovery_pct == pytest.approx(90.0)  # 100 * 0.45 / 0.50
    assert (wiki.metric, wiki.higher_is_better, wiki.delta) == ("word_perplexity", False, None)
    assert wiki.delta_pct == pytest.approx(5.0)  # 100 * (21 - 20) / 20
    assert (tp.value, tp.baseline, tp.higher_is_better) == (42.0, 40.0, False)
    assert tp.delta_pct == pytest.approx(5.0)  # 100 * (42 - 40) / 40
    assert d.of("hellaswag") is None


def test_mismatched_settings_refuse_the_delta() -> None:
    base, q = rec("bf16", 0.5, 20.0, 40.0), rec("awq", 0.45, 21.0, 42.0, limit=50, batch_size=1)
    reason = eval_mismatch(view(q), view(base))
    assert reason is not None and "limit: 50 vs baseline 100" in reason and "batch_size: 1 vs baseline 8" in reason
    assert accuracy_deltas(view(q), view(base), HEADLINE) == AccuracyDeltas(refused=reason)


def test_token_window_mismatch_refuses() -> None:
    base, q = rec("bf16", 0.5, 20.0, 40.0), rec("awq", 0.45, 21.0, 42.0)
    q["accuracy"]["token_perplexity"]["seq_len"] = 512
    assert "token_perplexity.seq_len: 512 vs 2048" in (eval_mismatch(view(q), view(base)) or "")


def test_find_baseline_same_model_only() -> None:
    base, other = rec("bf16", 0.5, 20.0, 40.0), rec("bf16", 0.6, 20.0, 40.0)
    other["job"]["model"] = "other"
    q = rec("awq", 0.45, 21.0, 42.0)
    other, base, q = view(other), view(base), view(q)
    assert find_baseline(q, [other, base, q]) is base
    assert find_baseline(q, [other, q]) is None


def test_pct_change_edge_cases() -> None:
    assert pct_change(None, 1.0) is None and pct_change(1.0, 0.0) is None
    assert pct_change(3.0, 2.0) == pytest.approx(50.0)


def test_find_records_skips_mlflow_artifact_copies(tmp_path) -> None:  # noqa: ANN001
    from quantverdict.results.record import find_records

    for d in ("runs/a", "multirun/x/b", "mlartifacts/1/abc/artifacts"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "record.json").write_text("{}")
    assert [p.parent.name for p in find_records(tmp_path)] == ["b", "a"]


def test_server_backend_deltas_need_the_same_served_length() -> None:
    # eval.backend=server: lm-eval's length depends on the server's max_model_len (eval.max_length + 2,
    # capped there), so a quantized job served with a shorter context scores other sequences
    srv = {"backend": "server"}
    base = rec("bf16", 0.5, 20.0, 40.0, **srv, server={"lm_eval_max_length": 2050})
    same = rec("awq", 0.45, 21.0, 42.0, **srv, server={"lm_eval_max_length": 2050})
    short = rec("awq", 0.45, 21.0, 42.0, **srv, server={"lm_eval_max_length": 2048})
    assert eval_mismatch(view(same), view(base)) is None
    assert (
        eval_mismatch(view(short), view(base))
        == "eval settings differ (server.lm_eval_max_length: 2048 vs baseline 2050)"
    )
