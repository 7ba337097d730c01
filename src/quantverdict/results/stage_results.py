"""What each child stage returns, typed: validated where its JSON crosses back into the orchestrator.

A child stage (``quantverdict.children.<stage>``, run in its own environment by
:func:`quantverdict.processes.runner.run_stage`) writes ``{"status": "ok", **result, "wall_s": ...}``. The
orchestrator reads that file through the model of its stage: a key the model does not name, a missing key or a
value of the wrong type fails the stage with the key's name (:class:`pydantic.ValidationError`), before any of it
reaches the record. The children themselves import only the standard library and their stage's packages; these
models live on the orchestrator's side.

Nested blocks that go into the record as written (lm-eval's task results, the checkpoint's byte counts, the
model's dimensions) are typed as JSON objects here; the record's own model types them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

JsonObject = dict[str, Any]


class StageResult(BaseModel):
    """The keys every child's result carries (``quantverdict.children._child.child_main``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: Literal["ok"]
    wall_s: float

    def payload(self) -> JsonObject:
        """The stage's result without ``status`` and ``wall_s`` (what the record keeps of it), JSON-ready; an
        optional key the child did not return stays absent."""
        return self.model_dump(mode="json", exclude={"status", "wall_s"}, exclude_unset=True)


class HbmResult(StageResult):
    """``children/hbm.py``: the best device-to-device copy rate of a ``buffer_bytes`` buffer over ``iters``
    copies (bytes/s and GB/s, counting read + write), on ``device`` (the GPU's name)."""

    copy_bytes_per_s: float
    copy_gbps: float
    buffer_bytes: int
    iters: int
    device: str


class TaskCheckResult(StageResult):
    """``children/task_check.py``: what lm-eval's task index says of each ``eval.tasks`` name: ``tasks`` (name ->
    kind, output type, metrics, higher_is_better, source), ``unknown`` (name -> closest names), ``tags`` (name ->
    its tasks) and the ``lm_eval`` version."""

    tasks: dict[str, JsonObject]
    unknown: dict[str, list[str]]
    tags: dict[str, list[str]]
    lm_eval: str | None


class EvaluateResult(StageResult):
    """``children/evaluate.py``: lm-eval's results per task, the token perplexity, the KL divergence to the
    baseline (or None), the settings and checks, where each task's documents came from (``data``), the per-item
    sample files, the stage environment's package versions, and the load and evaluation times (s)."""

    tasks: dict[str, JsonObject]
    token_perplexity: JsonObject | None
    kld: JsonObject | None
    settings: JsonObject
    checks: JsonObject
    data: JsonObject
    samples: dict[str, str]
    versions: dict[str, str | None]
    load_s: float
    eval_s: float


class MaterializeResult(StageResult):
    """``children/materialize.py``: the transformers folder of the source model (``path``), its architecture,
    ``model_type``, dimensions (``dims``), parameter count and stored ``dtype``, and its ``source`` kind."""

    path: str
    architecture: str
    model_type: str
    dims: JsonObject
    num_parameters: int
    dtype: str
    source: str
    # model.source=hf: the hub id, the revision asked for and the commit it resolved to
    hf_id: str | None = None
    revision: str | None = None
    commit: str | None = None


class QuantizeResult(StageResult):
    """``children/quantize.py``: the checkpoint (``path``), the quantize environment's ``versions``, the modules
    quantized, the calibration used, the prompt's NLL before/after (nats), the sanity check made in the child, and
    the checkpoint's bytes (``memory``: :func:`quantverdict.measure.memory.checkpoint_memory`). ``method=none``
    returns only the first eight keys."""

    path: str
    versions: dict[str, str | None]
    quantized_modules: int
    calibration: JsonObject
    logits_finite: bool | None
    prompt_nll: dict[str, float] | None
    quantize_s: float
    memory: JsonObject
    scheme_modules_in_memory: int | None = None
    sanity: JsonObject | None = None
    compute_dtype: str | None = None
    smoothing: JsonObject | None = None
    saved_dtype: str | None = None
    save_s: float | None = None
    verify_s: float | None = None
    kept_16bit: JsonObject | None = None


class SanityResult(StageResult):
    """``children/checkpoint_sanity.py``: the checkpoint and its source model on fixed prompts: whether the
    logits were finite, both summed NLLs (nats), the token-perplexity ratio, the mean KL divergence (nats) over
    ``n_tokens`` tokens (None where not finite), and the load and scoring times (s)."""

    finite: bool
    nll_source: float | None
    nll_checkpoint: float | None
    ppl_ratio: float | None
    mean_kld: float | None
    n_tokens: int
    load_s: float
    score_s: float


class CpuProbeResult(StageResult):
    """``children/cpu_probe.py``: the CPU's model name and flags (``/proc/cpuinfo``), what the environment's
    torch reports of it, and (serve environment) what vLLM's CPU extension offers (None in the quantize one)."""

    model_name: str
    flags: list[str]
    torch: JsonObject
    vllm: JsonObject | None


class WikitextPromptsResult(StageResult):
    """``children/wikitext_prompts.py``: the prompts file of the built-in text workload written from the hub's
    WikiText-2 test split (``prompts``: its lines; ``source``: where the text came from)."""

    prompts: int
    source: str


class _ChildFile(BaseModel):
    """A file a child writes beside its result for the orchestrator: the keys read here typed, the others kept as
    written (the child owns them)."""

    model_config = ConfigDict(extra="allow", frozen=True)


class SweepClientTimes(_ChildFile):
    """``bench/sweep_client.result.json`` (``children/sweep_client.py``): the client process's import time, how long
    it waited for the server's gate and the warm-up waves before the sweep (s; None where it did not say)."""

    import_s: float | None = None
    gate_wait_s: float | None = None
    calibration_s: float | None = None


class SweepAttempt(_ChildFile):
    """One run of a sweep point (a short window runs again, longer): its measured window ``duration_s`` and the
    Unix time it ended (``end_unix_s``, the wall clock the GPU sampler stamps its samples with)."""

    duration_s: float | None = None
    end_unix_s: float | None = None


class PointSidecar(_ChildFile):
    """``<point>.qv.json`` beside a sweep point's result (``children/sweep_client.py``): its attempts, last one
    measured, and what every request was sent with (``sampling``); the counters and seeds are read by
    :func:`quantverdict.measure.bench_result.add_client_side`."""

    attempts: list[SweepAttempt] | None = None
    sampling: JsonObject | None = None

    def window_unix_s(self) -> tuple[float, float] | None:
        """The last attempt's measured window ``(start, end)`` in Unix s; None without a positive one."""
        last = self.attempts[-1] if self.attempts else SweepAttempt()
        if last.end_unix_s is None or last.duration_s is None or last.duration_s <= 0:
            return None
        return last.end_unix_s - last.duration_s, last.end_unix_s


class GpuSamplerHeader(_ChildFile):
    """The first line of a GPU sampler's file (``children/gpu_sampler.py``): ``source`` (``nvml``,
    ``nvidia-smi``, or None with the ``error`` that stopped it), ``interval_ms`` and the sampled ``devices``."""

    source: str | None = None
    interval_ms: int | None = None
    devices: list[str] | None = None
    error: str | None = None
