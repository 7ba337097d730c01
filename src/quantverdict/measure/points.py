"""The shapes measurement computes over: a sweep point with its latency percentiles, GPU and host windows, and the
per-load summary of its repeats, as the record keeps them (``speed.points[i]``, ``speed.summary[i]``).

:mod:`quantverdict.results.record` types its ``speed`` section with these models; the functions of
:mod:`quantverdict.measure` (:mod:`~quantverdict.measure.validity`, :mod:`~quantverdict.measure.sweep`,
:mod:`~quantverdict.measure.capacity`) take and return them. A point read from a record's JSON, or built by hand in a
test, is typed by :func:`as_point`. Pydantic and the standard library only: runs in every stage environment.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, model_validator

JsonObject = dict[str, Any]

INF = "inf"  # how an infinite offered rate is written everywhere (vLLM's own result JSON does the same)


def is_inf_rate(rate: Any) -> bool:
    """True for an infinite offered rate (``"inf"``, ``float("inf")``, or None as older records wrote it)."""
    return rate is None or rate == INF or (isinstance(rate, float) and math.isinf(rate))


class Section(BaseModel):
    """A record section: the keys it may hold, each typed; any other key is refused.

    :meth:`to_dict` gives back the keys the section was read with (``exclude_unset``), so a record read and
    written again is the one read; :meth:`has` says whether a key was present, :meth:`is_empty` whether any was.
    A section given as null reads as empty.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_empty(cls, data: Any) -> Any:
        return {} if data is None else data

    def to_dict(self) -> JsonObject:
        """The section as the record's JSON holds it: the keys read (every field for a section built, not read)."""
        return self.model_dump(mode="python", exclude_unset=True, by_alias=True)

    def is_empty(self) -> bool:
        """True for a section the record lacked, held as null, or held as ``{}``."""
        return not self.model_fields_set

    def has(self, key: str) -> bool:
        """Whether the record held ``key`` in this section (a field at its default was absent)."""
        return key in self.model_fields_set


class Block(BaseModel):
    """A JSON object a record keeps as written (its section types it as a JSON object: the measure function or the
    tool that made it owns its keys), read through the keys a reader needs; the others pass unread."""

    model_config = ConfigDict(extra="allow")

    @classmethod
    def of(cls, data: Self | Mapping[str, Any] | None) -> Self:
        """The block of ``data`` (itself when already one; every named key None when ``data`` is None or lacks it)."""
        return data if isinstance(data, cls) else cls.model_validate(data or {})


class ModelDims(Block):
    """``model.dims``: the model's dimensions from its ``config.json`` (:mod:`quantverdict.children.materialize`),
    read through the keys a reader needs; ``num_kv_layers`` (the layers with a KV cache) and the ``linear_*`` keys
    (the linear-attention layers' heads, head sizes and conv kernel) only for a hybrid model."""

    hidden_size: int | None = None
    intermediate_size: int | None = None
    num_hidden_layers: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    num_kv_layers: int | None = None
    tie_word_embeddings: bool | None = None
    linear_num_key_heads: int | None = None
    linear_num_value_heads: int | None = None
    linear_key_head_dim: int | None = None
    linear_value_head_dim: int | None = None
    linear_conv_kernel_dim: int | None = None
    layer_types: list[Any] | None = None  # per layer: full_attention | linear_attention | ...


class SamplingParams(Section):
    """``speed.points[i].sampling``: what every request of the point was sent with (``vllm bench serve``'s flags):
    ``temperature``, ``top_p``, ``top_k`` (None: not sent, the server's default), ``seed`` (prompts and arrivals),
    ``ignore_eos``, ``max_tokens`` (:func:`quantverdict.children.sweep_client.sampling_of`)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    ignore_eos: bool | None = None
    max_tokens: int | None = None


class LengthDist(Section):
    """``speed.points[i].input_len_dist`` / ``output_len_dist``: the prompt or output token counts of the point's
    requests as sent and generated (vLLM's ``input_lens`` / ``output_lens``,
    :func:`quantverdict.measure.workload.length_distribution`)."""

    min: float | None = None
    p1: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    max: float | None = None
    mean: float | None = None


class GpuWindow(Section):
    """``speed.points[i].gpu``: what the GPU did in the point's measured window (NVML samples,
    :func:`quantverdict.measure.gpu_samples.window_summary`): energy (J) and its source, energy per output token (J),
    output tokens per joule, power (W), SM and memory clocks (MHz), temperature (C), utilization (%), the share of
    samples with no kernel running and the longest idle run (s), clocks-event reasons, and the throttled and
    drifting flags."""

    window_unix_s: list[float] | None = None
    samples: int | None = None
    interval_ms: float | None = None
    energy_j: float | None = None
    energy_source: str | None = None  # energy_counter | power_integral
    energy_per_output_token_j: float | None = None
    output_tok_per_j: float | None = None
    power_w_mean: float | None = None
    power_w_max: float | None = None
    sm_clock_mhz_mean: float | None = None
    sm_clock_mhz_min: float | None = None
    sm_clock_busy_mhz_median: float | None = None
    mem_clock_mhz_mean: float | None = None
    temperature_c_max: float | None = None
    util_pct_mean: float | None = None
    idle_fraction: float | None = None
    idle_longest_s: float | None = None
    throttle_reasons: list[str] | None = None
    limited_fraction: float | None = None
    throttled: bool | None = None
    sm_clock_drift_rel: float | None = None
    drifting: bool | None = None
    not_measured: str | None = None


class HostLoad(Section):
    """``speed.points[i].host.gpu_idle`` / ``.gpu_busy``: the host's load over the window's host samples in which the
    GPU was idle (no kernel ran), resp. busy (:func:`quantverdict.measure.host_samples.window_summary`): medians of
    the client's and the server's CPU (percent of one core; the server's also by role), of the host's (percent of all
    cores) and of the requests running and waiting."""

    samples: int | None = None
    client_cpu_pct_median: float | None = None
    server_cpu_pct_median: float | None = None
    server_cpu_pct_median_by_role: dict[str, float] | None = None
    host_cpu_pct_median: float | None = None
    running_requests_median: float | None = None
    waiting_requests_median: float | None = None


class HostWindow(Section):
    """``speed.points[i].host``: what the host did in the point's measured window (psutil and the server's
    ``/metrics`` sampled by :mod:`quantverdict.serving.host_sampling`,
    :func:`quantverdict.measure.host_samples.window_summary`): CPU of the sweep client and of the server's processes
    (mean, median, p95; percent of one core; the server's by role: ``api_server``, ``engine_core``, ``worker``,
    ``other``), the host's
    CPU (percent of all ``cores``), vLLM's running and waiting requests and KV cache usage (%), and the same load in
    the GPU's idle samples against its busy ones."""

    window_unix_s: list[float] | None = None
    samples: int | None = None
    interval_ms: float | None = None
    cores: int | None = None
    client_cpu_pct_mean: float | None = None
    client_cpu_pct_median: float | None = None
    client_cpu_pct_p95: float | None = None
    server_cpu_pct_mean: float | None = None
    server_cpu_pct_median: float | None = None
    server_cpu_pct_p95: float | None = None
    server_cpu_pct_median_by_role: dict[str, float] | None = None
    server_cpu_pct_p95_by_role: dict[str, float] | None = None
    host_cpu_pct_median: float | None = None
    host_cpu_pct_p95: float | None = None
    running_requests_median: float | None = None
    running_requests_min: float | None = None
    running_requests_max: float | None = None
    waiting_requests_median: float | None = None
    waiting_requests_min: float | None = None
    waiting_requests_max: float | None = None
    kv_cache_usage_pct_median: float | None = None
    kv_cache_usage_pct_max: float | None = None
    gpu_idle: HostLoad | None = None
    gpu_busy: HostLoad | None = None
    not_measured: str | None = None


class SweepPoint(Section):
    """``speed.points[i]``: one benchmark run at one load (times in ms, rates in req/s and tok/s); the metric
    families ``ttft``, ``itl``, ``tpot``, ``e2e`` each with ``_ms_mean``/``_p50``/``_p90``/``_p99``, recomputed
    per request, and vLLM's own as ``vllm_<family>_ms_<stat>``."""

    point: str | None = None
    offered_rate_rps: float | str | None = None  # "inf" for a closed-loop (concurrency) run or a burst
    concurrency: int | None = None
    repeat: int | None = None
    seed: int | None = None
    num_prompts: int | None = None
    warmup_requests: int | None = None
    warmup_seed: int | None = None
    attempts: int | None = None
    completed: int | None = None
    failed: int | None = None
    duration_s: float | None = None
    min_duration_s: float | None = None
    window_met: bool | None = None
    achieved_rps: float | None = None
    sent_rps: float | None = None
    throughput_rps: float | None = None
    throughput_tok_s: float | None = None
    throughput_basis: str | None = None
    output_tok_s: float | None = None
    total_tok_s: float | None = None
    input_tokens_total: int | None = None
    output_tokens_total: int | None = None
    output_tokens_requested: int | None = None
    output_valid: bool | None = None
    short_requests: int | None = None
    requests_in_result: int | None = None
    peak_concurrent_requests: int | None = None
    ttft_ms_mean: float | None = None
    ttft_ms_p50: float | None = None
    ttft_ms_p90: float | None = None
    ttft_ms_p99: float | None = None
    itl_ms_mean: float | None = None
    itl_ms_p50: float | None = None
    itl_ms_p90: float | None = None
    itl_ms_p99: float | None = None
    tpot_ms_mean: float | None = None
    tpot_ms_p50: float | None = None
    tpot_ms_p90: float | None = None
    tpot_ms_p99: float | None = None
    e2e_ms_mean: float | None = None
    e2e_ms_p50: float | None = None
    e2e_ms_p90: float | None = None
    e2e_ms_p99: float | None = None
    e2e_source: str | None = None
    metrics_source: str | None = None
    itl_per_token: bool | None = None
    itl_sum_max_err_ms: float | None = None
    vllm_ttft_ms_mean: float | None = None
    vllm_ttft_ms_p50: float | None = None
    vllm_ttft_ms_p90: float | None = None
    vllm_ttft_ms_p99: float | None = None
    vllm_itl_ms_mean: float | None = None
    vllm_itl_ms_p50: float | None = None
    vllm_itl_ms_p90: float | None = None
    vllm_itl_ms_p99: float | None = None
    vllm_tpot_ms_mean: float | None = None
    vllm_tpot_ms_p50: float | None = None
    vllm_tpot_ms_p90: float | None = None
    vllm_tpot_ms_p99: float | None = None
    vllm_e2e_ms_mean: float | None = None
    vllm_e2e_ms_p50: float | None = None
    vllm_e2e_ms_p90: float | None = None
    vllm_e2e_ms_p99: float | None = None
    vllm_max_rel_diff: float | None = None
    steady_window_s: float | None = None
    steady_rps: float | None = None
    steady_arrival_rps: float | None = None
    steady_arrivals: int | None = None
    steady_completions: int | None = None
    steady_output_tok_s: float | None = None
    steady_reason: str | None = None
    # decided once when the point was read (quantverdict.measure.validity.saturation): completion pace over arrival
    # pace < 0.9; basis "arrival_pace", "estimated_pace", "too_few_requests", "burst" or "closed_loop". A point
    # with another basis was recorded before that rule: read it through validity.point_saturation
    saturated: bool | None = None
    saturation_ratio: float | None = None
    saturation_basis: str | None = None
    valid: bool | None = None
    invalid_reasons: list[str] | None = None
    error_samples: list[str] | None = None  # up to three distinct errors of the point's failed requests
    # the server's /metrics counters around the point, and the point's own repeated prompts
    prefix_cache_hit_rate: float | None = None
    prefix_cache_excess_hit_rate: float | None = None  # hits beyond the point's own repeated prompts (judged)
    prefix_cache_hits: int | None = None
    prefix_cache_queries: int | None = None
    prompt_repeat_rate: float | None = None
    prompt_repeat_tokens: int | None = None
    server_prompt_tokens: int | None = None
    server_generation_tokens: int | None = None
    server_preemptions: int | None = None
    prompt_tokens_rel_diff: float | None = None
    generation_tokens_rel_diff: float | None = None
    # the lengths actually sent and generated; with bench.dataset.kind=shared_prefix the prefix-cache hit rate the
    # workload is built to have (quantverdict.measure.workload.expected_prefix_hit_rate) and the one measured: a
    # property of the traffic, not reuse across points (the judged excess leaves the intended shared tokens out)
    input_len_dist: LengthDist | None = None
    output_len_dist: LengthDist | None = None
    workload_prefix_hit_rate: float | None = None
    workload_prefix_hit_rate_expected: float | None = None
    client_wall_s: float | None = None
    client_overhead_s: float | None = None
    # {"start_s", "end_s"} from the first request sent; end None for a failed request
    request_times: dict[str, list[float | None]] | None = None
    result_file: str | None = None
    # the server start the point came from (1: the job's own; absent in records written before starts were
    # counted: read as 1, quantverdict.measure.starts.start_index) and that start's place in the time order of the
    # grid's starts (speed.start_plan.sequence, 1-based)
    server_start: int | None = None
    start_order: int | None = None
    sampling: SamplingParams | None = None
    gpu: GpuWindow | None = None
    host: HostWindow | None = None

    def number(self, key: str) -> float | None:
        """The point's ``key`` (a field, e.g. ``output_tok_s``) where it holds a number, as a float; None where the
        point lacks it, holds None or a bool, or names no such field."""
        value = getattr(self, key, None) if key in type(self).model_fields else None
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def load(self, mode: str) -> float:
        """The point's load level: its concurrency (``mode="concurrency"``, 0 when unset) or offered req/s (inf for a
        burst or an unset rate), the key its repeats are grouped by."""
        if mode == "concurrency":
            return float(self.concurrency or 0)
        r = self.offered_rate_rps
        return math.inf if r is None or is_inf_rate(r) else float(r)


class Spread(Section):
    """One metric of a load level over its valid repeats (:func:`quantverdict.measure.sweep.spread`): the median (of an
    even count, the mean of the middle two), the least and the greatest value, and ``n`` the repeats."""

    median: float
    min: float
    max: float
    n: int


class LoadLevel(Section):
    """``speed.summary[i]``: the repeats of one load aggregated (``metrics``: key -> {median, min, max, n})."""

    offered_rate_rps: float | str | None = None
    concurrency: int | None = None
    repeats: int | None = None
    valid_repeats: int | None = None
    invalid_points: list[str] | None = None
    saturated_repeats: int | None = None
    saturated: bool | None = None
    throughput_basis: str | None = None
    metrics: dict[str, Spread | None] | None = None


class CheckpointMemory(Section):
    """``memory.checkpoint``: the checkpoint's bytes on disk (safetensors headers), by dtype and role
    (:func:`quantverdict.measure.memory.checkpoint_memory`)."""

    total_weight_bytes: int | None = None
    weights_gib: float | None = None
    bytes_by_dtype: dict[str, int] | None = None
    bytes_by_role: dict[str, int] | None = None
    num_tensors: int | None = None
    files: list[Any] | None = None
    quantized_modules: int | None = None
    quantized_weight_bytes: int | None = None
    quantized_weight_elements: int | None = None
    quantized_weight_rows: int | None = None
    quantized_metadata_bytes: int | None = None
    g_idx_elements: int | None = None
    effective_bits_per_weight: float | None = None
    predicted_weight_bytes: float | None = None
    not_measured: str | None = None


class ServerMemory(Section):
    """``memory.server``: what vLLM's server log said (GiB, tokens, kernels; :mod:`quantverdict.measure.vllm_log`)."""

    vllm_version: str | None = None
    device: str | None = None
    quantization: str | None = None
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    weights_gib: float | None = None
    checkpoint_gib: float | None = None
    kv_cache_gib: float | None = None
    kv_cache_source: str | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_request_tokens: int | None = None
    kernels: list[Any] | None = None
    activation_quantized: bool | None = None
    compute: str | None = None  # native | emulated (the kernel check)
    compute_reason: str | None = None
    fallback: str | bool | None = None
    fallback_lines: list[str] | None = None
    unquantized_gemm_fallback: bool | None = None
    weights_load_s: float | None = None
    engine_init_s: float | None = None
    compile_s: float | None = None
    compile_cache_hit: bool | None = None
    graph_capture_s: float | None = None
    warmup_after_capture_s: float | None = None
    evidence: JsonObject | None = None  # the log line behind each figure


class LinearKernel(BaseModel):
    """One entry of ``memory.server.kernels`` (:func:`quantverdict.measure.vllm_log.parse`): the linear kernel vLLM
    chose and the quantization method it serves."""

    model_config = ConfigDict(extra="ignore")

    kernel: str | None = None
    method: str | None = None


def as_server(server: ServerMemory | Mapping[str, Any] | None) -> ServerMemory:
    """``server`` as a typed server-log parse: a :class:`ServerMemory` as it is, a parse as its JSON holds it
    (:func:`quantverdict.measure.vllm_log.parse`) validated, None as an empty one.

    Raises:
        pydantic.ValidationError: a key the server log's parse does not name, or a value of the wrong type.
    """
    return server if isinstance(server, ServerMemory) else ServerMemory.model_validate(server or {})


def as_point(p: SweepPoint | Mapping[str, Any]) -> SweepPoint:
    """``p`` as a typed point: a :class:`SweepPoint` as it is, a point as the record's JSON holds it validated.

    Keys a point does not name are left out (a reader's own annotations of a point, such as the review's
    ``_goodput``): the record refuses them where it is written and read (:mod:`quantverdict.results.record`).

    Raises:
        pydantic.ValidationError: a value of the wrong type.
    """
    if isinstance(p, SweepPoint):
        return p
    return SweepPoint.model_validate({k: v for k, v in p.items() if k in SweepPoint.model_fields})
