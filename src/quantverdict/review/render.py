"""The review as Markdown and as one self-contained HTML page (same content, built from one block list).

Blocks are tuples: ``("h1"|"h2"|"h3"|"p"|"verdict", text)``, ``("ul", [text])``,
``("table", header, rows)``, ``("img", name, alt)``. Text may hold ``**bold**``; HTML escapes
everything else. The HTML embeds each plot as a base64 PNG and loads nothing from outside.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import re
from typing import Any

from quantverdict.config.schema import ConfigError, ReviewConfig
from quantverdict.results.format import number as _f
from quantverdict.review import crossmodel, headline
from quantverdict.review.constraints import load_set, target_budget_gib
from quantverdict.review.cost import cost_blocks
from quantverdict.review.kld import kld_row
from quantverdict.review.model import Review
from quantverdict.review.scorecard import Scorecard, TaskDelta, na_label
from quantverdict.review.speed import ceiling_is_floor
from quantverdict.review.verdict import ceilings_differ_in_basis, floor_test_of

Block = tuple[Any, ...]
STATUS = {"pass": "PASS", "fail": "FAIL", "unknown": "n/a", "off": "off", "not_applicable": "not applicable"}


def _constraints(rc: ReviewConfig) -> Block:
    """Every key with its value, and whether it is the set file's (``conf/review/<name>.yaml``) or set."""
    try:
        default, where = load_set(rc.name), f"{rc.name}.yaml"
    except Exception:  # noqa: BLE001  (a set built in code: compare with the schema's defaults)
        default, where = ReviewConfig(), "default"
    derived = target_budget_gib(rc)  # review.target's budget, when it replaced the set's (constraints.resolve)
    rows = []
    for f in dataclasses.fields(ReviewConfig):
        v, d = getattr(rc, f.name), getattr(default, f.name)
        how = where if v == d else f"**set** ({where}: {_val(d)})"
        if f.name == "memory_budget_gib" and v != d and derived is not None and v == derived:
            how = f"from review.target ({where}: {_val(d)})"
        rows.append([f"review.{f.name}", _val(v), how])
    return ("table", ["key", "value", ""], rows)


def floor_tests_line(review: Review) -> str:
    """Which test judged each task against the accuracy floor (``review.floor_test``: auto, point,
    interval), with the item counts, e.g. 'floor_test auto: the interval test for a delta on fewer than
    200 items (arc_easy 50, hellaswag 30), the point test for the rest (none here)'; '' without deltas."""
    rc = review.config
    by: dict[str, dict[str, int | None]] = {"interval": {}, "point": {}}
    for sc in review.cards:
        for d in sc.accuracy:
            key = d.name if d.kind == "score" else d.metric
            by[floor_test_of(d, rc)].setdefault(key, d.n)
    if not by["interval"] and not by["point"]:
        return ""

    def names(tests: dict[str, int | None]) -> str:
        return ", ".join(f"{k} {n}" if n is not None else f"{k} (no item count)" for k, n in tests.items()) or "none"

    if rc.floor_test != "auto":
        return (
            f"floor_test {rc.floor_test}: every delta is judged by the {rc.floor_test} test "
            f"({names(by[rc.floor_test])})."
        )
    return (
        f"floor_test auto: the interval test for a delta on fewer than {rc.interval_test_below_n} items "
        f"({names(by['interval'])}), the point test for the rest ({names(by['point'])}). "
        "review.floor_test=point judges every delta on its estimate."
    )


def _val(v: Any) -> str:
    return "null" if v is None else str(v)


def _memory_rows(cards: list[Scorecard], checks: dict[str, Any]) -> list[list[str]]:
    rows = []
    for sc in cards:
        m = sc.memory
        c = checks.get(sc.scheme, {}).get("memory")
        rows.append(
            [
                sc.name,
                _f(m.get("bits_per_weight")),
                _f(m.get("checkpoint_gib"), ".3f"),
                _f(m.get("weights_gib"), ".3f") + (f" ({m['weights_source']})" if m.get("weights_source") else ""),
                _f(m.get("kv_needed_tokens"), ",d") + " / " + _f(m.get("kv_needed_gib"), ".3f"),
                _f(m.get("need_gib"), ".3f"),
                _f(m.get("budget_kv_tokens"), ",d"),
                _f(m.get("budget_max_concurrency"), ".1f"),
                _f(m.get("server_kv_tokens"), ",d"),
                _f(m.get("server_max_concurrency"), ".1f"),
                (", ".join(m.get("kernels") or []) or "–") + (" **fallback**" if m.get("fallback") else ""),
                STATUS[c.status] if c else "–",
            ]
        )
    return rows


def _ci(iv: Any, k: float = 1.0, fmt: str = "+.3f") -> str:
    return f"[{iv.low * k:{fmt}}, {iv.high * k:{fmt}}]" if iv is not None else ""


def _acc_rows(cards: list[Scorecard]) -> list[list[str]]:
    rows = []
    for sc in cards:
        if sc.is_baseline:
            continue
        if sc.accuracy_not_applicable:
            na = na_label(sc.accuracy_not_applicable)
            rows.append([sc.name, "–", "–", na, na, na, "–", "–", "–", sc.accuracy_not_applicable])
            continue
        if sc.accuracy_refused:
            rows.append([sc.name, "all", "–", "–", "–", "excluded: " + sc.accuracy_refused, "–", "–", "–", "–"])
            continue
        if not sc.accuracy:
            rows.append([sc.name, "–", "–", "–", "–", "; ".join(sc.missing) or "no accuracy", "–", "–", "–", "–"])
            continue
        for d in sc.accuracy:
            rows.append(kld_row(sc.name, d) or _acc_row(sc, d))  # issue #17: KLD rows beside the perplexity
    return rows


def _acc_row(sc: Scorecard, d: TaskDelta) -> list[str]:
    sig = "–" if d.significant is None else ("yes" if d.significant else "not significant")
    method = d.interval.method if d.interval else "no interval"
    if d.kind == "score":
        delta = f"{_f(d.delta, '+.3f')} {_ci(d.interval)}"
        rec = f"{_f(d.recovery_pct, '.1f')}% {_ci(d.recovery_interval, 1.0, '.1f')}"
        value = f"{d.value:.3f} vs {d.baseline:.3f}"
    else:
        delta = f"{_f(d.delta_pct, '+.2f')}% {_ci(d.interval, 1.0, '+.2f')}"
        rec = "–"
        value = f"{d.value:.3f} vs {d.baseline:.3f}"
    p = "–" if d.mcnemar_p is None else f"{d.mcnemar_p:.3g} (b={d.mcnemar_b}, c={d.mcnemar_c})"
    return [sc.name, d.name, d.metric, value, delta, rec, p, _f(d.n, "d") if isinstance(d.n, int) else "–", sig, method]


BASIS_WORDS = {"steady_window": "steady window", "whole_run": "whole run", "mixed": "steady and whole-run repeats"}


def _speed_rows(
    cards: list[Scorecard], checks: dict[str, Any], name_basis: bool, with_compute: bool = False
) -> list[list[str]]:
    rows = []
    for sc in cards:
        sp = sc.speed
        c = checks.get(sc.scheme, {}).get("latency")
        if not sp.get("points"):
            rows.append([sc.name] + ["–"] * (10 if with_compute else 9) + [STATUS[c.status] if c else "–"])
            continue
        at = sp.get("at_load") or {}
        rows.append(
            [
                sc.name,
                f"{_f(sp.get('single_itl_ms_p50'), '.1f')} ({sp.get('low_label')})",
                _f(sp.get("single_tok_s"), ".1f"),
                ("≥ " if ceiling_is_floor(sp) else "") + _f(sp.get("ceiling_rps"), ".2f"),
                ("≥ " if ceiling_is_floor(sp) else "")
                + _f(sp.get("ceiling_tok_s"), ".1f")
                + (
                    f" [{sp['ceiling_tok_s_range'][0]:.1f}-{sp['ceiling_tok_s_range'][1]:.1f}]"
                    if sp.get("ceiling_tok_s_range") and (sp.get("ceiling_repeats") or 1) > 1
                    else ""
                )
                + (
                    f" ({BASIS_WORDS[sp['ceiling_basis']]})"
                    if name_basis and sp.get("ceiling_basis") in BASIS_WORDS
                    else ""
                ),
                _goodput_cell(sp),
                str(at.get("label", "–")),
                _f(at.get("ttft_ms_p99"), ",.0f"),
                _f(at.get("itl_ms_p99"), ",.1f"),
                _f(at.get("e2e_ms_p50"), ",.0f"),
                *([_compute_cell(sp)] if with_compute else []),
                STATUS[c.status] if c else "–",
            ]
        )
    return rows


def _compute_cell(sp: dict[str, Any]) -> str:
    """The kernel vLLM chose and whether it computes in the format: 'MarlinNvFp4LinearKernel, emulated (weight-only
    fallback: ...)'; '–' without a parsed server log."""
    if not sp.get("kernel") and not sp.get("compute"):
        return "–"
    cell = f"{sp.get('kernel') or 'default GEMM'}, {sp.get('compute') or 'compute unknown'}"
    return cell + (f" ({sp['compute_reason']})" if sp.get("compute") == "emulated" and sp.get("compute_reason") else "")


def _goodput_cell(sp: dict[str, Any]) -> str:
    """'0.95 (at 1 req/s: 19 of 20 requests met the SLO (95.0%))', or '– (why)' without per-request data."""
    g, how = sp.get("goodput_rps"), sp.get("goodput_how") or ""
    if g is None:
        return f"– ({how})" if how else "–"
    return f"{g:.2f} ({how})" if g else f"0 ({how})"


def _range(rng: Any) -> str:
    """`` [a-b]`` for a run-to-run range that is not a single value, else ''."""
    return f" [{rng[0]:.2f}-{rng[1]:.2f}]" if rng and rng[0] != rng[1] else ""


def _roofline_rows(cards: list[Scorecard]) -> list[list[str]]:
    """One row per scheme with ``speed.roofline`` (:mod:`quantverdict.measure.roofline`): bytes read per decode
    step, the measured copy bandwidth, the ideal and measured ms/token at concurrency 1, the efficiency."""
    rows = []
    for sc in cards:
        rl = sc.speed.get("roofline")
        if not rl:
            continue

        def g(key: str) -> float | None:
            v = rl.get(key)
            return v / 1e9 if isinstance(v, (int, float)) else None

        eff = rl.get("efficiency")
        rows.append(
            [
                sc.name,
                _f(g("decode_bytes"), ".2f"),
                _f(g("copy_bytes_per_s"), ",.0f"),
                _f(rl.get("ideal_ms_per_token"), ".2f"),
                _f(rl.get("tpot_ms"), ".2f"),
                _f(g("achieved_bytes_per_s"), ",.0f"),
                _f(100 * eff, ".0f", "%") if isinstance(eff, (int, float)) else (rl.get("note") or "–"),
            ]
        )
    return rows


def _check_cell(c: Any) -> str:
    if c.status == "not_applicable":
        return str(c.text)
    return f"{STATUS[c.status]}: {c.text}" + (f" — **{c.shortfall}**" if c.shortfall else "")


def _points_rows(cards: list[Scorecard]) -> list[list[str]]:
    rows = []
    for sc in cards:
        for p in sc.speed.get("points", []):
            out_ok = ""
            want, got = p.get("output_tokens_requested"), p.get("output_tokens_total")
            if want:
                out_ok = f"{_f(got, ',.0f')}/{want:,.0f}"
            rows.append(
                [
                    sc.name,
                    p["label"],
                    _f(p.get("achieved_rps")),
                    _f(p.get("output_tok_s"), ".1f"),
                    _f(p.get("ttft_ms_p50"), ",.0f"),
                    _f(p.get("ttft_ms_p99"), ",.0f"),
                    _f(p.get("itl_ms_p50"), ",.1f"),
                    _f(p.get("itl_ms_p99"), ",.1f"),
                    _f(p.get("e2e_ms_p99"), ",.0f"),
                    f"{_f(p.get('completed'), 'g')}/{_f(p.get('failed'), 'g')}",
                    out_ok or "–",
                    f"{p.get('valid_repeats', 1)}/{p.get('repeats', 1)}",
                    {True: "yes", False: "no", None: "–"}[p.get("saturated")],
                ]
            )
    return rows


def _na_models(review: Review) -> list[str]:
    """The models whose accuracy was not measured (synthetic, random weights)."""
    return [v.model for v in review.verdicts if v.accuracy_not_measured]


def _checks_word(cs: dict[str, Any]) -> str:
    """``meets all three``, ``fails accuracy``, ``fails memory; latency n/a``: one scheme's checks in a cell."""
    fails = [c.constraint for c in cs.values() if c.status == "fail"]
    unknown = [c.constraint for c in cs.values() if c.status == "unknown"]
    if not fails and not unknown:
        return "PASS all three" if cs else "–"
    bits = ([f"FAIL {', '.join(fails)}"] if fails else []) + ([f"{', '.join(unknown)} n/a"] if unknown else [])
    return "; ".join(bits)


def first_screen_rows(review: Review, model: str) -> list[list[str]]:
    """One row per scheme of ``model``: GiB to serve the stated load, the worst accuracy delta with its
    interval, the per-user speed ratio to the baseline at concurrency 1 and at the stated load, its checks."""
    checks = review.checks.get(model, {})
    rows = []
    for h in headline.headlines(review, model):
        sc = next(c for c in review.cards_of(model) if c.scheme == h.scheme)
        if h.is_baseline:
            c1 = load = "1x (the reference)"
        elif h.speed_note:
            c1 = load = h.speed_note
        else:
            c1 = h.speed_c1.text() if h.speed_c1 else "–"
            load = h.speed_load.text() if h.speed_load else "–"
        rows.append(
            [
                h.name,
                _f(h.mem_gib, ".3f", " GiB"),
                headline.accuracy_text(h.accuracy, sc),
                c1,
                load,
                _checks_word(checks.get(h.scheme, {})),
            ]
        )
    return rows


def first_screen_header(review: Review, model: str) -> list[str]:
    """The first screen's column names, with the stated load and the baseline's name."""
    rc = review.config
    base = next((c.scheme for c in review.cards_of(model) if c.is_baseline), "the baseline")
    budget = f" (budget {rc.memory_budget_gib:g} GiB)" if rc.memory_budget_gib is not None else ""
    return [
        "scheme",
        f"GiB to serve {headline.memory_load_text(rc)}{budget}",
        f"accuracy vs {base}: worst change [{rc.confidence:.0%} CI]",
        f"speed vs {base} at concurrency 1 (tok/s per user)",
        f"speed vs {base} at the stated load ({headline.load_text(rc)})",
        "checks",
    ]


def _cross_model_or_none(review: Review) -> crossmodel.CrossModel | None:
    """The cross-model findings, None with one model and no target or a target that cannot be loaded (the
    "Across models" section then says why)."""
    try:
        return crossmodel.cross_model(review)
    except ConfigError:
        return None


def _first_screen(review: Review) -> list[Block]:
    """The title, then per model its verdict and one line per scheme with its three numbers."""
    out: list[Block] = [("h1", "quantverdict review")]
    cm = _cross_model_or_none(review)
    if cm is not None and len({c.card.model for c in cm.candidates}) > 1:  # the question asked: across models first
        out.append(("verdict", cm.sentence + ' ("Across models" below; per model next)', "ok" if cm.chosen else "warn"))
    for v in review.verdicts:
        if len(review.verdicts) > 1:
            out.append(("h2", v.model))
        ok = v.decision in ("quantize", "do not quantize") and not v.accuracy_not_measured
        out.append(("verdict", v.sentence, "ok" if ok else "warn"))
        out.append(("table", first_screen_header(review, v.model), first_screen_rows(review, v.model)))
        out += cost_blocks(review, v)  # issue #17: the verdict in USD per million output tokens (with a price)
    out.append(
        (
            "p",
            "Speed: the scheme's per-user output speed (1000 / TPOT p50, tok/s) over the baseline's at the same "
            "load level; > 1x is faster; [range] over repeats. Accuracy: the largest perplexity rise among "
            f"review.perplexity_kinds ({', '.join(review.config.perplexity_kinds)}), else the task with the "
            "lowest recovery. Memory: weights + KV cache for the stated capacity + reserve.",
        )
    )
    return out


def _header(review: Review) -> list[Block]:
    """Source line (jobs, constraint set, time), where the records ran, accuracy-not-measured note."""
    rc = review.config
    n_ok = sum(sc.status == "ok" for sc in review.cards)
    n_cut = sum(sc.status == "interrupted" for sc in review.cards)
    cut = f", {n_cut} interrupted" if n_cut else ""
    out: list[Block] = [
        (
            "p",
            (
                f"Source: `{review.source}` · {len(review.cards)} job{'s' * (len(review.cards) != 1)} "
                f"({n_ok} finished, "
                f"{len(review.cards) - n_ok - n_cut} failed{cut}) · constraint set **{rc.name}** "
                f"(`{review.label}`) · generated {review.generated_at}"
            ),
        ),
    ]
    if review.environment:
        out.append(("p", "Ran on: " + " · ".join(review.environment)))
    na_models = _na_models(review)
    if na_models:
        out.append(
            (
                "p",
                f"**Accuracy not measured** for {', '.join(na_models)}: synthetic model(s) with random weights, "
                "accuracy is not applicable; memory and speed are real, and the verdict rests on them alone.",
            )
        )
    return out


def _verdict_section(review: Review) -> list[Block]:
    """Each model's verdict with its evidence, binding constraint and the other schemes."""
    out: list[Block] = []
    out.append(("h2", "Verdict: the evidence"))
    for v in review.verdicts:
        if len(review.verdicts) > 1:
            out.append(("h3", v.model))
        if v.evidence:
            out.append(("ul", v.evidence))
        if v.binding:
            out.append(("p", "**Binding constraint** (what the baseline fails):"))
            out.append(("ul", v.binding))
        if v.others:
            out.append(("p", f"**Other schemes**, in the order tried (least aggressive first: {' > '.join(v.order)}):"))
            out.append(("ul", v.others))
    return out


def _constraints_section(review: Review) -> list[Block]:
    """The constraint set: how it was picked, what each constraint means, its values, the floor tests."""
    rc = review.config
    na_models = _na_models(review)
    out: list[Block] = []
    out += [
        ("h2", "Constraints"),
        (
            "p",
            (review.constraints_how[:1].upper() + review.constraints_how[1:] + ".") if review.constraints_how else "",
        ),
        (
            "p",
            (
                "Memory: weights (vLLM log, else checkpoint) + KV cache for the capacity needed "
                "(2 × KV layers × KV heads × head_dim × bytes of the served KV dtype per token: the server's "
                "dtype unless kv_cache_dtype is set) + a hybrid model's recurrent state per "
                "request (Gated DeltaNet layers) + reserve <= budget. Accuracy: every "
                "task's recovery (100 × score / baseline) >= the floor and every listed perplexity kind rises by "
                "at most "
                "the limit. Latency: at least slo_attainment_pct % of the requests at the stated load meet every "
                "objective (TTFT, TPOT = a request's mean ITL, E2E if set; vllm bench serve --goodput); a record "
                "without per-request data is judged on its TTFT p99 and ITL p99 instead; and the sweep's ceiling "
                "reaches the load. null = no constraint."
            ),
        ),
        _constraints(rc),
    ]
    tests = floor_tests_line(review)
    if tests:
        out.append(("p", tests))
    if na_models and (rc.min_recovery_pct is not None or rc.max_perplexity_increase_pct is not None):
        out.append(
            (
                "p",
                f"The accuracy floor is **not applicable** to {', '.join(na_models)} (random weights: accuracy not "
                "measured) and does not block its verdict.",
            )
        )
    return out


def _memory_table(cards: list[Scorecard], checks: dict[str, Any]) -> list[Block]:
    """One model's memory table."""
    out: list[Block] = []
    out.append(("h3", "Memory"))
    out.append(
        (
            "table",
            [
                "scheme",
                "bits/weight",
                "checkpoint GiB",
                "weights GiB",
                "KV needed tokens / GiB",
                "need GiB",
                "KV tokens in budget",
                "max concurrency in budget",
                "vLLM KV tokens",
                "vLLM max concurrency",
                "kernel",
                "memory",
            ],
            _memory_rows(cards, checks),
        )
    )
    return out


def _accuracy_table(cards: list[Scorecard], rc: ReviewConfig) -> list[Block]:
    """One model's accuracy deltas with how their intervals were made."""
    out: list[Block] = []
    out.append(("h3", "Accuracy (against the baseline of the same model)"))
    boot = f", seed {rc.seed}, {rc.bootstrap_samples:,} resamples" if rc.interval == "bootstrap" else ""
    out.append(
        (
            "p",
            (
                f"{rc.confidence:.0%} intervals are paired over the same items where per-item samples exist "
                f"({rc.interval}{boot}), else unpaired from the two stderrs (see the interval column); "
                "a difference whose interval contains 0 is **not significant**. McNemar's exact test on the "
                "discordant items (b: scheme right, baseline wrong; c: the reverse) is shown for 0/1 metrics."
            ),
        )
    )
    out.append(
        (
            "table",
            [
                "scheme",
                "task",
                "metric",
                "value vs baseline",
                "delta [95% CI]",
                "recovery [95% CI]",
                "McNemar p",
                "n",
                "significant",
                "interval",
            ],
            _acc_rows(cards),
        )
    )
    return out


def workload_sentence(cards: list[Scorecard]) -> str:
    """The request shape one model's sweeps ran (``speed.workload`` of the scorecards with sweep points), as a
    sentence: one shape for all, or each scheme's when they differ; '' when no scorecard has points."""
    shapes = {
        sc.name: sc.speed["workload"]["text"] for sc in cards if sc.speed.get("points") and sc.speed.get("workload")
    }
    if not shapes:
        return ""
    if len(set(shapes.values())) == 1:
        return (
            f"Request shape: {next(iter(shapes.values()))}. Every speedup here holds for this shape: the prefill "
            "share of the work moves the crossover (another shape: bench.input_len and bench.output_len, or on a "
            "GPU bench=gpu-concurrency-prefill / bench=gpu-concurrency-decode)."
        )
    each = "; ".join(f"{name}: {text}" for name, text in shapes.items())
    return f"Request shapes differ ({each}): a scheme is compared only with a baseline swept at its own shape."


def _speed_table(cards: list[Scorecard], checks: dict[str, Any]) -> list[Block]:
    """One model's speed summary with what each column means."""
    out: list[Block] = []
    name_basis = ceilings_differ_in_basis(cards)
    with_compute = any(sc.speed.get("compute") for sc in cards)  # a column where a server log said it
    out.append(("h3", "Speed (vLLM serving sweep)"))
    shape = workload_sentence(cards)
    if shape:
        out.append(("p", shape))
    out.append(
        (
            "p",
            (
                "Single stream: the lowest measured load (ITL p50; tok/s = 1000 / TPOT p50 per request). "
                "Ceiling: open loop, the highest achieved rate over the valid loads (completed requests over the "
                "whole run, so never under a rate achieved nor under the goodput; '>=' when no point saturated); "
                "closed loop, the best concurrency (steady-state window when there is one). Goodput: requests "
                "meeting every objective (TTFT, TPOT, E2E if set) per second at the stated load (vllm bench serve "
                "--goodput), with how many of how many requests; '–' without per-request data (the cell says why). "
                "Saturated: requests completed at under 90% of the pace they were sent, decided once per point "
                "when it was measured. Every number: the median over valid repeats."
                + (
                    " Kernel, compute: the linear kernel vLLM chose and whether it computes in the scheme's format "
                    "(native) or dequantizes it (emulated: its speed is never credited to the format's arithmetic)."
                    if with_compute
                    else ""
                )
                + (
                    " The ceilings below rest on different windows (each cell names its own): a steady window "
                    "excludes ramp-up and drain, a whole run includes them, so compare schemes at one load in "
                    "the paired speedups of the regime section instead."
                    if name_basis
                    else ""
                )
            ),
        )
    )
    out.append(
        (
            "table",
            [
                "scheme",
                "single-stream ITL p50 ms",
                "single-stream tok/s",
                "ceiling req/s",
                "ceiling tok/s",
                "goodput req/s",
                "at load",
                "TTFT p99 ms",
                "ITL p99 ms",
                "E2E p50 ms",
                *(["kernel, compute"] if with_compute else []),
                "latency",
            ],
            _speed_rows(cards, checks, name_basis, with_compute),
        )
    )
    return out


def _roofline_table(cards: list[Scorecard]) -> list[Block]:
    """One model's roofline at concurrency 1 (nothing when no scheme has one)."""
    out: list[Block] = []
    roof = _roofline_rows(cards)
    if roof:
        out.append(("h3", "Roofline at concurrency 1"))
        out.append(
            (
                "p",
                (
                    "Decode at concurrency 1 against reading the weights once per token: ideal = bytes read per "
                    "decode step (every stored tensor but the input embeddings and any vision/MTP tower) / "
                    "the measured HBM copy bandwidth (read + write); efficiency = ideal / measured TPOT p50 at "
                    "c=1 (1.0 = the copy bandwidth)."
                ),
            )
        )
        out.append(
            (
                "table",
                [
                    "scheme",
                    "GB read/token",
                    "HBM copy GB/s",
                    "ideal ms/token",
                    "TPOT c=1 ms",
                    "achieved GB/s",
                    "roofline efficiency (c=1)",
                ],
                roof,
            )
        )
    return out


def _checks_table(cards: list[Scorecard], checks: dict[str, Any]) -> list[Block]:
    """One model's three checks per scheme."""
    out: list[Block] = []
    out.append(("h3", "Checks"))
    rows = []
    for sc in cards:
        cs = checks.get(sc.scheme, {})
        rows.append([sc.name] + [_check_cell(c) for c in cs.values()])
    out.append(("table", ["scheme", "memory", "accuracy", "latency"], rows))
    return out


def _claim_cell(claim: Any, median: Any, rng: Any) -> str:
    """A regime claim's speedup as a table cell: ``1.22x [1.16-1.29] (paired, n=3)`` with a paired test, else
    the median with its min-max range (``single run`` when there is none)."""
    if not claim:
        return _f(median, ".2f", "x") + _range(rng)
    if claim["rule"] == "paired t":
        return f"{claim['speedup']:.2f}x [{claim['low']:.2f}-{claim['high']:.2f}] (95% CI, paired, n={claim['pairs']})"
    if claim["rule"] == "min-max range":
        return f"{claim['speedup']:.2f}x [{claim['low']:.2f}-{claim['high']:.2f}] (min-max range)"
    return f"{claim['speedup']:.2f}x (single run)"


TABLE_PAIRED_METRICS = ("output_tok_s", "itl_ms_p50")  # review.json also holds TPOT p50


def _regime_table(review: Review, model: str) -> list[Block]:
    """One model's speedups over its baseline at low load and at saturation, each with the rule it rests on,
    then the per-load speedups paired by repeat (output tok/s and ITL p50, >= 2 pairs) they come from."""
    out: list[Block] = []
    regime = review.regime.get(model, [])
    out.append(("h3", "Regime: where quantization pays"))
    shape = workload_sentence(review.cards_of(model))
    if shape:
        out.append(("p", shape))
    out.append(
        (
            "p",
            (
                "Speedup over the baseline at low load (baseline ITL p50 / the scheme's) and at saturation (the "
                "scheme's output tok/s / the baseline's); > 1 is faster. Where both ran >= 2 repeats at the same "
                "load, each claim rests on the ratio paired by repeat (Student's t on the per-repeat log ratios, "
                "95% CI): faster or slower when the interval excludes 1, else no difference established (low "
                "load: the lowest load both measured; saturation: the highest). Otherwise it rests on the median "
                "and its min-max range over repeats (or a single run): a speedup pays (>= 1.05x) or costs only "
                "when its whole range does. A scheme that ran on a fallback kernel, or at another request shape than "
                "its baseline, is not compared."
            ),
        )
    )
    out.append(
        (
            "table",
            ["scheme", "low load", "saturation", "reading"],
            [
                [
                    f"{r['scheme']} ({r['label']})",
                    _claim_cell(r.get("low_claim"), r["low"], r.get("low_range")),
                    (
                        f"not compared: {r['sat_gap']}"
                        if r.get("sat_gap")
                        else _claim_cell(r.get("sat_claim"), r["sat"], r.get("sat_range"))
                    ),
                    r["text"].split("-> ", 1)[-1],
                ]
                for r in regime
            ],
        )
    )
    paired = [
        [f"{r['scheme']} ({r['label']})", p["label"], p["name"], f"{p['speedup']:.3f}x"]
        + [f"{p['speedup_low']:.3f}-{p['speedup_high']:.3f}", str(p["pairs"]), p["verdict"]]
        for r in regime
        for p in r.get("paired") or []
        if p["metric"] in TABLE_PAIRED_METRICS and p["pairs"] >= 2
    ]
    if paired:
        out.append(
            (
                "p",
                "Speedup over the baseline per load, paired by repeat (a latency as baseline / scheme, so > 1 is "
                "faster throughout; geometric mean of the per-repeat ratios, 95% CI from Student's t):",
            )
        )
        out.append(("table", ["scheme", "load", "metric", "speedup", "95% CI", "n pairs", "verdict"], paired))
    elif regime:
        out.append(
            (
                "p",
                "No load level has >= 2 repeats of a scheme and its baseline to pair: no paired interval; the "
                "claims above use the 1.05x rule.",
            )
        )
    return out


def _scorecard_section(review: Review) -> list[Block]:
    """Per model: memory, accuracy, speed, roofline, checks and regime tables."""
    out: list[Block] = [("h2", "Scorecard")]
    for model in dict.fromkeys(sc.model for sc in review.cards):
        cards = review.cards_of(model)
        checks = review.checks.get(model, {})
        if len(review.verdicts) > 1:
            out.append(("h3", model))
        out += _memory_table(cards, checks)
        out += _accuracy_table(cards, review.config)
        out += _speed_table(cards, checks)
        out += _roofline_table(cards)
        out += _checks_table(cards, checks)
        out += _regime_table(review, model)
    return out


def _plots_section(review: Review, pngs: dict[str, bytes]) -> list[Block]:
    """The plots (embedded PNGs) with their alt texts."""
    na_models = _na_models(review)
    out: list[Block] = []
    out.append(("h2", "Plots"))
    alts = {
        "speed_ratio": "per-user output speed of each scheme over the baseline's against the load (log2 axis), "
        "with the range over repeats",
        "pareto": "total output tok/s against per-user tok/s (1000 / TPOT p50), one curve per scheme, "
        "and the Pareto frontier",
        "memory": "weights + KV cache to serve the stated load, per scheme, against the memory budget",
        "accuracy": "accuracy deltas and perplexity changes with their intervals",
        "latency": "TTFT p99 and per-request TPOT p99 (else ITL p99) against the load (log2 axis), with the objectives",
    }
    for name in pngs:
        out.append(("img", name, alts.get(name, name)))
    if not pngs:
        out.append(("p", "No data to plot."))
    if na_models and "accuracy" not in pngs:
        out.append(("p", f"No accuracy plot: accuracy is not applicable to {', '.join(na_models)} (random weights)."))
    return out


def _honesty_section(review: Review) -> list[Block]:
    """Flags, the Validity lines, what is missing and the notes."""
    out: list[Block] = []
    out.append(("h2", "Honesty checks"))
    cm = _cross_model_or_none(review)
    across = [f"{c.name}, across models: {flag}" for c in (cm.candidates if cm else []) for flag in c.flags]
    out.append(("ul", [f.message for f in review.flags] + across or ["nothing flagged"]))
    if review.validity:
        out.append(("h3", "Validity"))
        out.append(
            (
                "p",
                (
                    "What each number stands on. Speed: medians over the valid repeats of each load level; a point "
                    "whose output tokens fall under 90% of those requested is invalid and left out; an open-loop "
                    "point whose requests completed at under 90% of the pace they were sent is saturated, and the "
                    "ceiling is the highest achieved rate over the valid loads. Accuracy: the same batch size, "
                    "dtype and max length as the baseline, and a batch-invariance check of the log-likelihoods."
                ),
            )
        )
        out.append(("ul", review.validity))
    missing = [f"{sc.name}: {m}" for sc in review.cards for m in sc.missing]
    if missing:
        out.append(
            ("p", "**Missing** (these checks could not be made; a scheme with a missing check is never chosen):")
        )
        out.append(("ul", missing))
    if review.notes:
        out.append(("p", "**Notes**"))
        out.append(("ul", review.notes))
    return out


def _points_section(review: Review) -> list[Block]:
    """Every load level of every scheme."""
    out: list[Block] = []
    out.append(("h2", "Sweep points"))
    out.append(
        ("p", "One row per load level: medians over its valid repeats (invalid points left out, see Honesty checks).")
    )
    out.append(
        (
            "table",
            [
                "scheme",
                "load",
                "req/s",
                "out tok/s",
                "TTFT p50",
                "TTFT p99",
                "ITL p50",
                "ITL p99",
                "E2E p99",
                "ok/failed",
                "output tokens / requested",
                "valid repeats",
                "saturated",
            ],
            _points_rows(review.cards),
        )
    )
    return out


def blocks(review: Review, pngs: dict[str, bytes]) -> list[Block]:
    """The review's content, in reading order."""
    return (
        _first_screen(review)
        + _header(review)
        + _verdict_section(review)
        + crossmodel.section(review)
        + _constraints_section(review)
        + _scorecard_section(review)
        + _plots_section(review, pngs)
        + _honesty_section(review)
        + _points_section(review)
    )


# --- Markdown ---------------------------------------------------------------------------------------


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def to_markdown(bl: list[Block]) -> str:
    """Markdown; images refer to ``plots/<name>.png`` beside the file."""
    lines: list[str] = []
    for b in bl:
        kind = b[0]
        if kind in ("h1", "h2", "h3"):
            lines += ["#" * int(kind[1]) + " " + b[1], ""]
        elif kind == "p":
            lines += [b[1], ""]
        elif kind == "verdict":
            lines += ["> " + b[1], ""]
        elif kind == "ul":
            lines += [f"- {item}" for item in b[1]] + [""]
        elif kind == "table":
            header, rows = b[1], b[2]
            lines.append("| " + " | ".join(_md_cell(h) for h in header) + " |")
            lines.append("|" + "---|" * len(header))
            lines += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows]
            lines.append("")
        elif kind == "img":
            lines += [f"![{b[2]}](plots/{b[1]}.png)", ""]
    return "\n".join(lines)


# --- HTML -------------------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1200px;
padding:0 1em;color:#222;line-height:1.45}
h1{border-bottom:2px solid #444}h2{border-bottom:1px solid #bbb;margin-top:1.8em}
table{border-collapse:collapse;margin:.6em 0;font-size:.86em}
th,td{border:1px solid #ccc;padding:.25em .5em;vertical-align:top;text-align:left}
th{background:#f0f0f0}tr:nth-child(even) td{background:#fafafa}
.verdict{background:#eef6ee;border-left:5px solid #3a7d44;padding:.7em 1em;margin:.8em 0}
.verdict.warn{background:#fff6e5;border-left-color:#c77700}
img{max-width:100%;border:1px solid #ddd;margin:.5em 0}code{background:#f4f4f4;padding:0 .2em}
.pass{color:#1a7f37;font-weight:600}.fail{color:#b42318;font-weight:600}
"""


def _inline(text: str) -> str:
    s = html.escape(text)
    s = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", s)
    s = re.sub(r"`(.+?)`", r"<code>\1</code>", s)
    s = re.sub(r"\bPASS\b", '<span class="pass">PASS</span>', s)
    return re.sub(r"\bFAIL\b", '<span class="fail">FAIL</span>', s)


def to_html(bl: list[Block], title: str, pngs: dict[str, bytes]) -> str:
    """One self-contained page: inline CSS, plots as ``data:image/png;base64`` images, no script."""
    images = pngs
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{CSS}</style></head><body>",
    ]
    for b in bl:
        kind = b[0]
        if kind in ("h1", "h2", "h3"):
            parts.append(f"<{kind}>{_inline(b[1])}</{kind}>")
        elif kind == "p":
            parts.append(f"<p>{_inline(b[1])}</p>")
        elif kind == "verdict":
            cls = "verdict warn" if len(b) > 2 and b[2] == "warn" else "verdict"
            parts.append(f'<div class="{cls}">{_inline(b[1])}</div>')
        elif kind == "ul":
            parts.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in b[1]) + "</ul>")
        elif kind == "table":
            head = "".join(f"<th>{_inline(h)}</th>" for h in b[1])
            body = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in b[2])
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif kind == "img":
            data = images.get(b[1])
            if data:
                b64 = base64.b64encode(data).decode("ascii")
                parts.append(
                    f'<figure><img alt="{html.escape(b[2])}" src="data:image/png;base64,{b64}">'
                    f"<figcaption>{html.escape(b[2])}</figcaption></figure>"
                )
    parts.append("</body></html>")
    return "\n".join(parts)
