"""Record data is read through its models, not with ``dict.get``: a grep of ``src/quantverdict`` for ``.get(``.

A job's record (:class:`quantverdict.results.record.JobRecord` and its sections), its sweep points and summaries, the
sidecars beside them and what a child stage returns once validated
(:mod:`quantverdict.results.stage_results`) are read as typed fields. ``.get(`` stays only where the data is not
(yet) a record's: the files and folders below, each with its reason. A folder or file listed without a count may
use ``.get(`` freely; a file listed with a count holds exactly that many (a new one fails; one removed asks for the
count to go down). Any other file holds none.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pydantic
import pytest

from quantverdict.results.record import Environment, JobRecord
from quantverdict.results.stage_results import PointSidecar

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "quantverdict"
GET = re.compile(r"\.get\(")

# folders not checked (relative to src/quantverdict, with a trailing slash); empty it to check every folder
NOT_CHECKED: tuple[str, ...] = ()

# where ``.get(`` is the right read: the data there is not a record's (any number of uses)
NOT_RECORD_DATA: dict[str, str] = {
    "children/": "third-party output (lm-eval, vLLM, transformers, safetensors) parsed in a stage environment, "
    "before the orchestrator validates what the child returns",
    "config/": "YAML config, OmegaConf containers, scheme tables, the CPU probe's output and os.environ",
    "processes/wheelhouse.py": "pip reports, wheelhouse metadata and the env and model YAML files",
    "results/migrate.py": "the one module that reads older record layouts",
    "orchestrate/hub.py": "os.environ and huggingface_hub's settings",
    "orchestrate/data_access.py": "os.environ and lm-eval's task YAML",
    "orchestrate/preflight.py": "a model's config.json from the hub, before any record exists",
    "orchestrate/dummy.py": "a model's config.json, read to build a small stand-in model",
    "serving/server.py": "vLLM's HTTP responses (/v1/models, /reset_prefix_cache)",
}

# files that keep an exact number of ``.get(``, each with what it reads
COUNTED: dict[str, tuple[int, str]] = {
    "orchestrate/starts.py": (2, "the stopping rule's decisions per job, a table built in run_starts"),
    "orchestrate/job.py": (4, "the config's env_vars and vllm_args, and the job's own dtype choices"),
    "orchestrate/hardware.py": (
        18,
        "nvidia-smi's parsed fields, a model config's dimensions and the torch-build probe, checked before a job "
        "starts",
    ),
    "orchestrate/caches.py": (14, "cache entries' files and the model config's keys that make up a cache key"),
    "results/record.py": (2, "a task's metrics by lm-eval's name (TaskResult.metric) and os.environ"),
    "results/tracking.py": (4, "MLflow's experiment and run tags"),
    "measure/workload.py": (2, "the sweep client's spec dataset (serving.workload.client_dataset): kind"),
    "serving/benchmark.py": (1, "the sweep client's spec dataset: output_tokens_from_file, absent for vLLM's datasets"),
    "serving/gpu_sampling.py": (1, "the config's env_vars (CUDA_VISIBLE_DEVICES)"),
    "results/baseline.py": (
        2,
        "a task's metric in config.eval.headline (JobRecord.headline: read through the typed view, then looked up) "
        "and a task's delta in AccuracyDeltas.tasks (typed, keyed by task)",
    ),
    "measure/gpu_samples.py": (2, "nvidia-smi's column names, mapped to the sample's keys"),
    "measure/host_samples.py": (
        3,
        "psutil's CPU times by field, the gauges parsed from /metrics, and a sample's CPU by server role (0 where the "
        "role had no process)",
    ),
    "measure/keep16.py": (2, "a checkpoint's quantization_config and safetensors entries"),
    "measure/kv_cache.py": (1, "vLLM's table of KV-cache element sizes by dtype name (a constant)"),
    "measure/memory.py": (1, "the bytes per dtype it sums over a checkpoint's safetensors headers"),
    "measure/perplexity.py": (1, "lm-eval's reported metrics"),
    "measure/server_metrics.py": (2, "vLLM's /metrics counters, before and after a point"),
    "review/accuracy.py": (4, "lm-eval's per-sample rows (samples_*.jsonl) and a metric -> count-key table"),
    "review/crossmodel.py": (2, "lm-eval's per-sample rows, and baseline scores the review computed"),
    "review/gpus.py": (1, "the groups by GPU count the review built"),
    "review/headline.py": (2, "a speed point's spread by metric, computed by the review"),
    "review/memory.py": (3, "bytes per element by dtype name (measure.memory.DTYPE_BYTES, a constant)"),
    "review/plots.py": (3, "colours and markers by scheme (constants) and deltas by name, computed by the review"),
    "review/speed.py": (2, "a GPU-idle window's CPU by server role (HostLoad's dict, 0 where the role had no process)"),
    "review/verdict.py": (4, "word and reason tables (constants) and a speed point's spread by metric (the review's)"),
}


def _uses() -> dict[str, int]:
    """``.get(`` per Python file under src/quantverdict (path relative to it), folders in NOT_CHECKED left out."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(NOT_CHECKED):
            continue
        n = len(GET.findall(path.read_text()))
        if n:
            out[rel] = n
    return out


def _free(rel: str) -> bool:
    return any(rel == key or (key.endswith("/") and rel.startswith(key)) for key in NOT_RECORD_DATA)


def test_no_file_reads_record_data_with_get() -> None:
    unlisted = {rel: n for rel, n in _uses().items() if not _free(rel) and rel not in COUNTED}
    assert not unlisted, (
        f"`.get(` in {unlisted}: read record data through its model (quantverdict.results.record / stage_results); "
        "data that is not a record's goes in this test's NOT_RECORD_DATA or COUNTED, with its reason"
    )


@pytest.mark.parametrize("rel", sorted(COUNTED))
def test_a_counted_file_keeps_its_count(rel: str) -> None:
    want, why = COUNTED[rel]
    got = _uses().get(rel, 0)
    assert got == want, (
        f"{rel}: {got} `.get(` where {want} are allowed ({why}); a new one reads through a model, "
        "and a count that fell is lowered here"
    )


def test_every_listed_path_exists() -> None:
    for key in [*NOT_RECORD_DATA, *COUNTED]:
        assert (PACKAGE / key).exists(), f"{key} is listed in test_record_reads but is not in src/quantverdict"


def test_a_sidecar_gives_the_last_attempts_window() -> None:
    # a short first window (0.4 s) ran again with more requests: the second attempt, ended at 1005.5 after 2.5 s
    side = PointSidecar.model_validate(
        {
            "seed": 3,
            "attempts": [
                {"end_unix_s": 1001.0, "duration_s": 0.4, "seed": 3},
                {"end_unix_s": 1005.5, "duration_s": 2.5},
            ],
        }
    )
    assert side.window_unix_s() == (1003.0, 1005.5)
    assert (
        PointSidecar.model_validate({"attempts": [{"end_unix_s": 1001.0, "duration_s": 0.0}]}).window_unix_s() is None
    )
    assert PointSidecar.model_validate({"seed": 3}).window_unix_s() is None


def test_the_serve_dtype_and_the_headline_read_from_the_record() -> None:
    serve = {"dtype": "bfloat16", "chosen_by": "cpu", "why": "AVX-512 BF16"}
    env = Environment.model_validate({"dtypes": {"serve": serve}})
    assert env.dtype_of("serve") == serve
    assert env.dtype_of("evaluate") is None
    assert Environment().dtype_of("serve") is None
    rec = JobRecord.view({"config": {"eval": {"headline": {"wikitext": "word_perplexity"}}}})
    assert rec.headline() == {"wikitext": "word_perplexity"}
    assert JobRecord.view({"config": {"eval": {}}}).headline() == {}


def test_the_config_snapshot_reads_an_older_config() -> None:
    # an older config: no kv section, bench.server null, a key the view does not name (passes unread)
    old = {"bench": {"mode": "rate", "rates": [1, "inf"], "server": None, "dropped_key": 3}, "kv": None}
    cfg = JobRecord.view({"config": old}).cfg
    assert cfg.bench.mode == "rate" and cfg.bench.rates == [1, math.inf]
    assert cfg.bench.server.dtype is None and cfg.kv.name is None and cfg.model.dtype is None
    assert cfg.bench.server.tensor_parallel_size is None and cfg.baseline_scheme is None
    with pytest.raises(pydantic.ValidationError):
        assert JobRecord.view({"config": {"bench": {"input_len": "many"}}}).cfg  # the read validates
