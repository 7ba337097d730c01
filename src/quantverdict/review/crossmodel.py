"""Candidates across models on a target GPU (``review.target``): the best (model, scheme) that meets the constraints,
and each bigger model quantized against each smaller one unquantized."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from quantverdict.config.schema import ConfigError, ReviewConfig, TargetConfig
from quantverdict.config.targets import load_target, vllm_batch_defaults
from quantverdict.measure.cost import usd_per_mtok
from quantverdict.measure.decode_bytes import decode_step_bytes, kv_capacity, predicted_speed_ratio
from quantverdict.measure.decode_bytes import target_kv_budget_bytes as kv_budget
from quantverdict.measure.decode_fit import fit_decode_step, in_flight
from quantverdict.measure.memory import GIB
from quantverdict.results.baseline import headline_of
from quantverdict.results.record import GpuInfo, JobRecord
from quantverdict.review import document as doc
from quantverdict.review.accuracy import diff_interval, pair_samples, read_samples
from quantverdict.review.cost import gpu_names, gpu_price
from quantverdict.review.document import Scheme, finite
from quantverdict.review.gpus import gpu_kind_matches, whole_weights_gib
from quantverdict.review.speed import shape_of
from quantverdict.review.verdict import NON_BLOCKING
from quantverdict.review.words import say

_say = partial(say, template="crossmodel_text.j2")

ROOFLINE_BYTES = "checkpoint tensors a decode step reads"
KV_BYTES = "--kv-cache-memory-bytes"  # a fixed KV cache (bytes) in vLLM server arguments
SAME_BUDGET = 0.05  # a served --kv-cache-memory-bytes within 5% of the target's KV budget counts as the target's
# vLLM's human_readable_int (vllm/utils/argparse_utils.py): lowercase decimal, uppercase binary (integers only)
_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_Borrowed = tuple[float, str] | None  # a reserve measured on another candidate (GiB) and that candidate's name


@dataclass
class _Job:
    card: Scheme
    record: JobRecord
    out: doc.Candidate


def vllm_int_arg(args: list[Any], flag: str) -> int | None:
    """``flag N`` or ``flag=N`` in vLLM server arguments as vLLM's ``human_readable_int`` reads it (``2k`` = 2,000,
    ``2K`` = 2,048, ``25.6k`` = 25,600); None when absent or unreadable."""
    items = [str(a) for a in args or []]
    for i, a in enumerate(items):
        if a != flag and not a.startswith(flag + "="):
            continue
        raw = (a.split("=", 1)[1] if "=" in a else (items[i + 1] if i + 1 < len(items) else "")).strip()
        m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgtKMGT]?)", raw)
        if m and (m.group(1).isdigit() or m.group(2).islower()):
            return int(float(m.group(1)) * _SUFFIX[m.group(2)])
    return None


def _serve_args(rec: JobRecord) -> list[Any]:
    return [*(rec.cfg.bench.server.extra_args or []), *(rec.cfg.model.serve_args or [])]


def _gpu_gib(rec: JobRecord) -> tuple[str, float] | None:
    """The name and memory (GiB) of the first GPU the job ran on that reports its memory."""
    gpu = next((g for g in map(GpuInfo.of, rec.environment.gpu or []) if g.memory_total_mib), None)
    return None if gpu is None else (str(gpu.name or ""), float(gpu.memory_total_mib or 0) / 1024)


def _run_budget_gib(rec: JobRecord) -> float | None:
    """``gpu_memory_utilization x GPU memory`` (GiB) where the job ran."""
    gpu, util = _gpu_gib(rec), rec.cfg.bench.server.gpu_memory_utilization
    return float(util) * gpu[1] if gpu and util else None


def _overhead_gib(card: Scheme, rec: JobRecord) -> float | None:
    """vLLM's reserve where the job ran, GiB: ``gpu_memory_utilization x GPU memory - weights - KV cache``; None when
    a figure is missing, it is negative, or the KV cache was fixed (``--kv-cache-memory-bytes``)."""
    m = card.memory
    budget = None if vllm_int_arg(_serve_args(rec), KV_BYTES) else _run_budget_gib(rec)
    if budget is None or not m.server_weights_gib or not m.server_kv_cache_gib:
        return None
    left = budget - m.server_weights_gib - m.server_kv_cache_gib
    return left if left >= 0 else None


def _target_fit(
    card: Scheme, rec: JobRecord, target: TargetConfig, rc: ReviewConfig, borrowed: _Borrowed
) -> tuple[float | None, str, doc.TargetFit, list[str]]:
    """Weights GiB (vLLM's x GPUs, else the checkpoint's), how read, the target fit and its flags. Reserve:
    ``review.reserved_gib``, else :func:`_overhead_gib`, else ``borrowed`` for a job without a server."""
    m = card.memory
    vllm_log = m.weights_source == "vLLM log"
    weights, how = (m.checkpoint_gib, "checkpoint bytes") if m.checkpoint_gib else (None, "")
    if vllm_log:
        weights, how = whole_weights_gib(m, card.gpus), "vLLM log" + (f" x {card.gpus} GPUs" if card.gpus > 1 else "")
    bpt, kvb = m.kv_bytes_per_token, m.kv_dtype_bytes or 2
    if weights is None or not bpt:
        return weights, how, doc.TargetFit(fits=None, why="no weight size or no model dimensions"), []
    s = (rc.kv_cache_dtype_bytes or (kvb if vllm_log else min(kvb, 2))) / kvb
    paging = {**hp.model_dump(), "page_bytes": hp.page_bytes * s} if (hp := m.hybrid_paging) else None
    state = (m.state_bytes_per_sequence or 0.0) * s
    reserve, reserve_how = rc.reserved_gib, "review.reserved_gib"
    if rc.reserved_gib <= 0 and (measured := _overhead_gib(card, rec)) is not None:
        reserve, reserve_how = measured, "vLLM's overhead where the job ran"
    elif rc.reserved_gib <= 0 and borrowed is not None and not m.server_weights_gib and not m.server_kv_cache_gib:
        reserve, reserve_how = borrowed[0], f"no server ran: vLLM's overhead measured for {borrowed[1]}"
    budget = kv_budget(target.memory_gib, target.memory_fraction, weights * GIB, reserve * GIB)
    max_len = int(n) if (n := rec.cfg.bench.server.max_model_len or rec.cfg.model.max_model_len) else None
    fit = doc.TargetFit(kv_gib=budget / GIB, reserve_gib=reserve, reserve_how=reserve_how, max_len=max_len)
    if max_len:
        cap = kv_capacity(budget, bpt * s, max_len, paging, state)
        fit.kv_tokens, fit.max_concurrency = int(cap["kv_tokens"]), cap["max_concurrency"]
    if budget <= 0:
        fit.fits = False
    elif req := m.request_len_tokens:
        cap = kv_capacity(budget, bpt * s, req, paging, state)
        fit.req_len, fit.req_concurrency = req, cap["max_concurrency"]
        enough = cap["kv_tokens"] >= rc.kv_cache_tokens if rc.kv_cache_tokens else None
        fit.fits = cap["max_concurrency"] >= rc.concurrent_requests if enough is None else enough
    fit.why = _say("fit_why", fit=fit, weights=weights, target=target, rc=rc)
    short = fit.fits and max_len and (fit.max_concurrency or 0) < rc.concurrent_requests
    return weights, how, fit, [_say("max_length_flag", fit=fit)] if short else []


def _vllm_figures(
    card: Scheme, rec: JobRecord, target: TargetConfig | None, kv_target: float | None
) -> tuple[doc.VllmFigures, list[str]]:
    """vLLM's KV figures; at the target's budget: a fixed KV cache within 5% of ``kv_target`` GiB, or
    ``gpu_memory_utilization x GPU memory`` within 2% of the target's ``memory_gib x memory_fraction``."""
    m = card.memory
    if not (m.server_kv_cache_gib or m.server_kv_tokens):
        return doc.VllmFigures(), []
    served, run_budget = vllm_int_arg(_serve_args(rec), KV_BYTES), _run_budget_gib(rec)
    at_target, served_gib = False, None if served is None else served / GIB
    if served_gib is not None:
        at_target = bool(kv_target and kv_target > 0 and abs(served_gib - kv_target) / kv_target <= SAME_BUDGET)
    elif target is not None and run_budget is not None:
        want = target.memory_gib * target.memory_fraction
        at_target = abs(run_budget - want) / want <= 0.02
    flags = _batch_flags(rec, target) if target is not None and at_target else []
    how = _say("vllm_how", served=served, served_gib=served_gib, run_budget=run_budget, at_target=at_target)
    kv_gib = m.server_kv_cache_gib or served_gib or None
    return doc.VllmFigures(
        kv_gib=kv_gib, kv_tokens=m.server_kv_tokens, max_concurrency=m.server_max_concurrency, how=how
    ), flags


def _batch_flags(rec: JobRecord, target: TargetConfig) -> list[str]:
    """A flag when the served ``max_num_seqs``/``max_num_batched_tokens`` are not vLLM's defaults on the target."""
    if (gpu := _gpu_gib(rec)) is None:
        return []
    args, ran = _serve_args(rec), vllm_batch_defaults(*gpu)
    seqs = int(rec.cfg.bench.server.max_num_seqs or vllm_int_arg(args, "--max-num-seqs") or ran[0])
    tokens = vllm_int_arg(args, "--max-num-batched-tokens") or ran[1]
    want = vllm_batch_defaults(target.gpu, target.memory_gib)
    return [] if (seqs, tokens) == want else [_say("batch_flag", seqs=seqs, tokens=tokens, want=want, gpu=target.gpu)]


def _scores(card: Scheme, rec: JobRecord) -> dict[str, doc.TaskScore]:
    """Absolute headline scores by task, each with the scheme's own delta against its baseline."""
    if card.accuracy.not_applicable:
        return {}
    own = {d.name: d for d in card.accuracy.deltas}  # by task name; the last delta of a task stands for it
    out, headline = {}, rec.headline()
    for task, res in sorted(rec.accuracy.tasks.items()):
        metric, higher = headline_of(task, headline, res)
        v = res.metric(metric)
        # the ranking's scores are higher-is-better; lower-is-better metrics other than perplexity aside
        if not (higher or "perplexity" in metric) or not isinstance(v, (int, float)):
            continue
        s = out[task] = doc.TaskScore(metric=metric, value=float(v), n=res.n)
        od = own[task] if task in own else None
        if od is not None and (delta := od.delta if od.kind == "score" else od.delta_pct) is not None:
            s.own_delta_kind, s.own_delta = od.kind, delta
            if od.interval is not None:
                s.own_delta_low, s.own_delta_high = od.interval.low, od.interval.high
    return out


def _decode_fits(speed: doc.Speed) -> tuple[doc.DecodeFit | None, doc.DecodeFit | None, int]:
    """TPOT p50 and ITL p50 fits against sequences in flight over the unsaturated levels, and the levels usable."""
    mode = speed.mode or "rate"
    # saturated levels and the unlimited-rate burst queue requests: their in-flight count is not the batch
    keys = ("achieved_rps", "e2e_ms_mean", "e2e_ms_p50", "tpot_ms_p50", "itl_ms_p50")
    unsat: list[dict[str, Any]] = [
        {"concurrency": p.load, **{k: getattr(p, k) for k in keys}}
        for p in speed.points
        if p.tpot_ms_p50 and not p.saturated and not (mode == "rate" and math.isinf(p.load))
    ]

    def fit(metric: str) -> doc.DecodeFit | None:
        xy = [(x, float(p[metric])) for p in unsat if p[metric] and (x := in_flight(p, mode))]
        if len({x for x, _ in xy}) < 2:
            return None
        f = fit_decode_step([x for x, _ in xy], [y for _, y in xy])
        (lo, hi), r2 = f.concurrency_range, finite(f.r2)
        return doc.DecodeFit(fixed_us=f.fixed_us, per_seq_us=f.per_seq_us, r2=r2, points=f.n, seqs_min=lo, seqs_max=hi)

    tpot = fit("tpot_ms_p50")
    return tpot, fit("itl_ms_p50") if tpot else None, sum(1 for p in unsat if in_flight(p, mode))


def _candidate(
    card: Scheme, rec: JobRecord, target: TargetConfig | None, borrowed: _Borrowed, rc: ReviewConfig
) -> _Job:
    flags: list[str] = []
    weights, how, fit = card.memory.weights_gib, card.memory.weights_source or "", doc.TargetFit()
    if target is not None:
        weights, how, fit, flags = _target_fit(card, rec, target, rc, borrowed)
    vllm, batch_flags = _vllm_figures(card, rec, target, fit.kv_gib)
    sp = card.speed
    decode_bytes = sp.roofline.decode_bytes if sp.roofline else None  # else the weights (cross_model)
    why_not = []
    if target is not None and not fit.fits:
        why_not.append(f"memory on {target.name} {'fails' if fit.fits is False else 'not checked'}: {fit.why}")
    for name in ("accuracy", "latency") if target is not None else ("memory", "accuracy", "latency"):
        if (check := getattr(card.checks, name)).outcome not in NON_BLOCKING:
            why_not.append(f"{name}: {check.cite or check.text}")
    tpot, itl, fit_levels = _decode_fits(sp)
    out = doc.Candidate(
        name=f"{card.model} {card.name}",
        model=card.model,
        scheme=card.scheme,
        weights_gib=weights,
        weights_how=how,
        target=fit,
        vllm=vllm,
        ceiling_tok_s=finite(sp.ceiling.output_tok_s if sp.ceiling else None),
        ceiling_lower_bound=bool(sp.ceiling and sp.ceiling.lower_bound),
        step_bytes=float(decode_bytes) if decode_bytes else None,
        step_bytes_how=ROOFLINE_BYTES if decode_bytes else "",
        decode_fit=tpot,
        decode_fit_itl=itl,
        fit_levels=fit_levels,
        scores=_scores(card, rec),
        why_not=why_not,
        flags=flags + batch_flags,
    )
    return _Job(card, rec, out)


def _model_size(jobs: list[_Job], model: str) -> float:
    """16-bit size GiB: the baseline's checkpoint, else the largest checkpoint scaled to 16 bits."""
    mine = [j.card for j in jobs if j.card.model == model]
    base = [float(sc.memory.checkpoint_gib) for sc in mine if sc.is_baseline and sc.memory.checkpoint_gib]
    if base:
        return base[0]
    return max((sc.memory.checkpoint_gib or 0.0) * (4.0 if sc.weight_tier == 2 else 2.0) for sc in mine)


def target_price(
    rc: ReviewConfig, environment: list[str], target: TargetConfig, ran_gpu: list[str]
) -> tuple[float | None, str]:
    """USD per GPU-hour and its source, or ``(None, why)``: only when every GPU ran on is the target's (``ran_gpu``:
    the matching ``GPU: ...`` lines); ``review.gpu_price_per_hour``, else the target's ``price_per_hour``."""
    prices = dict(rc.gpu_price_per_hour or {})
    if not prices and not target.price_per_hour:
        return None, ""
    where = gpu_names(environment)
    if not ran_gpu or len(ran_gpu) != len(where):
        where = where or [line for line in environment if line.startswith("CPU")]
        return None, f"not comparable: ran on {', '.join(where) or 'a device not recorded'}"
    if (found := gpu_price(environment, prices)) is not None:
        return found[2], f"review.gpu_price_per_hour.{found[1]}"
    if target.price_per_hour:
        return float(target.price_per_hour), f"target {target.name} price_per_hour"
    return None, ""


def cross_model(
    cards: list[Scheme], records: Sequence[JobRecord], rc: ReviewConfig, environment: list[str]
) -> doc.CrossModel | doc.CrossModelError | None:
    """The review's cross-model comparison (``records``: each card's record, in the cards' order; ``environment``:
    the review's); None with one model and no target."""
    if len({sc.model for sc in cards}) < 2 and not rc.target:
        return None
    try:
        target = load_target(rc.target, rc.target_memory_fraction) if rc.target else None
    except ConfigError as exc:
        return doc.CrossModelError(error=f"not computed: {exc}")
    ran = sorted({line for line in environment if line.startswith(("GPU", "CPU"))})
    ran_gpu = [line for line in ran if target and line.startswith("GPU") and gpu_kind_matches(target.gpu, line)]
    price, price_how = target_price(rc, environment, target, ran_gpu) if target is not None else (None, "")
    finished = [(sc, rec) for sc, rec in zip(cards, records, strict=True) if sc.status == "ok"]
    # a job that started no server (bench.enabled=false) has no measured overhead: it borrows the largest one
    # measured on another candidate, rather than 0 (which would overstate its KV cache)
    named = [(_overhead_gib(sc, r), f"{sc.model} {sc.name}") for sc, r in finished]
    borrowed = max(((o, n) for o, n in named if o is not None), default=None)
    jobs = [_candidate(sc, rec, target, borrowed, rc) for sc, rec in finished]
    cands = [j.out for j in jobs]
    # speed across models is compared only at one request shape: say so where the candidates' sweeps differ
    shapes = {j.out.name: wl.text for j in jobs if j.card.speed.points and shape_of(wl := j.card.speed.workload) and wl}
    for c in [c for c in cands if len(set(shapes.values())) > 1 and c.name in shapes]:
        others = sorted({t for t in shapes.values() if t != shapes[c.name]})
        c.flags.append(_say("shape_flag", shape=shapes[c.name], others=others))
    # one source of bytes per step for every candidate in the ratio table (those with a ceiling): the checkpoint
    # tensors a step reads (speed.roofline, a GPU sweep with c=1) when each of them has it, else the weights GiB
    roofline = all(c.step_bytes_how == ROOFLINE_BYTES for c in cands if c.ceiling_tok_s)
    for j in (j for j in jobs if not roofline or j.out.step_bytes_how != ROOFLINE_BYTES):
        w = j.out.weights_gib or j.card.memory.weights_gib
        j.out.step_bytes, j.out.step_bytes_how = (decode_step_bytes(w * GIB), "weights GiB") if w else (None, "")
    eligible = [j for j in jobs if not j.out.why_not]
    # score tasks (higher is better) that every eligible candidate measured: the ranking's accuracy
    common = set.intersection(*(set(j.out.scores) for j in eligible)) if eligible else set()
    score_tasks = sorted(t for t in common if "perplexity" not in eligible[0].out.scores[t].metric)
    for c in (c for c in cands if score_tasks and all(t in c.scores for t in score_tasks)):
        c.mean_score = sum(c.scores[t].value for t in score_tasks) / len(score_tasks)
    base_score = {j.card.model: j.out.mean_score for j in jobs if j.card.is_baseline}

    def key(j: _Job) -> tuple[float, int, float, float]:
        """Mean score (a scheme with no significant own delta scores as its baseline: the tie goes to the milder),
        the milder scheme, the ceiling and max concurrency; without score tasks, the ceiling and max concurrency."""
        own = [d for d in j.card.accuracy.deltas if d.kind == "score" and d.name in score_tasks]
        mine = j.out.mean_score or 0.0
        if not j.card.is_baseline and own and not any(d.significant for d in own):
            mine = base_score.get(j.card.model) or mine
        milder = -j.card.weight_tier if score_tasks else 0
        return mine, milder, j.out.ceiling_tok_s or 0.0, j.out.target.max_concurrency or 0.0

    chosen = max(eligible, key=key).out if eligible else None
    comparisons, paired, reference = _compare(jobs, target, rc)
    for c, j in zip(cands, jobs):
        c.speed_vs_bytes = None if reference is None else speed_vs_bytes(reference, c, j.card.gpus, price)
    loads = {p.label: p.load for j in jobs for p in j.card.speed.points}
    t = {k: getattr(target, k) for k in ("name", "gpu", "memory_gib", "memory_fraction")} if target else None
    return doc.CrossModel(
        target=None if t is None else doc.Target(budget_gib=t["memory_gib"] * t["memory_fraction"], **t),
        ran_on_target=bool(ran_gpu),
        ran=ran,
        chosen=chosen.name if chosen else None,
        score_tasks=score_tasks,
        comparisons=comparisons,
        paired=paired,
        reference=reference.name if reference else None,
        price_usd_per_gpu_hour=price,
        price_note=price_how,
        sweep_loads=sorted(loads, key=lambda k: loads[k]),
        candidates=cands,
    )


def _compare(
    jobs: list[_Job], target: TargetConfig | None, rc: ReviewConfig
) -> tuple[list[doc.Comparison], list[doc.PairedAcross], doc.Candidate | None]:
    """Bigger quantized vs smaller unquantized on the three numbers, the paired rows, and the ratio reference."""
    sizes = {m: _model_size(jobs, m) for m in dict.fromkeys(j.card.model for j in jobs)}
    bases = [j for j in jobs if j.card.is_baseline]
    ref = min(bases, key=lambda j: sizes[j.card.model]) if bases else (jobs[0] if jobs else None)
    comparisons: list[doc.Comparison] = []
    paired: list[doc.PairedAcross] = []
    for small, big in [(s, b) for s in bases for b in jobs]:
        if sizes[big.card.model] <= sizes[small.card.model] or big.card.weight_tier == 0:
            continue
        b, s = big.out, small.out
        mb, ms = (b.target.max_concurrency, s.target.max_concurrency) if target else (b.weights_gib, s.weights_gib)
        mem = None
        if mb is not None and ms is not None:  # the most requests on the target, else the smallest weights
            mem = (b.model if mb > ms else s.model if ms > mb else "tie") if target else b.model if mb < ms else s.model
        rows = _paired_rows(big, small, rc)
        paired += rows
        wins_big = sum(r.significant and r.difference > 0 for r in rows)
        wins_small = sum(r.significant and r.difference < 0 for r in rows)
        x, y = b.ceiling_tok_s or 0.0, s.ceiling_tok_s or 0.0
        comparisons.append(
            doc.Comparison(
                bigger=b.name,
                smaller=s.name,
                memory_winner=mem,
                memory_bigger=mb,
                memory_smaller=ms,
                tasks=len(rows),
                accuracy_winner=b.model if wins_big > wins_small else s.model if wins_small > wins_big else None,
                wins_bigger=wins_big,
                wins_smaller=wins_small,
                speed_winner=(b.model if x > y else s.model) if x and y else None,
                speed_bigger=b.ceiling_tok_s,
                speed_smaller=s.ceiling_tok_s,
            )
        )
    return comparisons, paired, None if ref is None else ref.out


def _paired_rows(big: _Job, small: _Job, rc: ReviewConfig) -> list[doc.PairedAcross]:
    """Per score task (higher is better) both measured, bigger minus smaller on the items both ran (by ``doc_hash``,
    else ``doc_id``) with its interval, else the scores' difference unpaired; word perplexity stays absolute."""
    b, s, rows = big.out, small.out, []
    for t in sorted(t for t in set(b.scores) & set(s.scores) if "perplexity" not in b.scores[t].metric):
        m = b.scores[t].metric
        d, iv, n = b.scores[t].value - s.scores[t].value, None, 0
        if (sa := read_samples(big.record, t)) and (sb := read_samples(small.record, t)):
            if all(r.get("doc_hash") for r in sa + sb):  # lm-eval's hash of the document: the same item in any order
                sa, sb = [{**r, "doc_id": r["doc_hash"]} for r in sa], [{**r, "doc_id": r["doc_hash"]} for r in sb]
            pairing = pair_samples(t, sa, sb, (m,))  # refuses (no rows) when a doc_hash/prompt_hash differs
            if len(pairing.a) >= 2:
                x, y = [float(r[m]) for r in pairing.a], [float(r[m]) for r in pairing.b]
                d, iv, n = sum(x) / len(x) - sum(y) / len(y), diff_interval(x, y, rc), len(x)
        lo, hi, sig = (None, None, False) if iv is None else (iv.low, iv.high, iv.excludes_zero())
        rows.append(
            doc.PairedAcross(
                bigger=b.name, smaller=s.name, task=t, metric=m, difference=d, low=lo, high=hi, n=n, significant=sig
            )
        )
    return rows


def speed_vs_bytes(ref: doc.Candidate, c: doc.Candidate, gpus: int, price: float | None) -> doc.SpeedVsBytes | None:
    """``c``'s ceiling over the reference's beside the bytes-per-step prediction, and its cost at ``price`` USD per
    GPU-hour on ``gpus``; None without a ceiling and bytes per step for both."""
    if not ref.ceiling_tok_s or not ref.step_bytes or not c.ceiling_tok_s or not c.step_bytes:
        return None
    measured = c.ceiling_tok_s / ref.ceiling_tok_s
    predicted = predicted_speed_ratio(c.step_bytes, ref.step_bytes)
    by_weights = None
    if c.weights_gib and ref.weights_gib and c.step_bytes_how == ROOFLINE_BYTES:
        by_weights = predicted_speed_ratio(c.weights_gib, ref.weights_gib)
    return doc.SpeedVsBytes(
        measured_ratio=measured,
        predicted_ratio=predicted,
        measured_over_predicted=measured / predicted,
        by_weights_ratio=by_weights,
        measured_over_by_weights=None if by_weights is None else measured / by_weights,
        usd_per_mtok_ceiling=None if price is None else usd_per_mtok(price, gpus, c.ceiling_tok_s),
    )
