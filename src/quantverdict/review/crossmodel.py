"""Candidates across models: which (model, scheme) to deploy on a target GPU, and the seed's tables.

The per-model verdict (:mod:`quantverdict.review.verdict`) compares each scheme with the baseline of its own
model. This section answers the question across models: every (model, scheme) job of the reviewed grids is a
candidate, each is checked on the deployment target (``review.target``, :mod:`quantverdict.config.targets`)
even when the jobs ran on another device, and the best candidate that meets the constraints is named. When a
bigger model quantized competes with a smaller one unquantized, the section says which wins on each of the
three numbers. Tables, side by side:

* memory on the target: weights, KV cache GiB (``memory_gib x memory_fraction - weights - reserved_gib``,
  :func:`quantverdict.measure.decode_bytes.target_kv_budget_bytes`), KV tokens and maximum concurrency of
  max-length requests (:func:`quantverdict.measure.decode_bytes.kv_capacity`), with vLLM's own figures beside
  them when the job was served with the target's budget (``--kv-cache-memory-bytes`` in
  ``bench.server.extra_args``);
* accuracy in absolute terms on the same tasks and items (paired on ``doc_id`` across models), each model's
  own quantization delta beside it;
* the rate sweep of every candidate at the same offered loads;
* the ceiling ratio against the prediction from bytes per decode step
  (:func:`quantverdict.measure.decode_bytes.predicted_speed_ratio`), measured / predicted;
* the decode-step fit, TPOT = fixed + per-sequence cost x sequences in flight
  (:func:`quantverdict.measure.decode_fit.fit_decode_step`), with its R^2.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantverdict.config.schema import ReviewConfig, TargetConfig
from quantverdict.config.targets import load_target, vllm_batch_defaults
from quantverdict.measure import stats
from quantverdict.measure.cost import usd_per_mtok
from quantverdict.measure.decode_bytes import (
    decode_step_bytes,
    kv_capacity,
    predicted_speed_ratio,
    target_kv_budget_bytes,
)
from quantverdict.measure.decode_fit import DecodeFit, fit_decode_step, in_flight
from quantverdict.measure.memory import GIB
from quantverdict.results.baseline import headline_of
from quantverdict.results.format import number as _f
from quantverdict.results.record import JobRecord
from quantverdict.review import sources
from quantverdict.review.accuracy import pair_samples, read_samples
from quantverdict.review.cost import GPU_LINE, gpu_price
from quantverdict.review.document import PairedAcross
from quantverdict.review.gpus import gpu_kind_matches, whole_weights_gib
from quantverdict.review.model import Review
from quantverdict.review.scorecard import Scorecard
from quantverdict.review.speed import ceiling_is_floor, shape_of
from quantverdict.review.verdict import NON_BLOCKING

ROOFLINE_BYTES = "checkpoint tensors a decode step reads"
SAME_BUDGET = 0.05  # a served --kv-cache-memory-bytes within 5% of the target's KV budget counts as the target's
# vLLM's human_readable_int (vllm/utils/argparse_utils.py): lowercase decimal, uppercase binary (integers only)
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


@dataclass
class Candidate:
    """One (model, scheme) job seen from the target."""

    card: Scorecard
    record: JobRecord | None
    weights_gib: float | None = None
    weights_how: str = ""
    target: dict[str, Any] = field(default_factory=dict)  # kv_gib, kv_tokens, max_concurrency, fits, why
    vllm: dict[str, Any] = field(default_factory=dict)  # vLLM's own figures and the budget they were run at
    ceiling_tok_s: float | None = None
    ceiling_lower_bound: bool = False  # no point saturated, or the sweep stopped before its top loads
    step_bytes: float | None = None
    step_bytes_how: str = ""
    fit: DecodeFit | None = None  # TPOT p50 against sequences in flight
    fit_itl: DecodeFit | None = None  # ITL p50 against the same: the decode step without the prefill stalls
    fit_note: str = ""
    scores: dict[str, tuple[str, float, int | None]] = field(default_factory=dict)  # task -> (metric, value, n)
    eligible: bool = False
    why_not: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)  # met the constraints, with a caveat

    @property
    def name(self) -> str:
        return f"{self.card.model} {self.card.scheme} ({self.card.label})"


@dataclass
class CrossModel:
    """The cross-model section's findings."""

    target: TargetConfig | None
    target_note: str
    candidates: list[Candidate]
    chosen: Candidate | None
    sentence: str
    ranking: str
    comparisons: list[str] = field(default_factory=list)  # bigger quantized vs smaller unquantized
    paired: list[PairedAcross] = field(default_factory=list)  # the paired accuracy table
    reference: Candidate | None = None  # of the speed ratios
    # USD per GPU-hour of the $ column (None: no price), or why there is none ("not comparable: ran on ...")
    price: float | None = None
    price_note: str = ""


def vllm_int_arg(args: list[Any], flag: str) -> int | None:
    """The integer value of ``flag`` in vLLM server arguments (``flag N`` or ``flag=N``), read as vLLM's
    ``human_readable_int`` reads it: plain, or with ``k``/``m``/``g``/``t`` (x1000, decimals allowed) or
    ``K``/``M``/``G``/``T`` (x1024, integers only); None when absent or unreadable (what vLLM would refuse).
    E.g. ``2k`` = 2,000, ``2K`` = 2,048, ``25.6k`` = 25,600."""
    items = [str(a) for a in args or []]
    for i, a in enumerate(items):
        if a != flag and not a.startswith(flag + "="):
            continue
        raw = (a.split("=", 1)[1] if "=" in a else (items[i + 1] if i + 1 < len(items) else "")).strip()
        if raw.isdigit():
            return int(raw)
        m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgtKMGT])", raw)
        if m and m.group(2) in _DECIMAL:
            return int(float(m.group(1)) * _DECIMAL[m.group(2)])
        if m and m.group(1).isdigit():
            return int(m.group(1)) * _BINARY[m.group(2)]
    return None


def parse_kv_cache_memory_bytes(args: list[Any]) -> int | None:
    """The value of ``--kv-cache-memory-bytes`` in vLLM server arguments (:func:`vllm_int_arg`)."""
    return vllm_int_arg(args, "--kv-cache-memory-bytes")


def _records_by_id(review: Review) -> dict[str, JobRecord]:
    src = Path(review.source)
    if not src.is_dir():  # an MLflow source: the downloaded records are gone by now; cards only
        return {}
    records, _ = sources.load_dir(src)
    return {str(r.job.id): r for r in records}


def _max_model_len(rec: JobRecord | None) -> int | None:
    if rec is None:
        return None
    n = (rec.cfg("bench").get("server") or {}).get("max_model_len") or rec.cfg("model").get("max_model_len")
    return int(n) if n else None


def _weights_from_vllm_log(sc: Scorecard) -> bool:
    """Whether the card's weights are vLLM's logged figure, which vLLM logs on a GPU only (on CPU they are the
    checkpoint's bytes). The card, not :func:`quantverdict.review.gpus.on_gpu`: an MLflow source has no records."""
    return sc.memory.get("weights_source") == "vLLM log"


def measured_overhead_gib(c: Candidate) -> float | None:
    """The memory vLLM kept for neither weights nor KV cache where the job ran (activation peak, CUDA graphs,
    non-torch allocations), GiB: ``gpu_memory_utilization x GPU memory - weights - KV cache`` from the
    record (``environment.gpu[0].memory_total_mib``, ``bench.server.gpu_memory_utilization``, vLLM's log).
    E.g. qwen3.5-9b-shape bf16 on the H200: 0.9 x 140.401 - 16.71 - 107.84 = 1.81 GiB. None when a figure is
    missing or the job fixed its KV cache (``--kv-cache-memory-bytes``)."""
    rec, m = c.record, c.card.memory
    if rec is None or not m.get("server_weights_gib") or not m.get("server_kv_cache_gib") or _served_kv_bytes(rec):
        return None
    budget = _run_budget_gib(rec)
    if budget is None:
        return None
    left = budget - float(m["server_weights_gib"]) - float(m["server_kv_cache_gib"])
    return left if left >= 0 else None


def _target_memory(
    c: Candidate, target: TargetConfig, rc: ReviewConfig, borrowed: tuple[float, str] | None = None
) -> None:
    """Weights + KV cache at the target's budget -> KV tokens and max concurrency (see the module doc).

    The reserve is ``review.reserved_gib`` when set (> 0), else the overhead vLLM measured where the job ran
    (:func:`measured_overhead_gib`), else ``borrowed`` (the largest overhead measured on another candidate, GiB,
    and its name: a job that started no server), else 0."""
    m = c.card.memory
    if _weights_from_vllm_log(c.card):  # vLLM logs one GPU's share under tensor parallelism: x the GPUs used
        c.weights_gib = whole_weights_gib(m, c.card.gpus)
        c.weights_how = "vLLM log" + (f" x {c.card.gpus} GPUs" if c.card.gpus > 1 else "")
    elif m.get("checkpoint_gib"):  # a GPU serves the checkpoint's own dtype, whatever the CPU served in
        c.weights_gib, c.weights_how = m["checkpoint_gib"], "checkpoint bytes"
    bpt, kvb = m.get("kv_bytes_per_token"), m.get("kv_dtype_bytes") or 2
    if c.weights_gib is None or not bpt:
        c.target = {"fits": None, "why": "no weight size or no model dimensions"}
        return
    # a CPU that served float32 holds 4-byte KV elements; the target GPU holds the model's 16-bit ones
    target_bytes = rc.kv_cache_dtype_bytes or (kvb if _weights_from_vllm_log(c.card) else min(kvb, 2))
    s = target_bytes / kvb
    paging = m.get("hybrid_paging")
    paging = {**paging, "page_bytes": paging["page_bytes"] * s} if paging else None
    state = (m.get("state_bytes_per_sequence") or 0.0) * s
    measured = measured_overhead_gib(c)
    reserve, reserve_how = rc.reserved_gib, "review.reserved_gib"
    no_server = not m.get("server_weights_gib") and not m.get("server_kv_cache_gib")
    if rc.reserved_gib <= 0 and measured is not None:
        reserve, reserve_how = measured, "vLLM's overhead where the job ran"
    elif rc.reserved_gib <= 0 and borrowed is not None and no_server:
        reserve, reserve_how = borrowed[0], f"no server ran: vLLM's overhead measured for {borrowed[1]}"
    budget = target_kv_budget_bytes(target.memory_gib, target.memory_fraction, c.weights_gib * GIB, reserve * GIB)
    out: dict[str, Any] = {"kv_gib": budget / GIB, "kv_bytes_per_token": bpt * s}
    out["reserve_gib"], out["reserve_how"] = reserve, reserve_how
    max_len, req = _max_model_len(c.record), m.get("request_len_tokens")
    out["max_len"] = max_len
    if max_len:
        cap = kv_capacity(budget, bpt * s, max_len, paging, state)
        out["kv_tokens"], out["max_concurrency"] = cap["kv_tokens"], cap["max_concurrency"]
    if budget <= 0:
        out["fits"], out["why"] = (
            False,
            (
                f"weights {c.weights_gib:.2f} GiB + reserve {reserve:.2f} GiB leave no KV cache in "
                f"{target.memory_gib:g} GiB x {target.memory_fraction:g}"
            ),
        )
    elif req:
        cap = kv_capacity(budget, bpt * s, int(req), paging, state)
        out["req_len"], out["req_concurrency"] = int(req), cap["max_concurrency"]
        if rc.kv_cache_tokens:
            out["fits"] = cap["kv_tokens"] >= rc.kv_cache_tokens
            need = f"{rc.kv_cache_tokens:,} KV tokens"
        else:
            out["fits"] = cap["max_concurrency"] >= rc.concurrent_requests
            need = f"{rc.concurrent_requests} concurrent {int(req)}-token requests"
        out["why"] = (
            "" if out["fits"] else f"holds {cap['max_concurrency']:.1f} {int(req)}-token requests, needs {need}"
        )
    else:
        out["fits"], out["why"] = None, "no request length (bench.input_len + output_len)"
    if out.get("fits") and max_len and out.get("max_concurrency", 0) < rc.concurrent_requests:
        c.flags.append(
            f"fits the stated load, but its {out['kv_gib']:.2f} GiB of KV cache hold only "
            f"{out['max_concurrency']:.1f} max-length ({max_len:,}-token) requests"
        )
    c.target = out


def _run_budget_gib(rec: JobRecord) -> float | None:
    """``gpu_memory_utilization x GPU memory`` (GiB) of the GPU a job ran on, None when not recorded."""
    gpus = [g for g in rec.environment.gpu or [] if isinstance(g, dict) and g.get("memory_total_mib")]
    util = (rec.cfg("bench").get("server") or {}).get("gpu_memory_utilization")
    return float(util) * float(gpus[0]["memory_total_mib"]) / 1024 if gpus and util else None


def _served_kv_bytes(rec: JobRecord) -> int | None:
    server = rec.cfg("bench").get("server") or {}
    return parse_kv_cache_memory_bytes([*(server.get("extra_args") or []), *(rec.cfg("model").get("serve_args") or [])])


def _vllm_figures(c: Candidate, target: TargetConfig | None) -> None:
    """vLLM's own KV figures, and whether the job was served with the target's budget: its KV cache fixed
    (``--kv-cache-memory-bytes``) within 5% of the KV budget computed for the target, or its memory fraction
    set so that ``gpu_memory_utilization x GPU memory`` is the target's ``memory_gib x memory_fraction`` within
    2% (vLLM then profiles the reserve itself, as it would on the target)."""
    m, rec = c.card.memory, c.record
    if rec is None or not (m.get("server_kv_cache_gib") or m.get("server_kv_tokens")):
        return
    served = _served_kv_bytes(rec)
    run_budget = _run_budget_gib(rec)
    kv = c.target.get("kv_gib")
    how = "the budget where the job ran"
    at_target = False
    if served is not None:
        at_target = bool(kv and kv > 0 and abs(served / GIB - kv) / kv <= SAME_BUDGET)
        how = f"--kv-cache-memory-bytes {served:,} = {served / GIB:.2f} GiB"
    elif target is not None and run_budget is not None:
        want = target.memory_gib * target.memory_fraction
        at_target = abs(run_budget - want) / want <= 0.02
        if at_target:
            how = f"memory fraction x GPU memory = {run_budget:.2f} GiB"
    c.vllm = {
        "kv_gib": m.get("server_kv_cache_gib") or (served / GIB if served else None),
        "kv_tokens": m.get("server_kv_tokens"),
        "max_concurrency": m.get("server_max_concurrency"),
        "served_kv_bytes": served,
        "at_target": at_target,
        "how": ("the target's budget: " if at_target else "") + how,
    }
    if target is not None and at_target:
        _batch_limits(c, target)


def _batch_limits(c: Candidate, target: TargetConfig) -> None:
    """The job's ``max_num_seqs`` / ``max_num_batched_tokens`` as served (set, else vLLM's default on the GPU it
    ran on, :func:`~quantverdict.config.targets.vllm_batch_defaults`) beside what vLLM would pick on the target.
    Emulating a small card on a big one with the memory fraction keeps the big card's batch limits: the review
    says so (a flag: the speed at high load is not the target's), and names the overrides that match it."""
    rec = c.record
    gpus = [
        g for g in (rec.environment.gpu if rec else None) or [] if isinstance(g, dict) and g.get("memory_total_mib")
    ]
    if rec is None or not gpus:
        return
    server = rec.cfg("bench").get("server") or {}
    args = [*(server.get("extra_args") or []), *(rec.cfg("model").get("serve_args") or [])]
    ran = vllm_batch_defaults(str(gpus[0].get("name") or ""), float(gpus[0]["memory_total_mib"]) / 1024)
    seqs = server.get("max_num_seqs") or vllm_int_arg(args, "--max-num-seqs") or ran[0]
    tokens = vllm_int_arg(args, "--max-num-batched-tokens") or ran[1]
    want = vllm_batch_defaults(target.gpu, target.memory_gib)
    c.vllm["batch"] = {"max_num_seqs": seqs, "max_num_batched_tokens": tokens, "target": list(want)}
    if (seqs, tokens) != want:
        c.flags.append(
            f"served with max_num_seqs {seqs}, max_num_batched_tokens {tokens:,}; vLLM on the {target.gpu} "
            f"picks {want[0]}, {want[1]:,} by default: its speed at high load is not the "
            f"target's (bench.server.max_num_seqs={want[0]} and --max-num-batched-tokens {want[1]} added to "
            "bench.server.extra_args match it)"
        )


def _scores(c: Candidate, cards: list[Scorecard]) -> None:
    """Absolute task scores: the record's headline metric per task; without the record (an MLflow source), the
    scorecards' deltas (a scheme's own value; a baseline's from a sibling scheme's comparison)."""
    if c.card.accuracy_not_applicable:
        return
    if c.record is None:
        sources_ = [c.card] if not c.card.is_baseline else [x for x in cards if x.model == c.card.model]
        for sc in sources_:
            for d in sc.accuracy:
                if d.kind == "score" and d.name not in c.scores:
                    c.scores[d.name] = (d.metric, d.baseline if c.card.is_baseline else d.value, d.n)
        return
    headline = c.record.cfg("eval").get("headline") or {}
    for task, res in c.record.accuracy.tasks.items():
        metric, higher = headline_of(task, headline, res)
        if not higher and "perplexity" not in metric:
            continue  # the ranking's scores are higher-is-better; lower-is-better metrics other than perplexity aside
        v = res.metric(metric)
        if isinstance(v, (int, float)):
            c.scores[task] = (metric, float(v), res.n)


def _speed(c: Candidate) -> None:
    sp = c.card.speed
    c.ceiling_tok_s = sp.get("ceiling_tok_s")
    c.ceiling_lower_bound = ceiling_is_floor(sp)
    roof = sp.get("roofline") or {}
    if roof.get("decode_bytes"):
        c.step_bytes, c.step_bytes_how = float(roof["decode_bytes"]), ROOFLINE_BYTES
    elif c.weights_gib or c.card.memory.get("weights_gib"):
        w = c.weights_gib or c.card.memory["weights_gib"]
        c.step_bytes, c.step_bytes_how = decode_step_bytes(w * GIB), "weights GiB"
    mode = sp.get("mode") or "rate"
    pts = [p for p in sp.get("points") or [] if p.get("tpot_ms_p50")]
    unsat = [p for p in pts if not p.get("saturated") and not (mode == "rate" and math.isinf(p.get("load", 0)))]
    # saturated levels and the unlimited-rate burst queue requests: their in-flight count is not the batch
    xy: list[tuple[float, float]] = []
    for p in unsat:
        x = in_flight(p, mode)
        if x:
            xy.append((x, float(p["tpot_ms_p50"])))
    if len({x for x, _ in xy}) < 2:
        c.fit_note = f"{len(xy)} unsaturated load level(s) with a TPOT: a line needs 2"
        return
    c.fit = fit_decode_step([x for x, _ in xy], [y for _, y in xy])
    itl = [(x, float(p["itl_ms_p50"])) for p in unsat if p.get("itl_ms_p50") and (x := in_flight(p, mode))]
    if len({x for x, _ in itl}) >= 2:
        c.fit_itl = fit_decode_step([x for x, _ in itl], [y for _, y in itl])
    c.fit_note = "unsaturated loads" + (
        "; a negative per-sequence cost: TPOT does not grow with the batch here (not memory-bound, or noise)"
        if c.fit.per_seq_us < 0
        else ""
    )


def _check_status(review: Review, c: Candidate, name: str) -> str:
    check = review.checks.get(c.card.model, {}).get(c.card.scheme, {}).get(name)
    return check.outcome if check is not None else "unknown"


def _mean_score(c: Candidate, tasks: list[str]) -> float | None:
    """Mean of the candidate's scores (higher is better) on ``tasks``; None unless it has each of them."""
    if not tasks or any(t not in c.scores for t in tasks):
        return None
    return sum(c.scores[t][1] for t in tasks) / len(tasks)


def _model_size(cands: list[Candidate], model: str) -> float:
    """A model's 16-bit size (GiB): its baseline's checkpoint, else the largest checkpoint scaled to 16 bits."""
    mine = [c for c in cands if c.card.model == model]
    for c in mine:
        if c.card.is_baseline and c.card.memory.get("checkpoint_gib"):
            return float(c.card.memory["checkpoint_gib"])
    return max((c.card.memory.get("checkpoint_gib") or 0.0) * (4.0 if c.card.tier == 2 else 2.0) for c in mine)


def _paired_diff(a: Candidate, b: Candidate, task: str, rc: ReviewConfig) -> tuple[float, stats.Interval | None, int]:
    """Mean of a's score minus b's on the items both ran (paired by lm-eval's ``doc_hash`` when every row has
    one, else by ``doc_id``), with the review's interval; unpaired (point difference, no interval) without
    per-item samples."""
    metric = a.scores[task][0]
    sa = read_samples(a.record, task) if a.record else None
    sb = read_samples(b.record, task) if b.record else None
    if sa and sb:
        if all(r.get("doc_hash") for r in sa + sb):  # lm-eval's hash of the document: the same item in any order
            sa, sb = [{**r, "doc_id": r["doc_hash"]} for r in sa], [{**r, "doc_id": r["doc_hash"]} for r in sb]
        pairing = pair_samples(task, sa, sb, (metric,))  # refuses (no rows) when a doc_hash/prompt_hash differs
        ra, rb = pairing.a, pairing.b
        if len(ra) >= 2:
            x, y = [float(r[metric]) for r in ra], [float(r[metric]) for r in rb]
            iv = (
                stats.bootstrap_mean_diff(x, y, samples=rc.bootstrap_samples, seed=rc.seed, confidence=rc.confidence)
                if rc.interval == "bootstrap"
                else stats.paired_normal_interval(x, y, rc.confidence)
            )
            return sum(x) / len(x) - sum(y) / len(y), iv, len(x)
    return a.scores[task][1] - b.scores[task][1], None, 0


def target_price(review: Review, target: TargetConfig, ran_gpu: list[str]) -> tuple[float | None, str]:
    """The USD per GPU-hour of the cross-model $ column and where it comes from, or ``(None, why)``.

    The throughput is the one measured where the jobs ran, so a price applies only when every GPU the records
    ran on is the target's (:func:`quantverdict.review.gpus.gpu_kind_matches` of ``target.gpu``); else the
    reason is "not comparable: ran on <GPU>". Among prices, ``review.gpu_price_per_hour[kind]`` for the GPU
    they ran on (:func:`quantverdict.review.cost.gpu_price`) first, else the target's ``price_per_hour``;
    ``(None, "")`` when neither is set.

    Args:
        review: the review (its config's prices and the environment lines the records ran on).
        target: the deployment target.
        ran_gpu: the review's ``GPU: ...`` environment lines that match the target's GPU.
    """
    prices = dict(review.config.gpu_price_per_hour or {})
    if not prices and not target.price_per_hour:
        return None, ""
    gpus_ran = [line for line in review.environment if line.startswith(GPU_LINE)]
    if not ran_gpu or len(ran_gpu) != len(gpus_ran):
        where = [line.removeprefix(GPU_LINE).split(" (", 1)[0] for line in gpus_ran] or [
            line for line in review.environment if line.startswith("CPU")
        ]
        return None, f"not comparable: ran on {', '.join(where) or 'a device not recorded'}"
    found = gpu_price(review.environment, prices)
    if found is not None:
        return found[2], f"review.gpu_price_per_hour.{found[1]}"
    if target.price_per_hour:
        return float(target.price_per_hour), f"target {target.name} price_per_hour"
    return None, ""


def cross_model(review: Review) -> CrossModel | None:
    """The cross-model comparison of a review's cards; None with a single model and no ``review.target``.
    Computed once per review (the first screen, the section, the honesty list and review.json read it) and
    kept in ``review.derived``.

    Raises:
        quantverdict.config.schema.ConfigError: ``review.target`` names no shipped target (validated before).
    """
    if "cross_model" not in review.derived:
        review.derived["cross_model"] = _cross_model(review)
    cm: CrossModel | None = review.derived["cross_model"]
    return cm


def _cross_model(review: Review) -> CrossModel | None:
    rc = review.config
    models = list(dict.fromkeys(sc.model for sc in review.cards))
    if len(models) < 2 and not rc.target:
        return None
    target = load_target(rc.target, rc.target_memory_fraction) if rc.target else None
    records = _records_by_id(review)
    cands = [Candidate(sc, records.get(sc.job_id)) for sc in review.cards if sc.status == "ok"]
    ran = sorted({line for line in review.environment if line.startswith(("GPU", "CPU"))})
    note, price, price_how = "", None, ""
    if target is not None:
        ran_gpu = [line for line in ran if line.startswith("GPU") and gpu_kind_matches(target.gpu, line)]
        note = (
            f"Memory is computed for the target, **{target.gpu}** ({target.memory_gib:g} GiB x vLLM memory fraction "
            f"{target.memory_fraction:g} = {target.memory_gib * target.memory_fraction:.2f} GiB, minus the weights "
            "and a reserve for activations, CUDA graphs and non-torch memory: review.reserved_gib when set, else "
            "what vLLM kept for them where the job ran, or for a job that started no server the largest such figure of "
            "the other candidates)"
            + ("" if ran_gpu else f", not for where the jobs ran ({'; '.join(ran) or 'not recorded'})")
            + ". Speed and accuracy are those measured where the jobs ran."
        )
        price, price_how = target_price(review, target, ran_gpu)
        if price is not None:
            note += (
                f" Price: ${price:g} per GPU-hour ({price_how}; cost per million output tokens in the ratio table, "
                "at each candidate's measured ceiling, on the GPUs its job used)."
            )
        elif price_how:
            note += f" Cost per million output tokens: {price_how}."
    # a job that started no server (bench.enabled=false) has no measured overhead: it borrows the largest one
    # measured on another candidate on the same kind of GPU, rather than 0 (which would overstate its KV cache)
    borrowed = max(
        ((o, c.name) for c in cands if (o := measured_overhead_gib(c)) is not None),
        default=None,
    )
    for c in cands:
        if target is not None:
            _target_memory(c, target, rc, borrowed)
        else:
            c.weights_gib, c.weights_how = c.card.memory.get("weights_gib"), c.card.memory.get("weights_source") or ""
        _vllm_figures(c, target)
        _scores(c, review.cards)
        _speed(c)
        # as the per-model verdict: a constraint fails or could not be checked -> not eligible
        names = ("accuracy", "latency") if target is not None else ("memory", "accuracy", "latency")
        if target is not None and not c.target.get("fits"):
            state = "fails" if c.target.get("fits") is False else "not checked"
            c.why_not.append(f"memory on {target.name} {state}: {c.target.get('why')}")
        for name in names:
            if _check_status(review, c, name) not in NON_BLOCKING:
                check = review.checks.get(c.card.model, {}).get(c.card.scheme, {}).get(name)
                c.why_not.append(f"{name}: {(check.cite or check.text) if check else 'not checked'}")
        c.eligible = not c.why_not
    # speed across models is compared only at one request shape: say so where the candidates' sweeps differ
    shapes = {c.name: str(c.card.speed["workload"]["text"]) for c in cands if shape_of(c.card.speed)}
    if len(set(shapes.values())) > 1:
        for c in cands:
            if c.name in shapes:
                others = sorted({t for n, t in shapes.items() if t != shapes[c.name]})
                c.flags.append(
                    f"swept at {shapes[c.name]}, other candidates at {'; '.join(others)}: its speed figures and "
                    "ratios here compare different request shapes"
                )
    # one source of bytes per step for every candidate in the ratio table (those with a ceiling): the checkpoint
    # tensors a step reads (speed.roofline, a GPU sweep with c=1) when each of them has it, else the weights GiB
    if any(c.step_bytes_how != ROOFLINE_BYTES for c in cands if c.ceiling_tok_s):
        for c in cands:
            w = c.weights_gib or c.card.memory.get("weights_gib")
            c.step_bytes, c.step_bytes_how = (decode_step_bytes(w * GIB), "weights GiB") if w else (None, "")
    eligible = [c for c in cands if c.eligible]
    # score tasks (higher is better) that every eligible candidate measured: the ranking's accuracy
    common = (
        set.intersection(*(set(c.scores) for c in eligible)) if eligible and all(c.scores for c in eligible) else set()
    )
    score_tasks = sorted(t for t in common if "perplexity" not in eligible[0].scores[t][0])
    scored = bool(score_tasks) and all(_mean_score(c, score_tasks) is not None for c in eligible)

    base_score = {
        c.card.model: _mean_score(c, score_tasks) for c in cands if c.card.is_baseline and c.scores and scored
    }

    def score(c: Candidate) -> float:
        """Mean absolute score; a scheme none of whose own deltas is significant scores as its baseline (a
        difference inside the interval is noise), so that the less aggressive scheme of a model wins the tie."""
        own = [d for d in c.card.accuracy if d.kind == "score" and d.name in score_tasks]
        if not c.card.is_baseline and own and not any(d.significant for d in own) and base_score.get(c.card.model):
            return float(base_score[c.card.model] or 0.0)
        return _mean_score(c, score_tasks) or 0.0

    def key(c: Candidate) -> tuple[float, int, float, float]:
        speed = (c.ceiling_tok_s or 0.0, c.target.get("max_concurrency") or 0.0)
        return (score(c), -c.card.tier, *speed) if scored else (0.0, 0, *speed)

    ranking = (
        f"highest mean score on {', '.join(score_tasks)} (absolute; a scheme whose own deltas are all inside "
        "their interval scores as its baseline), then the less aggressive scheme, then the ceiling output tok/s"
        if scored
        else "accuracy not measured on every candidate: the ceiling output tok/s, then max concurrency (target)"
    )
    chosen = max(eligible, key=key) if eligible else None
    where = f"on {target.gpu}" if target else "under the review's constraints"
    if chosen is not None:
        bits = [f"weights {_f(chosen.weights_gib)} GiB"]
        if chosen.target.get("max_concurrency") is not None:
            bits.append(
                f"KV cache {_f(chosen.target['kv_gib'])} GiB = {chosen.target['kv_tokens']:,} tokens, "
                f"{chosen.target['max_concurrency']:.0f} concurrent {chosen.target['max_len']:,}-token requests"
            )
        if scored:
            bits.append(f"mean score {_f(_mean_score(chosen, score_tasks), '.4f')}")
        bits.append(
            f"ceiling {'>= ' if chosen.ceiling_lower_bound else ''}{_f(chosen.ceiling_tok_s, '.0f')} output tok/s"
        )
        sentence = f"Across models, {where}: deploy **{chosen.name}** ({'; '.join(bits)})."
        if not scored:
            sentence += " Decided on memory and speed alone: measure accuracy on the real models before deploying."
    else:
        sentence = f"Across models, {where}: **no candidate meets the constraints**."
    cm = CrossModel(target, note, cands, chosen, sentence, ranking, price=price, price_note=price_how)
    _compare(cm, rc)
    return cm


def _compare(cm: CrossModel, rc: ReviewConfig) -> None:
    """Bigger quantized vs smaller unquantized: which wins on memory, accuracy and speed."""
    cands = cm.candidates
    models = list(dict.fromkeys(c.card.model for c in cands))
    sizes = {m: _model_size(cands, m) for m in models}
    bases = [c for c in cands if c.card.is_baseline]
    cm.reference = min(bases, key=lambda c: sizes[c.card.model]) if bases else (cands[0] if cands else None)
    for small in bases:
        for big in cands:
            if sizes[big.card.model] <= sizes[small.card.model] or big.card.tier == 0:
                continue
            parts = []
            if cm.target is not None:
                a, b = big.target.get("max_concurrency"), small.target.get("max_concurrency")
                if a is not None and b is not None:
                    w = big if a > b else small if b > a else None
                    parts.append(
                        f"memory: {w.card.model if w else 'tie'} ({a:.0f} vs {b:.0f} concurrent max-length "
                        f"requests on {cm.target.name})"
                    )
            else:
                a, b = big.weights_gib, small.weights_gib
                if a is not None and b is not None:
                    parts.append(
                        f"memory: {big.card.model if a < b else small.card.model} (weights {a:.2f} vs {b:.2f} GiB)"
                    )
            # score tasks (higher is better); word perplexity stays in the absolute table
            tasks = sorted(t for t in set(big.scores) & set(small.scores) if "perplexity" not in big.scores[t][0])
            if tasks:
                diffs = []
                for t in tasks:
                    d, iv, n = _paired_diff(big, small, t, rc)
                    sig = iv is not None and iv.excludes_zero()
                    cm.paired.append(
                        PairedAcross(
                            bigger=big.name,
                            smaller=small.name,
                            task=t,
                            metric=big.scores[t][0],
                            difference=d,
                            low=None if iv is None else iv.low,
                            high=None if iv is None else iv.high,
                            n=n,
                            significant=sig,
                        )
                    )
                    diffs.append((d, sig))
                wins = {
                    "big": sum(1 for d, s in diffs if s and d > 0),
                    "small": sum(1 for d, s in diffs if s and d < 0),
                }
                acc = (
                    big.card.model
                    if wins["big"] > wins["small"]
                    else small.card.model
                    if wins["small"] > wins["big"]
                    else "neither (no significant difference)"
                )
                parts.append(
                    f"accuracy: {acc} ({wins['big']} of {len(tasks)} tasks significantly better for the bigger, "
                    f"{wins['small']} for the smaller)"
                )
            else:
                parts.append("accuracy: not compared (not measured on both)")
            a, b = big.ceiling_tok_s, small.ceiling_tok_s
            if a and b:
                parts.append(
                    f"speed: {big.card.model if a > b else small.card.model} (ceiling {a:.0f} vs {b:.0f} output tok/s)"
                )
            cm.comparisons.append(f"{big.name} vs {small.name}: " + "; ".join(parts))


def speed_vs_bytes(cm: CrossModel, c: Candidate) -> dict[str, float | None] | None:
    """The candidate's ceiling against the reference's and the ratio predicted from bytes per decode step
    (:func:`quantverdict.measure.decode_bytes.predicted_speed_ratio`), the fields of
    :class:`quantverdict.review.document.SpeedVsBytes`; None without a ceiling and bytes per step for both.
    ``by_weights_ratio`` predicts from every weight byte (embeddings included) where the bytes per step are the
    roofline's; the cost is at the candidate's ceiling on the GPUs its job used (None without a price)."""
    ref = cm.reference
    if ref is None or not ref.ceiling_tok_s or not ref.step_bytes or not c.ceiling_tok_s or not c.step_bytes:
        return None
    measured = c.ceiling_tok_s / ref.ceiling_tok_s
    predicted = predicted_speed_ratio(c.step_bytes, ref.step_bytes)
    by_weights = None
    if c.weights_gib and ref.weights_gib and c.step_bytes_how == ROOFLINE_BYTES:
        by_weights = predicted_speed_ratio(c.weights_gib, ref.weights_gib)
    return {
        "measured_ratio": measured,
        "predicted_ratio": predicted,
        "bytes_vs_reference": 1 / predicted,
        "measured_over_predicted": measured / predicted,
        "by_weights_ratio": by_weights,
        "weights_vs_reference": None if by_weights is None else 1 / by_weights,
        "measured_over_by_weights": None if by_weights is None else measured / by_weights,
        "usd_per_mtok_ceiling": None if cm.price is None else usd_per_mtok(cm.price, c.card.gpus, c.ceiling_tok_s),
    }


def sweep_loads(cm: CrossModel) -> list[str]:
    """The load labels any candidate measured, ordered by load (the columns of the rate-sweep table)."""
    loads: dict[str, float] = {}
    for c in cm.candidates:
        for p in c.card.speed.get("points") or []:
            loads[str(p.get("label"))] = float(p.get("load") or 0)
    return sorted(loads, key=lambda k: loads[k])
