"""``review.json`` as a typed document (:class:`Review`, returned by :func:`quantverdict.review.core.build_review`)
and its JSON schema (``docs/schema/review.schema.json``, written by ``make schema``)."""

from __future__ import annotations

import json
import math
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, PlainSerializer, WithJsonSchema
from pydantic.json_schema import SkipJsonSchema

from quantverdict.config.schema import FloorTest, ReviewConfig
from quantverdict.measure import stats
from quantverdict.measure.aggregate import is_number
from quantverdict.review.flags import FlagCode

SCHEMA_VERSION: Final = 4
SCHEMA_PATH: Final = Path(__file__).resolve().parents[3] / "docs" / "schema" / "review.schema.json"


def finite(v: Any) -> float | None:
    """``v`` as a float; None unless a finite number (a bool is not one)."""
    return float(v) if is_number(v) and math.isfinite(v) else None


# a load level: req/s (rate sweeps) or concurrency (closed-loop sweeps); math.inf (JSON "inf") for an unlimited rate
Load = Annotated[
    float,
    Field(allow_inf_nan=True),
    PlainSerializer(lambda v: "inf" if math.isinf(v) else v),
    WithJsonSchema({"anyOf": [{"type": "number"}, {"const": "inf", "type": "string"}]}),
]


class _Strict(BaseModel):
    """Unknown keys and non-finite floats are refused (strict JSON, RFC 8259); assignments are validated. The schema
    is the written document's: every field required (a default is its value before the review fills it in)."""

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        validate_by_name=True,
        serialize_by_alias=True,
        validate_assignment=True,
        json_schema_mode_override="serialization",
        json_schema_serialization_defaults_required=True,
    )


class ConstraintKind(StrEnum):
    """The three constraints a scheme is checked against (:mod:`quantverdict.review.verdict`)."""

    MEMORY = "memory"
    ACCURACY = "accuracy"
    LATENCY = "latency"


class Outcome(StrEnum):
    """How a check or one of its criteria came out: ``pass`` / ``fail``: judged; ``unknown``: not judged (a number
    missing, no comparison possible), never lets a scheme be chosen; ``off``: no limit set; ``not_applicable``:
    accuracy of a model with random weights (never blocks)."""

    PASS = "pass"
    FAIL = "fail"
    UNKNOWN = "unknown"
    OFF = "off"
    NOT_APPLICABLE = "not_applicable"


class Decision(StrEnum):
    """The verdict for one model (:func:`quantverdict.review.verdict.decide`)."""

    DO_NOT_QUANTIZE = "do not quantize"  # the baseline meets every constraint
    QUANTIZE = "quantize"  # the least aggressive scheme that meets all three
    NO_SCHEME = "no scheme meets all three"  # the baseline fails one, and so does every scheme
    NO_BASELINE = "no baseline"  # the baseline did not run: no delta, no verdict
    BASELINE_NOT_CHECKED = "baseline not checked"  # the baseline's checks could not all be made


class CriterionMetric(StrEnum):
    """The number a criterion holds against its limit (``Criterion.limit``, the ``review.*`` key): ``need_gib``
    (``memory_budget_gib``): weights + KV cache + recurrent state + reserve, GiB; ``recovery_pct``
    (``min_recovery_pct``): ``100 · score / baseline``; ``perplexity_increase_pct`` (``max_perplexity_increase_pct``):
    ``100 · (ppl / baseline - 1)``; ``mean_kld_nats`` (``max_mean_kld``); ``top1_agreement_pct``
    (``min_top1_agreement_pct``); ``slo_attainment_pct``: % of requests meeting every latency objective at the stated
    load; ``ttft_ms_p99`` / ``itl_ms_p99``: p99s at the stated load, for records without per-request data;
    ``ceiling_rps`` (``load_rps``): the sustained ceiling, which must reach the stated rate."""

    NEED_GIB = "need_gib"
    RECOVERY_PCT = "recovery_pct"
    PERPLEXITY_INCREASE_PCT = "perplexity_increase_pct"
    MEAN_KLD_NATS = "mean_kld_nats"
    TOP1_AGREEMENT_PCT = "top1_agreement_pct"
    SLO_ATTAINMENT_PCT = "slo_attainment_pct"
    TTFT_MS_P99 = "ttft_ms_p99"
    ITL_MS_P99 = "itl_ms_p99"
    CEILING_RPS = "ceiling_rps"


class PassReason(StrEnum):
    """Why a quantized scheme was not the one chosen: ``job_*``: its job did not finish ok; ``fails_constraint`` /
    ``not_checked``: see ``PassedOver.fails`` / ``not_checked``; and for a scheme that passes every check:
    ``not_needed`` (the baseline meets every constraint), ``more_aggressive`` (a less aggressive scheme meets them),
    ``slower_same_tier`` (one of its tier with a lower E2E p50 at the load does), ``no_verdict`` (no verdict)."""

    JOB_FAILED = "job_failed"
    JOB_INTERRUPTED = "job_interrupted"
    JOB_NOT_FINISHED = "job_not_finished"
    FAILS_CONSTRAINT = "fails_constraint"
    NOT_CHECKED = "not_checked"
    NOT_NEEDED = "not_needed"
    MORE_AGGRESSIVE = "more_aggressive"
    SLOWER_SAME_TIER = "slower_same_tier"
    NO_VERDICT = "no_verdict"


class Lever(StrEnum):
    """What the chosen combination quantizes (``""``: nothing, the decision is not ``quantize``)."""

    NONE = ""
    WEIGHTS = "weights"
    KV_CACHE = "KV cache"
    BOTH = "weights and KV cache"


class JobStatus(StrEnum):
    """A job's status in its record (:class:`quantverdict.results.record.JobRecord`)."""

    OK = "ok"
    FAILED = "failed"
    INTERRUPTED = "interrupted"  # stopped from outside (Ctrl-C, SIGTERM)
    RUNNING = "running"  # read while running, or stopped without being marked


class DeltaKind(StrEnum):
    """An accuracy comparison: ``score`` (higher is better), ``perplexity`` (lower is better), ``kld`` (the KL
    divergence to the baseline's next-token distributions, and top-1 agreement)."""

    SCORE = "score"
    PERPLEXITY = "perplexity"
    KLD = "kld"


class RegimeRule(StrEnum):
    """What a regime claim rests on: a paired t test over repeats, the min-max range over repeats, one run."""

    PAIRED_T = "paired t"
    MIN_MAX_RANGE = "min-max range"
    SINGLE_RUN = "single run"


class RegimeClass(StrEnum):
    """A claim's class: the speedup ``pays`` (>= 1.05x established), ``costs`` (<= 1 / 1.05x), else ``no change``."""

    PAYS = "pays"
    COSTS = "costs"
    NO_CHANGE = "no change"


class RegimeReading(StrEnum):
    """Where a scheme pays, from the classes of its two regime claims: ``excluded`` (kept out of speed comparisons),
    ``speed_missing`` (no claim for it or its baseline), ``saturation_not_measured`` (the low-load claim alone), else
    the four combinations of the two claims paying."""

    EXCLUDED = "excluded"
    SPEED_MISSING = "speed_missing"
    SATURATION_NOT_MEASURED = "saturation_not_measured"
    PAYS_AT_LOW_LOAD_ONLY = "pays_at_low_load_only"
    KEEPS_PAYING = "keeps_paying"
    PAYS_AT_SATURATION_ONLY = "pays_at_saturation_only"
    DOES_NOT_PAY = "does_not_pay"


class GoodputMissing(StrEnum):
    """Why a sweep has no goodput at the stated load: no latency SLO, no point at the load, or no per-request data
    (no ``--save-detailed`` result file beside the record)."""

    NO_SLO = "no_slo"
    NO_POINT = "no_point"
    NO_PER_REQUEST = "no_per_request"


# the paired test's verdict (:func:`quantverdict.measure.stats.paired_ratio`): the 95% interval of the speedup lies
# above 1, below 1, or contains it
PairedVerdict = Literal["faster", "slower", "no difference established"]


class Tool(_Strict):
    name: str
    version: str


class MinMax(_Strict):
    """The run-to-run range of a median: its smallest and largest value over the valid repeats."""

    min: float
    max: float


class Interval(_Strict):
    """An estimate with a two-sided interval (:class:`quantverdict.measure.stats.Interval`), in its field's unit."""

    estimate: float
    low: float
    high: float
    method: str
    n: int | None
    unit: str

    @classmethod
    def of(cls, iv: stats.Interval | None) -> Interval | None:
        """``iv`` as the document holds it; None when missing or any of its three numbers is not finite."""
        if iv is None or not all(math.isfinite(v) for v in (iv.estimate, iv.low, iv.high)):
            return None
        return cls(estimate=iv.estimate, low=iv.low, high=iv.high, method=iv.method, n=iv.n, unit=iv.unit)


class Criterion(_Strict):
    """One limit a check held one number against: ``judged`` (``observed`` under the point test, the interval's end
    nearest to passing under the interval test) must satisfy ``comparison`` ``threshold``; both None when missing."""

    metric: CriterionMetric
    subject: str = Field(description="what the number is of: the task and metric, or the load level; '' for memory")
    limit: str = Field(description="the review.* key the threshold comes from")
    comparison: Literal["<=", ">="]
    threshold: float
    observed: float | None
    judged: float | None
    test: Literal["point", "interval"]
    outcome: Outcome
    note: str = ""


def criterion(
    metric: CriterionMetric,
    subject: str,
    limit: str,
    comparison: Literal["<=", ">="],
    threshold: float,
    observed: float | None,
    *,
    judged: float | None = None,
    test: Literal["point", "interval"] = "point",
    ok: bool | None = None,
    note: str = "",
) -> Criterion:
    """``judged`` (default ``observed``) held against ``threshold``; the outcome is ``ok`` where given, else the
    comparison; ``unknown`` without a finite value."""
    value = finite(observed if judged is None else judged)
    if ok is None and value is not None:
        ok = value <= threshold if comparison == "<=" else value >= threshold
    outcome = Outcome.UNKNOWN if ok is None or value is None else Outcome.PASS if ok else Outcome.FAIL
    v: dict[str, Any] = dict(metric=metric, subject=subject, limit=limit, comparison=comparison, threshold=threshold)
    v |= dict(observed=finite(observed), judged=value, test=test, outcome=outcome, note=note)
    return Criterion.model_validate(v)


class Check(_Strict):
    """One constraint checked for one scheme: its outcome, the criteria it rests on, and the sentences the
    renderers print (``text``: with the numbers; ``shortfall``: by how much a failing scheme misses; ``cite``:
    the numbers alone). ``excess`` is the worst shortfall relative to its limit (ranks the failing schemes). The
    defaults: not checked yet (:func:`quantverdict.review.verdict.checks`)."""

    constraint: ConstraintKind
    outcome: Outcome = Outcome.UNKNOWN
    criteria: list[Criterion] = []
    excess: float = 0.0
    text: str = "not checked"
    shortfall: str = ""
    cite: str = ""


class Checks(_Strict):
    memory: Check = Check(constraint=ConstraintKind.MEMORY)
    accuracy: Check = Check(constraint=ConstraintKind.ACCURACY)
    latency: Check = Check(constraint=ConstraintKind.LATENCY)

    def in_order(self) -> list[Check]:
        return [self.memory, self.accuracy, self.latency]


class Flag(_Strict):
    """An honesty flag: what a reader must know before trusting a number (``scheme`` "": about no single scheme)."""

    code: FlagCode
    model: str
    scheme: str
    message: str

    @classmethod
    def new(cls, code: FlagCode, message: str) -> Flag:
        """A flag about no scheme yet (the review sets ``model`` and ``scheme`` when it lists its scorecard's)."""
        return cls(code=code, model="", scheme="", message=message)

    def of(self, name: str) -> Flag:
        """This flag with its message prefixed ``name: `` (the scorecard's name)."""
        return self.model_copy(update={"message": f"{name}: {self.message}"})


class PassedOver(_Strict):
    """A quantized scheme not chosen, and why (``criteria``: the limits it fails or could not be held against)."""

    scheme: str
    reason: PassReason
    fails: list[ConstraintKind]
    not_checked: list[ConstraintKind]
    criteria: list[Criterion]


class KvLever(_Strict):
    """The KV-cache lever weighed on the baseline: what memory binds on, and whether the baseline's need with an FP8
    KV cache (its ``memory.need_gib_kv_fp8``) fits the budget."""

    binds_on: Literal["kv_cache", "weights"] | None
    fp8_fits: bool | None
    measured: list[str] = Field(description="the quantized-cache combinations whose jobs finished ok")


class GpuFit(_Strict):
    """The scheme labels that need ``gpus`` GPUs for the memory budget."""

    gpus: int
    labels: list[str]


class GpuSpeed(_Strict):
    """One scheme's sustained output tok/s and per GPU its server used (``lower_bound``: of its ceiling)."""

    scheme: str
    output_tok_s: float
    lower_bound: bool
    gpus: int
    output_tok_s_per_gpu: float


class GpuNeeds(_Strict):
    """One model's schemes by the GPUs they need for the memory budget (:func:`quantverdict.review.gpus.gpu_needs`),
    ``fits`` most GPUs first, ``fit_none`` on none of ``largest`` GPUs or fewer; each one's tok/s per GPU."""

    fits: list[GpuFit]
    fit_none: list[str]
    largest: int
    speeds: list[GpuSpeed]


class ModelVerdict(_Strict):
    """The decision for one model. ``chosen_scheme``: the scheme to deploy (the baseline for ``do not quantize``),
    None unless ``quantize`` or ``do not quantize``; ``binding``: the constraints the baseline fails;
    ``accuracy_not_measured``: why accuracy was not measured (random weights), ``""`` when it was."""

    model: str
    decision: Decision
    chosen_scheme: str | None
    chosen_label: str | None
    binding: list[ConstraintKind]
    passed_over: list[PassedOver]
    order: list[str] = Field(description="the quantized schemes in the order they were tried")
    lever: Lever
    kv_lever: KvLever | None = Field(description="None without a baseline")
    accuracy_not_measured: str
    baseline_scheme: str | None
    request_shape: str | None = Field(description="the request shape every sweep of the model ran; None if they differ")
    request_shapes: dict[str, str] = Field(description="scheme name -> request shape, for the schemes with points")
    ceilings_differ_in_basis: bool = Field(description="the schemes' ceilings rest on different windows")
    compute_reported: bool = Field(description="a server log said whether some scheme computes in its format")
    closest_scheme: str | None = Field(
        description="no scheme meets all three: the one closest to (fewest blocking checks, then least excess)"
    )
    gpus: GpuNeeds | None = Field(description="None where no scheme of the model ran on a GPU")


class HybridPaging(_Strict):
    """How vLLM pages a hybrid model (:func:`quantverdict.measure.kv_cache.hybrid_paging`)."""

    block_tokens: int
    page_bytes: float
    kv_layers: int
    state_layers: int


class Memory(_Strict):
    """The memory the scheme needs for the stated capacity (GiB = 2^30 bytes) and what vLLM reported (``server_*``):
    ``need_gib = weights_gib + kv_needed_gib + state_needed_gib + reserved_gib`` (:mod:`quantverdict.review.memory`)."""

    need_gib: float | None = None
    budget_gib: float | None = None
    weights_gib: float | None = None
    weights_source: str | None = None
    kv_needed_gib: float | None = None
    kv_needed_tokens: int | None = None
    kv_dtype: str | None = None
    kv_dtype_bytes: float | None = None
    kv_bytes_per_token: float | None = None
    kv_bytes_per_token_measured: float | None = None
    kv_bytes_per_token_paged: float | None = None
    kv_scale_bytes: int | None = None
    state_bytes_per_sequence: float | None = None
    state_needed_gib: float | None = None
    reserved_gib: float | None = None
    request_len_tokens: int | None = None
    need_gib_kv_fp8: float | None = None
    budget_kv_tokens: int | None = None
    budget_max_concurrency: float | None = None
    checkpoint_gib: float | None = None
    bits_per_weight: float | None = None
    hybrid_paging: HybridPaging | None = None
    server_weights_gib: float | None = None
    server_kv_cache_gib: float | None = None
    server_kv_tokens: int | None = None
    server_max_concurrency: float | None = None
    kernels: list[str] = []
    fallback: bool = False
    fallback_lines: list[str] = []
    unquantized_gemm_fallback: bool = False


class KldFigures(_Strict):
    """The record's KL divergence summary (:class:`quantverdict.measure.kld.KldSummary`); None where not recorded."""

    mean_kld: float | None = None
    median_kld: float | None = None
    p99_kld: float | None = None
    max_kld: float | None = None
    top1_agreement_pct: float | None = None
    rms_delta_p_pct: float | None = None
    mean_delta_p_pct: float | None = None
    n_tokens: int | None = None
    n_windows: int | None = None
    kld_exact: bool | None = None
    top_k: int | None = None
    confidence: float | None = None
    mean_kld_ci_low: float | None = None
    mean_kld_ci_high: float | None = None
    top1_agreement_pct_ci_low: float | None = None
    top1_agreement_pct_ci_high: float | None = None
    interval_method: str | None = None
    interval_note: str | None = None


class AccuracyDelta(_Strict):
    """One accuracy comparison against the baseline (:mod:`quantverdict.review.accuracy`).
    ``score`` (higher is better): ``delta = value - baseline``, ``recovery_pct = 100 · value / baseline``;
    ``perplexity`` (lower is better): ``delta_pct = 100 · (value / baseline - 1)``; ``kld``: metric ``mean_kld``
    (nats, baseline 0, ``delta`` = the mean KLD), ``top1_agreement_pct`` (baseline 100, ``recovery_pct`` = the
    agreement) or ``refused``. ``interval`` is of ``delta`` (score, kld) or ``delta_pct`` (perplexity),
    ``recovery_interval`` in %; ``refused``: why the comparison cannot be made (it is then left unjudged)."""

    name: str
    metric: str
    kind: DeltaKind
    value: float | None = None
    baseline: float | None = None
    delta: float | None = None
    delta_pct: float | None = None
    recovery_pct: float | None = None
    interval: Interval | None = None
    recovery_interval: Interval | None = None
    mcnemar_b: int | None = None
    mcnemar_c: int | None = None
    mcnemar_p: float | None = None
    n: int | None = None
    paired: bool = False
    significant: bool | None = None
    note: str = ""
    refused: str = ""
    kld: KldFigures | None = None

    @classmethod
    def new(
        cls, name: str, metric: str, kind: DeltaKind, value: float, baseline: float, **figures: Any
    ) -> AccuracyDelta:
        """A comparison with the ``figures`` given, the others unset; numbers that are not finite become None."""
        given = figures | {"name": name, "metric": metric, "kind": kind, "value": value, "baseline": baseline}
        return cls.model_validate({k: finite(v) if isinstance(v, float) else v for k, v in given.items()})


class Accuracy(_Strict):
    """``not_applicable``: why accuracy cannot be measured (random weights); ``refused``: why every delta was
    excluded (settings differ)."""

    not_applicable: str | None = None
    refused: str | None = None
    deltas: list[AccuracyDelta] = []


class Workload(_Strict):
    """The request shape the sweep ran (``bench.input_len`` / ``output_len`` tokens)."""

    bench: str | None
    input_len: int | None
    output_len: int | None
    text: str


class LowLoad(_Strict):
    """The lowest measured load: ITL p50 (ms) and one request's output tok/s (``1000 / TPOT p50``)."""

    label: str | None
    itl_ms_p50: float | None
    itl_ms_p50_range: MinMax | None
    output_tok_s_per_request: float | None


class Ceiling(_Strict):
    """The sustained ceiling (:func:`quantverdict.measure.capacity.sustained_ceiling`), medians over repeats.
    ``lower_bound``: no point saturated, or the sweep stopped before its top loads (the capacity is at least this).
    ``basis``: ``steady_window``, ``whole_run`` or ``mixed``."""

    kind: str
    label: str | None
    rps: float | None
    output_tok_s: float | None
    output_tok_s_range: MinMax | None
    whole_run_output_tok_s: float | None
    whole_run_output_tok_s_range: MinMax | None
    repeats: int | None
    basis: str | None
    lower_bound: bool


class Goodput(_Strict):
    """Per-request goodput at one load (as ``vllm bench serve --goodput``): requests meeting every objective."""

    goodput_rps: float
    slo_attainment_pct: float
    good_requests: int
    slo_requests: int
    repeats: int
    slo_missed: dict[str, int] = Field(description="requests over each objective (ttft, tpot, e2e)")


class AtLoad(_Strict):
    """The point at the stated load (``points`` holds its other figures under the same label): medians over its valid
    repeats, [min, max] per metric in ``spread``."""

    label: str
    load: Load
    output_tok_s: float | None
    ttft_ms_p99: float | None
    itl_ms_p99: float | None
    e2e_ms_p50: float | None
    valid_repeats: int | None
    spread: dict[str, MinMax]
    goodput: Goodput | None


class Roofline(_Strict):
    """Decode-step bytes against the GPU's measured copy bandwidth (the record's ``speed.roofline``)."""

    decode_bytes: int | None = None
    copy_bytes_per_s: float | None = None
    ideal_ms_per_token: float | None = None
    tpot_ms: float | None = None
    efficiency: float | None = None
    achieved_bytes_per_s: float | None = None
    note: str | None = None


class SpeedPoint(_Strict):
    """One load level of a sweep (:func:`quantverdict.review.speed.speed_points`): medians over its valid repeats
    (ms, req/s, output tok/s; ``completed`` / ``failed``: requests); ``saturated``: most valid repeats saturated
    (None where not decided: a closed-loop or unlimited-rate point)."""

    label: str
    load: Load
    achieved_rps: float | None
    output_tok_s: float | None
    ttft_ms_p50: float | None
    ttft_ms_p99: float | None
    itl_ms_p50: float | None
    itl_ms_p99: float | None
    tpot_ms_p50: float | None
    e2e_ms_p99: float | None
    completed: float | None
    failed: float | None
    output_tokens_total: float | None
    output_tokens_requested: float | None
    valid_repeats: int
    repeats: int
    saturated: bool | None
    energy_per_output_token_j: float | None = Field(
        default=None, description="GPU energy per output token in the measured window (J, NVML), median over repeats"
    )

    # the review's working data, not written: more medians, [min, max] over the valid repeats, per-request goodput
    tpot_ms_p99: SkipJsonSchema[float | None] = Field(default=None, exclude=True)
    e2e_ms_p50: SkipJsonSchema[float | None] = Field(default=None, exclude=True)
    e2e_ms_mean: SkipJsonSchema[float | None] = Field(default=None, exclude=True)
    spread: SkipJsonSchema[dict[str, MinMax]] = Field(default_factory=dict, exclude=True)
    goodput: SkipJsonSchema[Goodput | None] = Field(default=None, exclude=True)


class CapacityLevel(_Strict):
    """One load a capacity search measured at one server start, its repeats pooled: ``good`` of ``sent`` requests
    met the SLO (``attainment_pct`` = 100 good / sent), ``passed`` = attainment >= the search's target."""

    server_start: int
    load: float
    good: int
    sent: int
    attainment_pct: float
    passed: bool


class CapacityStart(_Strict):
    """One server start's capacity, re-derived from its recorded points
    (:func:`quantverdict.measure.slo_capacity.capacity_from_points`): ``capacity`` (None: its lowest load failed),
    the bracket ``[low, high]`` (``high`` None: no load above it failed) and why its search stopped."""

    server_start: int
    capacity: float | None
    low: float | None
    high: float | None
    stop_reason: str | None
    agrees_with_search: bool = Field(description="the search's own answer is the one its points give")


class Capacity(_Strict):
    """Capacity at the SLO (``bench.capacity``; :func:`quantverdict.review.capacity.scheme_capacity`): the highest
    load at which ``attainment_pct`` % of the requests met ``slo``, per server start and over starts.

    ``capacity``: the median over starts (the lower middle of an even count; a start whose lowest load failed counts
    lowest); ``interval`` over the starts with a capacity (Student t on their logs, else their min-max);
    ``output_tok_s`` measured at ``at_load``, the measured load the verdict's speed reads (the highest measured load
    at or below ``capacity``)."""

    mode: str
    slo: str = Field(description="the objectives, as text: 'TTFT <= 1,000 ms and TPOT <= 25 ms'")
    slo_ms: dict[str, float] = Field(description="objective (ttft, tpot, e2e) -> ms")
    attainment_pct: float
    tolerance_pct: float | None
    capacity: float | None = Field(description="None: no start met the SLO at its lowest load searched")
    interval: Interval | None
    at_least: bool = Field(description="a start passed its largest load searched: the capacity is at least this")
    at_load: float | None
    output_tok_s: float | None = Field(description="output tok/s at at_load, median over its valid repeats")
    output_tok_s_per_gpu: float | None
    starts: list[CapacityStart]
    levels: list[CapacityLevel]
    note: str = ""


class Speed(_Strict):
    """The scheme's sweep (:func:`quantverdict.review.speed.speed_summary`). ``comparable`` False: kept out of speed
    comparisons (``excluded_why``); ``goodput_rps``: req/s meeting every objective at the stated load."""

    mode: str | None = None
    workload: Workload | None = None
    repeats: int | None = None
    comparable: bool = True
    excluded_why: str | None = None
    kernel: str | None = None
    compute: str | None = None
    compute_reason: str | None = None
    low_load: LowLoad | None = None
    ceiling: Ceiling | None = None
    at_load: AtLoad | None = None
    load_how: str | None = None
    goodput_rps: float | None = None
    goodput_missing: GoodputMissing | None = Field(default=None, description="why goodput_rps is None (None: counted)")
    missing_levels: list[str] = []
    stopped_before: list[str] = []
    roofline: Roofline | None = None
    points: list[SpeedPoint] = []
    capacity: Capacity | None = Field(default=None, description="capacity at the SLO; None: no search ran")

    @classmethod
    def unmeasured(cls, mode: str | None = None) -> Speed:
        """A sweep without points: every number None, comparable (until a kernel or request shape says not)."""
        return cls(mode=mode)


class SpeedRatio(_Strict):
    """The scheme's per-user output speed over the baseline's at one load level (``baseline TPOT p50 / scheme
    TPOT p50``; > 1 is faster), with the run-to-run range (:func:`quantverdict.review.headline.speed_ratio`)."""

    value: float
    low: float | None
    high: float | None
    load: Load
    label: str
    repeats: int


class HeadlineAccuracy(_Strict):
    """The accuracy delta the check judges worst: ``delta`` in % (perplexity) or in points (score,
    ``100 · (value - baseline)``), its interval in the same unit."""

    name: str
    metric: str
    kind: DeltaKind
    unit: Literal["%", "points"]
    delta: float | None
    low: float | None
    high: float | None
    n: int | None


class Headline(_Strict):
    """The first screen's three numbers (:mod:`quantverdict.review.headline`); the speed ratio at concurrency 1 (or
    the lowest load) and at the stated load. None for the baseline and where not measured (``speed_note``: why)."""

    memory_need_gib: float | None = None
    accuracy: HeadlineAccuracy | None = None
    speed_ratio_c1: SpeedRatio | None = None
    speed_ratio_at_load: SpeedRatio | None = None
    speed_note: str = ""


class Scheme(_Strict):
    """One job of the review: identity, the three numbers, the checks, and what could not be computed."""

    job_id: str
    model: str
    scheme: str
    label: str
    name: str = Field(description="how the review names it: '<scheme> (<label>)'")
    weight_tier: int = Field(description="0 for 16-bit weights, 1 for 8-bit, 2 for 4-bit or fewer")
    kv_cache: str = Field(description="the KV cache's precision: auto, fp8, ...")
    is_baseline: bool
    status: JobStatus
    failed_stage: str | None
    error: str | None
    gpus: int = Field(description="GPUs the job's server used")
    headline: Headline = Field(default_factory=Headline)
    memory: Memory = Field(default_factory=Memory)
    accuracy: Accuracy = Field(default_factory=Accuracy)
    speed: Speed = Field(default_factory=Speed.unmeasured)
    checks: Checks = Field(default_factory=Checks)
    missing: list[str] = Field(default_factory=list)
    validity: list[str] = Field(default_factory=list)

    # the review's working data, not written: the scheme's honesty flags, before the review lists every scheme's
    flags: SkipJsonSchema[list[Flag]] = Field(default_factory=list, exclude=True)


class RegimeClaim(_Strict):
    """One regime claim, at low load or at saturation (:func:`quantverdict.review.verdict.regime_side`): ``speedup``
    > 1 is faster; ``low``/``high``: its 95% interval (paired t) or min-max range (None for one run). A paired
    ``faster`` or ``slower`` whose class is ``no change`` is established but inside 1 / 1.05 to 1.05."""

    rule: RegimeRule
    speedup: float
    low: float | None
    high: float | None
    pairs: int | None
    load: Load | None
    metric: str | None
    verdict: PairedVerdict | None = Field(description="the paired test's verdict; None without a paired test")
    class_: RegimeClass = Field(validation_alias="class", serialization_alias="class")


class PairedSpeedup(_Strict):
    """One metric at one load, paired by repeat against the baseline
    (:func:`quantverdict.review.verdict.paired_speedups`): the scheme / baseline ratio, its geometric mean and 95%
    interval (None under 2 pairs), and the same as a speedup (> 1 is faster)."""

    metric: str
    name: str
    load: Load
    label: str
    pairs: int
    ratios: list[float]
    ratio: float | None
    low: float | None
    high: float | None
    speedup: float | None
    speedup_low: float | None
    speedup_high: float | None
    verdict: PairedVerdict


class Regime(_Strict):
    """Where a scheme pays against its baseline: speedups at low load (baseline ITL p50 / the scheme's) and at
    saturation (ceiling output tok/s / the baseline's), and their claims."""

    scheme: str
    label: str
    low_load_speedup: float | None
    low_load_range: MinMax | None
    saturation_speedup: float | None
    saturation_range: MinMax | None
    low_load_claim: RegimeClaim | None
    saturation_claim: RegimeClaim | None
    saturation_not_compared: str | None
    paired: list[PairedSpeedup]
    reading: RegimeReading


class SchemeCost(_Strict):
    """USD per million output tokens (:func:`quantverdict.review.cost.cost_json`)."""

    model: str
    scheme: str
    gpus: int
    usd_per_mtok_at_load: float | None
    at_load_tok_s: float | None
    usd_per_mtok_ceiling: float | None
    ceiling_tok_s: float | None
    ceiling_lower_bound: bool
    energy_usd_per_mtok_at_load: float | None = None
    energy_usd_per_mtok_ceiling: float | None = None


class Cost(_Strict):
    gpu: str
    gpu_kind: str
    usd_per_gpu_hour: float
    usd_per_kwh: float | None = None
    schemes: list[SchemeCost]


class Target(_Strict):
    """The deployment target (``conf/target``): its GPU, memory and vLLM's share of it (``budget_gib`` =
    ``memory_gib x memory_fraction``)."""

    name: str
    gpu: str
    memory_gib: float
    memory_fraction: float
    budget_gib: float


class TargetFit(_Strict):
    """A candidate's memory on the target GPU."""

    kv_gib: float | None = None
    reserve_gib: float | None = None
    reserve_how: str | None = None
    max_len: int | None = None
    kv_tokens: int | None = None
    max_concurrency: float | None = None
    req_len: int | None = None
    req_concurrency: float | None = None
    fits: bool | None = None
    why: str = ""


class VllmFigures(_Strict):
    """vLLM's own KV-cache figures as the job was served, and the budget they were run at (``how``)."""

    kv_gib: float | None = None
    kv_tokens: int | None = None
    max_concurrency: float | None = None
    how: str | None = None


class DecodeFit(_Strict):
    """A decode-step fit: ``fixed_us + per_seq_us · sequences in flight``, its R² over ``points`` points whose
    sequences in flight span ``seqs_min`` to ``seqs_max``."""

    fixed_us: float
    per_seq_us: float
    r2: float | None
    points: int
    seqs_min: float | None = None
    seqs_max: float | None = None


class SpeedVsBytes(_Strict):
    """A candidate's ceiling against the reference's, and the ratio predicted from bytes per decode step
    (:func:`quantverdict.measure.decode_bytes.predicted_speed_ratio`; decode is memory-bound): ``measured_ratio`` =
    ceiling / the reference's; ``predicted_ratio`` = the reference's bytes per step / the candidate's;
    ``by_weights_ratio``: the same from all the weights (None where the bytes per step already are the weights)."""

    measured_ratio: float
    predicted_ratio: float
    measured_over_predicted: float
    by_weights_ratio: float | None
    measured_over_by_weights: float | None
    usd_per_mtok_ceiling: float | None


class TaskScore(_Strict):
    """A candidate's absolute score on one task, and its own quantization delta against its model's baseline
    (``own_delta``: a score's absolute change, a perplexity's change in %; its interval in the same unit)."""

    metric: str
    value: float
    n: int | None
    own_delta_kind: DeltaKind | None = None
    own_delta: float | None = None
    own_delta_low: float | None = None
    own_delta_high: float | None = None


class Candidate(_Strict):
    """One (model, scheme) job seen from the target; ``mean_score`` over :attr:`CrossModel.score_tasks`, None when
    the ranking is not by accuracy."""

    name: str
    model: str
    scheme: str
    mean_score: float | None = None
    weights_gib: float | None
    weights_how: str
    target: TargetFit
    vllm: VllmFigures
    ceiling_tok_s: float | None
    ceiling_lower_bound: bool
    step_bytes: float | None
    step_bytes_how: str
    speed_vs_bytes: SpeedVsBytes | None = Field(default=None, description="None for the reference's missing figures")
    decode_fit: DecodeFit | None
    decode_fit_itl: DecodeFit | None
    fit_levels: int = Field(description="unsaturated load levels with a TPOT p50 and sequences in flight")
    scores: dict[str, TaskScore]
    why_not: list[str] = Field(description="why it is not eligible; empty: eligible")
    flags: list[str]


class PairedAcross(_Strict):
    """One task's score difference between a bigger and a smaller model (bigger - smaller), paired on the items
    both ran with the review's interval; ``low``/``high`` None when unpaired (no per-item samples)."""

    bigger: str
    smaller: str
    task: str
    metric: str
    difference: float
    low: float | None
    high: float | None
    n: int
    significant: bool


class Comparison(_Strict):
    """A bigger model quantized against a smaller one unquantized (candidate names), and the model that wins each
    number: memory by max concurrency on the target (``tie`` when equal), else by weights GiB, None when not
    compared; accuracy by the tasks on which each is significantly better (:class:`PairedAcross`), over ``tasks``
    (0: not measured on both); speed by the ceiling output tok/s."""

    bigger: str
    smaller: str
    memory_winner: str | None
    memory_bigger: float | None
    memory_smaller: float | None
    tasks: int
    accuracy_winner: str | None = Field(description="None: no significant difference either way")
    wins_bigger: int
    wins_smaller: int
    speed_winner: str | None
    speed_bigger: float | None
    speed_smaller: float | None


class CrossModel(_Strict):
    """Models compared on one target GPU (:mod:`quantverdict.review.crossmodel`). ``ran_on_target``: every GPU the
    jobs ran on is the target's, else ``ran`` lists where they ran; ``score_tasks``: the tasks the ranking's mean
    score is over (empty: ranked on speed alone); ``sweep_loads``: the load labels any candidate measured, by load;
    ``price_usd_per_gpu_hour``: of the ratio table's cost column (None: ``price_note`` says why)."""

    target: Target | None
    ran_on_target: bool
    ran: list[str]
    chosen: str | None
    score_tasks: list[str]
    comparisons: list[Comparison]
    paired: list[PairedAcross]
    reference: str | None
    price_usd_per_gpu_hour: float | None
    price_note: str
    sweep_loads: list[str]
    candidates: list[Candidate]


class CrossModelError(_Strict):
    error: str


class JobCounts(_Strict):
    total: int
    finished: int
    failed: int
    interrupted: int


class SettingSource(StrEnum):
    """Where a constraint's value comes from: the set's file (or the schema's default for a set built in code),
    an override, or the budget derived from ``review.target``."""

    SET_FILE = "set file"
    OVERRIDE = "override"
    TARGET = "target"


class ConstraintSetting(_Strict):
    """One ``review.*`` key: its value, where it comes from, and the set file's value (``set_file``: the file's
    name, or ``default`` for the schema's defaults)."""

    key: str
    value: JsonValue
    source: SettingSource
    set_file: str
    set_file_value: JsonValue


class FloorTests(_Strict):
    """Which test judged each accuracy delta against its floor (``review.floor_test``): task or metric -> its
    item count, by test."""

    mode: FloorTest
    interval_test_below_n: int
    interval: dict[str, int | None]
    point: dict[str, int | None]


class Plot(_Strict):
    name: str
    file: str = Field(description="beside review.md: plots/<name>.png")
    alt: str


class Review(_Strict):
    """``review.json``: which scheme to deploy under the stated constraints, per model."""

    model_config = ConfigDict(title="quantverdict review")

    schema_version: Literal[4]
    tool: Tool
    source: str
    generated_at: str
    constraints_label: str = Field(description="names the review: <set>-<hash of the constraints>")
    constraints_how: str = Field(description="how the constraint set was picked")
    constraints: ReviewConfig = Field(description="the limits checked")
    constraint_settings: list[ConstraintSetting] = Field(description="where each constraint's value comes from")
    floor_tests: FloorTests | None
    jobs: JobCounts
    environment: list[str] = Field(description="where the records ran: one line per CPU, GPU and serving stack")
    verdicts: list[ModelVerdict]
    scorecards: list[Scheme]
    regime: dict[str, list[Regime]] = Field(description="model -> one row per quantized scheme")
    flags: list[Flag] = Field(description="every scheme's honesty flags, in scheme order")
    validity: list[str] = Field(description="what each number stands on")
    notes: list[str]
    cost: Cost | None
    cross_model: CrossModel | CrossModelError | None
    plots: list[Plot] = Field(description="the plots written beside review.md; empty when none was made")

    def verdict(self, model: str) -> ModelVerdict:
        """The verdict of ``model``; KeyError (naming the models reviewed) when there is none."""
        if (found := next((v for v in self.verdicts if v.model == model), None)) is None:
            raise KeyError(f"no verdict for {model!r}; models: {', '.join(v.model for v in self.verdicts)}")
        return found

    def scheme(self, model: str, scheme: str) -> Scheme:
        """The scorecard of ``scheme`` of ``model``; KeyError (naming the model's schemes) when there is none."""
        mine = [sc for sc in self.scorecards if sc.model == model]
        if (found := next((sc for sc in mine if sc.scheme == scheme), None)) is None:
            raise KeyError(f"no scheme {scheme!r} of {model!r}; schemes: {', '.join(sc.scheme for sc in mine)}")
        return found


def schema_text() -> str:
    """The JSON schema (draft 2020-12) of ``review.json``, as the committed file holds it."""
    schema = Review.model_json_schema(mode="serialization")  # every model's mode: the written document's
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def write_schema(path: Path = SCHEMA_PATH) -> Path:
    """Write :func:`schema_text` to ``path`` (default: ``docs/schema/review.schema.json`` of this checkout)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(schema_text())
    return path
