"""Quantize stage (child process in the quantize environment): llm-compressor ``oneshot`` -> checkpoint.

Spec (JSON)::

    {"model_path": str,            # materialized 16-bit model folder (config.json, *.safetensors, tokenizer)
     "out_dir": str,               # final checkpoint folder; written only when complete
     "recipe": dict,               # resolved llm-compressor recipe (quantverdict.config.schemes.resolve_recipe)
     "method": str,                # none | rtn | rtn_calibrated | gptq | awq | smoothquant_gptq
     "calibration": {"text_path": str | null, "hf_dataset": str, "hf_subset": str, "hf_split": str,
                     "num_samples": int, "seq_len": int},
     "seed": int,
     "compute_dtype": "auto" | "float32" | "bfloat16" | ...,   # optional; see _compute_dtype
     "sanity": {"max_ppl_ratio": float, "max_mean_kld": float, "finite_only": bool} | null,
     "save_format": str | null}    # compressed-tensors format to save in (quantverdict.config.schemes.Format)
                                   # bounds of the check against the source model (quantverdict.measure.sanity)

Result (JSON, besides ``status``/``wall_s`` from :mod:`._child`)::

    {"path": str, "versions": {torch, transformers, llmcompressor, compressed-tensors},
     "quantized_modules": int,          # modules with int4/int8/fp8 weights in the saved checkpoint
     "scheme_modules_in_memory": int,   # Linear modules llm-compressor attached a scheme to
     "calibration": {...actually used...}, "logits_finite": true,
     "prompt_nll": {"source": float, "quantized": float}, "compute_dtype": str,
     "sanity": {...quantverdict.children.checkpoint_sanity.compare...},
     "saved_dtype": str, "quantize_s": float, "save_s": float,
     "verify_s": float, "memory": {...quantverdict.measure.memory.checkpoint_memory...},
     "kept_16bit": {"patterns": [...], "kept_16bit": [module, ...], "quantized": []}}  # keep16.check_kept

Imports only the standard library, the quantize environment's libraries, the stdlib-only
:mod:`quantverdict.measure.memory`, :mod:`quantverdict.measure.keep16` and :mod:`quantverdict.measure.sanity`, and
:mod:`quantverdict.children.checkpoint_sanity` (same environment).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import random
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from quantverdict.children._child import child_main, progress
from quantverdict.children.checkpoint_sanity import compare, load_model, nll_of, window_logprobs
from quantverdict.measure.keep16 import check_kept, ignore_patterns
from quantverdict.measure.memory import checkpoint_memory
from quantverdict.measure.sanity import SanityNumbers, judge

CALIBRATED_METHODS = ("gptq", "awq", "smoothquant_gptq", "rtn_calibrated")
DATA_FREE_METHODS = ("none", "rtn")
VERSION_DISTS = ("torch", "transformers", "llmcompressor", "compressed-tensors")


def _kv_scales_saved(folder: Path) -> bool:
    """Whether a saved checkpoint's ``config.json`` carries a ``quantization_config.kv_cache_scheme`` (a checkpoint of
    16-bit weights with calibrated K/V scales holds no quantized module, and is still what was asked for)."""
    config = json.loads((folder / "config.json").read_text())
    return bool((config.get("quantization_config") or {}).get("kv_cache_scheme"))


def versions() -> dict[str, str]:
    """Installed versions of :data:`VERSION_DISTS` in this environment."""
    out = {}
    for dist in VERSION_DISTS:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def _patch_awq_cpu() -> None:
    """Skip pinning memory in llm-compressor's intermediates cache when there is no accelerator.

    llm-compressor 0.14.0.1's ``AWQModifier._apply_smoothing`` pins every cached batch
    (``IntermediatesCache.pin_memory``) to speed up host-to-device copies; ``Tensor.pin_memory()``
    raises ``RuntimeError: Cannot access accelerator device when none is available`` on a
    CPU-only machine (see docs CPU-STACK.md). Pinning is only an optimization for transfers that
    do not happen on CPU, so the method becomes a no-op there. On a machine with an accelerator
    nothing is changed.
    """
    import torch
    from llmcompressor.pipelines.cache import IntermediatesCache

    if torch.accelerator.is_available() or getattr(IntermediatesCache.pin_memory, "_qv_cpu_patch", False):
        return
    original = IntermediatesCache.pin_memory

    def pin_memory(self: Any, batch_index: int, input_names: list[str] | None = None) -> None:
        if torch.accelerator.is_available():
            original(self, batch_index, input_names)

    setattr(pin_memory, "_qv_cpu_patch", True)  # a function attribute: marks the patch as applied
    IntermediatesCache.pin_memory = pin_memory


def _calibration_text(cal: dict[str, Any]) -> tuple[str, str]:
    """(text, source description): the local file if ``text_path`` is set, else the hub dataset."""
    if cal.get("text_path"):
        path = Path(cal["text_path"])
        if not path.is_file():
            raise FileNotFoundError(f"calibration text_path {path} does not exist")
        return path.read_text(encoding="utf-8"), str(path)
    import datasets

    ds = datasets.load_dataset(cal["hf_dataset"], cal.get("hf_subset"), split=cal["hf_split"])
    text = "\n".join(t for t in ds["text"] if t)
    return text, f"{cal['hf_dataset']}/{cal.get('hf_subset')}:{cal['hf_split']}"


def build_calibration(tokenizer: Any, cal: dict[str, Any], seed: int) -> tuple[Any, dict[str, Any]]:
    """Calibration samples: ``num_samples`` windows of ``seq_len`` tokens from the calibration text.

    The whole text is tokenized once (no special tokens), cut into non-overlapping windows of
    ``seq_len`` tokens, and ``num_samples`` windows are drawn without replacement with
    ``random.Random(seed)`` (kept in text order). Fewer windows than asked: all are used and
    the actual count is reported.

    Returns:
        (``datasets.Dataset`` with ``input_ids`` and ``attention_mask``, each ``num_samples x
        seq_len``; a dict describing what was used: source, num_samples, seq_len, tokens,
        text_tokens, seed).
    """
    import datasets

    text, source = _calibration_text(cal)
    seq_len, wanted = int(cal["seq_len"]), int(cal["num_samples"])
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    n_windows = len(ids) // seq_len
    if n_windows == 0:
        raise ValueError(f"calibration text {source} has {len(ids)} tokens, fewer than seq_len={seq_len}")
    picks = sorted(random.Random(seed).sample(range(n_windows), min(wanted, n_windows)))
    rows = [ids[i * seq_len : (i + 1) * seq_len] for i in picks]
    ds = datasets.Dataset.from_dict({"input_ids": rows, "attention_mask": [[1] * seq_len for _ in rows]})
    used = {
        "source": source,
        "num_samples": len(rows),
        "seq_len": seq_len,
        "tokens": len(rows) * seq_len,
        "text_tokens": len(ids),
        "seed": seed,
    }
    return ds, used


_SMOOTHED = re.compile(r"Smoothing with (\S+)")
_SKIPPED = re.compile(r"Skipping (\S+) for mapping")


@contextlib.contextmanager
def _smoothing_log() -> Iterator[dict[str, list[str]]]:
    """Collect which norms/layers AWQ and SmoothQuant smoothed or skipped, from llm-compressor's log.

    Yields ``{"smoothed": [...], "skipped": [...]}``, filled while the block runs: SmoothQuant logs
    ``Smoothing with <layer>``; AWQ and SmoothQuant log ``Skipping <layer> for mapping ...`` when a
    mapping's balance layers are not quantized (e.g. the input norm of a hybrid model's
    linear-attention layer, whose projections stay 16-bit).
    """
    from loguru import logger

    found: dict[str, list[str]] = {"smoothed": [], "skipped": []}

    def sink(message: Any) -> None:
        text = message.record["message"]
        for key, pattern in (("smoothed", _SMOOTHED), ("skipped", _SKIPPED)):
            m = pattern.search(text)
            if m and m.group(1) not in found[key]:
                found[key].append(m.group(1))

    sink_id = logger.add(sink, level="INFO")
    try:
        yield found
    finally:
        logger.remove(sink_id)


def _source_dtype(model_path: Path) -> str:
    """The model's stored floating dtype from config.json (``dtype``, else ``torch_dtype``; default bfloat16)."""
    cfg = json.loads((model_path / "config.json").read_text())
    text_cfg = cfg.get("text_config") or {}
    return str(cfg.get("dtype") or cfg.get("torch_dtype") or text_cfg.get("dtype") or "bfloat16")


def _compute_dtype(requested: str, method: str, source_dtype: str) -> str:
    """dtype the model is loaded and calibrated in.

    ``auto``: float32 for calibrated methods on a machine without an accelerator, else the source
    dtype. Reason: without AVX512-BF16/AMX, PyTorch's CPU bf16 matmul is ~6x slower than fp32
    (measured on the 2-core AVX2 machines: a 128x576 @ 576x1536 linear took 54 ms in bf16 vs 8 ms in
    fp32), and calibration is mostly forward passes. The model is cast back to the source dtype
    before saving, so the checkpoint has the same dtypes as one calibrated in the source dtype.
    The cast re-rounds the fp32 scales to bf16: measured on SmolLM2, int4 weights are unchanged;
    for int8 (W8A8 GPTQ) 0.1-1% of weights move by one level. Data-free methods (rtn) compute in the
    source dtype. Pass ``compute_dtype`` in the spec to force a dtype.
    """
    import torch

    if requested != "auto":
        return requested
    if method in CALIBRATED_METHODS and not torch.accelerator.is_available():
        return "float32"
    return source_dtype


def _cast_keeping_global_scales(model: Any, dtype: Any) -> None:
    """Cast the model's floating-point parameters and buffers to ``dtype``, except NVFP4's per-tensor global
    scales (``*_global_scale``), which compressed-tensors keeps in float32: rounded to bf16 (8 significant bits)
    they would shift every FP8 group scale of the tensor."""
    for module in model.modules():
        for store in (module._parameters, module._buffers):
            for name, tensor in store.items():
                if tensor is None or not tensor.is_floating_point() or name.endswith("global_scale"):
                    continue
                tensor.data = tensor.data.to(dtype)


def _count_scheme_modules(model: Any) -> int:
    """Linear modules that llm-compressor attached a ``quantization_scheme`` to."""
    import torch

    return sum(1 for m in model.modules() if isinstance(m, torch.nn.Linear) and getattr(m, "quantization_scheme", None))


def has_kv_cache_scheme(recipe: dict[str, Any]) -> bool:
    """Whether a modifier of ``recipe`` (stage -> group -> modifier -> args) sets llm-compressor's ``kv_cache_scheme``
    (calibrated KV-cache scales, conf/kv/fp8_calibrated.yaml), which always needs calibration data."""
    return any(
        isinstance(args, dict) and args.get("kv_cache_scheme")
        for stage in recipe.values()
        for group in (stage or {}).values()
        for args in (group or {}).values()
    )


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Quantize ``spec["model_path"]`` with ``spec["recipe"]`` into ``spec["out_dir"]`` (see module doc).

    Raises:
        ValueError: unknown method, calibration method without data, or no module was quantized.
        RuntimeError: a module that a keep-16-bit pattern of the recipe matches was quantized (named), the
            reloaded checkpoint produced non-finite logits, or it failed its sanity check against the source
            model (``spec["sanity"]``: then it is set aside in ``<out_dir>.damaged-<unix time>``, named). Either
            way no checkpoint is left at ``out_dir``.
    """
    method = spec["method"]
    model_path, out_dir = Path(spec["model_path"]), Path(spec["out_dir"])
    cal_spec = dict(spec.get("calibration") or {})
    seed = int(spec.get("seed", 0))
    allowed = CALIBRATED_METHODS + DATA_FREE_METHODS
    if method not in allowed:
        raise ValueError(f"method={method!r} is not allowed; allowed: {', '.join(allowed)}")
    if method == "none":
        progress(f"method=none: no quantization; the checkpoint is the source model {model_path}")
        return {
            "path": str(model_path),
            "versions": versions(),
            "quantized_modules": 0,
            "calibration": {"num_samples": 0, "seq_len": 0, "tokens": 0},
            "logits_finite": None,
            "prompt_nll": None,
            "quantize_s": 0.0,
            "memory": checkpoint_memory(model_path),
        }
    if not spec.get("recipe"):
        raise ValueError(f"method={method!r} needs a recipe; the spec's recipe is empty")

    kv_scales = has_kv_cache_scheme(spec["recipe"])  # calibrated K/V scales: calibration data for any method
    calibrated = method in CALIBRATED_METHODS or kv_scales
    if cal_spec.get("text_path") or not calibrated:  # nothing to fetch: stay offline
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    else:  # calibration text from the hub (data.offline_root=null)
        os.environ.pop("HF_HUB_OFFLINE", None)
        os.environ.pop("HF_DATASETS_OFFLINE", None)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # OMP_WAIT_POLICY: passive, set by quantverdict.children._child before torch loads (GPTQ's column loop runs
    # thousands of tiny torch ops, 15-40x slower with spinning threads on shared cores)
    import torch
    from llmcompressor import oneshot
    from llmcompressor.recipe import Recipe
    from transformers import AutoTokenizer

    random.seed(seed)
    torch.manual_seed(seed)
    _patch_awq_cpu()

    source_dtype = _source_dtype(model_path)
    compute_dtype = _compute_dtype(spec.get("compute_dtype", "auto"), method, source_dtype)
    progress(f"loading {model_path} ({source_dtype}; calibration compute in {compute_dtype})")
    # on a GPU the whole model goes there (the embedded model and 8B-class models fit an H200)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = load_model(model_path, device, dtype=getattr(torch, compute_dtype))
    model.eval()
    source_windows = window_logprobs(model, tokenizer)  # the sanity check's reference, before oneshot
    nll_source = nll_of(source_windows)

    dataset, cal_used = None, {"num_samples": 0, "seq_len": 0, "tokens": 0}
    if calibrated:
        dataset, cal_used = build_calibration(tokenizer, cal_spec, seed)
        progress(f"calibration: {cal_used['num_samples']} x {cal_used['seq_len']} tokens from {cal_used['source']}")

    recipe = Recipe.from_dict(spec["recipe"])
    progress(f"oneshot {method}: {', '.join(type(m).__name__ for m in recipe.modifiers)}")
    t0 = time.perf_counter()
    kwargs: dict[str, Any] = {}
    if dataset is not None:
        kwargs = {
            "dataset": dataset,
            "num_calibration_samples": cal_used["num_samples"],
            "max_seq_length": cal_used["seq_len"],
            "shuffle_calibration_samples": False,
        }
    with _smoothing_log() as smoothing:
        model = oneshot(model=model, tokenizer=tokenizer, recipe=recipe, **kwargs)
    quantize_s = time.perf_counter() - t0
    in_memory = _count_scheme_modules(model)
    if compute_dtype != source_dtype:  # store the checkpoint in the source dtype (scales included)
        _cast_keeping_global_scales(model, getattr(torch, source_dtype))
    progress(f"oneshot done in {quantize_s:.1f} s; {in_memory} Linear modules carry a quantization scheme")

    # write next to out_dir, rename when verified: a killed run never leaves a half checkpoint there
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        t1 = time.perf_counter()
        # the format vLLM loads, where compressed-tensors would infer another (W4AFP8: pack-quantized)
        fmt = {"quantization_format": spec["save_format"]} if spec.get("save_format") else {}
        model.save_pretrained(tmp, save_compressed=True, **fmt)
        tokenizer.save_pretrained(tmp)
        save_s = time.perf_counter() - t1
        del model

        t2 = time.perf_counter()
        memory = checkpoint_memory(tmp)
        if memory["quantized_modules"] == 0 and not (kv_scales and _kv_scales_saved(tmp)):
            raise ValueError(
                f"no module was quantized: the checkpoint holds no packed/int8/fp8 weights "
                f"(recipe targets matched nothing?); {in_memory} modules carried a scheme in memory"
            )
        kept = check_kept(tmp, ignore_patterns(spec["recipe"]))
        if kept["quantized"]:
            raise RuntimeError(
                f"modules meant to stay 16-bit were quantized: {', '.join(kept['quantized'])} "
                f"(keep-16-bit patterns {kept['patterns']}; a plain name means the module wherever it sits)"
            )
        progress(f"kept 16-bit as meant: {', '.join(kept['kept_16bit']) or 'no stored module matched'}")
        progress(f"reloading the checkpoint ({memory['quantized_modules']} quantized modules) to check logits")
        reloaded = load_model(tmp, device, dtype="auto")
        reloaded.eval()
        sanity = compare(source_windows, window_logprobs(reloaded, tokenizer))
        del reloaded
        verify_s = time.perf_counter() - t2
        finite = sanity["finite"]
        if not finite:
            raise RuntimeError("the reloaded checkpoint gives non-finite logits on the check prompts")
        nll_quant = float(sanity["nll_checkpoint"])
        progress(f"check prompts: NLL {nll_source:.3f} (source) -> {nll_quant:.3f} nats/token (quantized)")
        bounds = spec.get("sanity")
        reason = judge(SanityNumbers.of(sanity), **bounds) if bounds else None
        if reason:  # kept aside for inspection, never where a later job would reuse it
            aside = out_dir.with_name(f"{out_dir.name}.damaged-{int(time.time())}")
            os.replace(tmp, aside)
            raise RuntimeError(
                f"the quantized checkpoint failed its sanity check against the source model: {reason}; "
                f"set aside in {aside}"
            )
        provenance = {
            "method": method,
            "recipe": spec["recipe"],
            "calibration": cal_used,
            "compute_dtype": compute_dtype,
            "versions": versions(),
            "source": str(model_path),
            "smoothing": smoothing,
        }
        (tmp / "quantverdict_quantize.json").write_text(json.dumps(provenance, indent=2))
        if out_dir.exists():  # another run finished the same key first: keep one copy
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    return {
        "path": str(out_dir),
        "versions": versions(),
        "quantized_modules": memory["quantized_modules"],
        "scheme_modules_in_memory": in_memory,
        "calibration": cal_used,
        "logits_finite": finite,
        "prompt_nll": {"source": round(nll_source, 4), "quantized": round(nll_quant, 4)},
        "sanity": sanity,
        "compute_dtype": compute_dtype,
        "smoothing": smoothing,
        "saved_dtype": source_dtype,
        "quantize_s": round(quantize_s, 3),
        "save_s": round(save_s, 3),
        "verify_s": round(verify_s, 3),
        "memory": memory,
        "kept_16bit": kept,
    }


if __name__ == "__main__":
    child_main(run)
