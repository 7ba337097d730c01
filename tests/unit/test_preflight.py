"""Before any work: the model source is reachable and, on CPU, the model fits the machine (orchestrate.preflight)."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from hub_cache import write_tiny_folder
from quantverdict.config.compose import compose
from quantverdict.config.schema import ConfigError
from quantverdict.orchestrate.preflight import (
    GIB,
    MachineResources,
    check,
    cpu_model_name,
    fit_problems,
    source_problems,
    synthetic_parameters,
)
from quantverdict.results.record import host_environment


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_hub_is_refused_fast_naming_the_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # a real request to an endpoint where nothing listens: refused at once, no retries
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    for var in ("HF_HUB_OFFLINE", "HF_HOME", "HF_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    model = compose(["model=qwen3.5-9b"]).model
    t0 = time.perf_counter()
    problems, params, found = source_problems(model, tmp_path)
    assert time.perf_counter() - t0 < 10
    assert params is None and found is None and len(problems) == 1
    assert "model.hf_id='Qwen/Qwen3.5-9B'" in problems[0] and "not reachable" in problems[0]
    assert "model.source=local" in problems[0] and "model=smollm2-135m" in problems[0]


def test_offline_hub_is_refused_without_a_request(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")  # a request would say 'not reachable'
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HOME", raising=False)
    problems, _, _ = source_problems(compose(["model=qwen3.5-9b"]).model, tmp_path)
    assert "HF_HUB_OFFLINE is set" in problems[0] and "not reachable" not in problems[0]


def test_materialized_model_needs_no_source(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HOME", raising=False)
    for name in ("smollm2-135m", "qwen3.5-9b"):
        entry = tmp_path / "models" / name
        entry.mkdir(parents=True)
        (entry / "quantverdict_model.json").write_text('{"num_parameters": 9000000000}')
    assert source_problems(compose([]).model, tmp_path) == ([], 9_000_000_000, None)
    # a hub model's revision is resolved all the same (a branch may have moved): offline, from the hub cache
    problems, _, _ = source_problems(compose(["model=qwen3.5-9b"]).model, tmp_path)
    assert "HF_HUB_OFFLINE" in problems[0] and str(tmp_path / "hf") in problems[0]


def test_local_folder_without_config_or_weights(tmp_path: Path) -> None:
    model = compose(["model=qwen3.5-9b", "model.source=local", f"model.path={tmp_path}"]).model
    problems, _, _ = source_problems(model, tmp_path / "cache")
    assert "no config.json" in problems[0] and "model.path=" in problems[0]
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"\0" * 8)
    problems, _, _ = source_problems(model, tmp_path / "cache")
    assert "has no *.safetensors weights" in problems[0] and f"model.path={str(tmp_path)!r}" in problems[0]


def test_local_folder_is_sized_from_its_weights(tmp_path: Path) -> None:
    # hub_cache.write_tiny_folder: 520 bf16 elements = 1040 bytes of data (+ header): 16-bit, so about 520
    folder = write_tiny_folder(tmp_path / "tiny")
    model = compose(["model=qwen3.5-9b", "model.source=local", f"model.path={folder}"]).model
    problems, params, found = source_problems(model, tmp_path / "cache")
    assert problems == [] and found is None
    header = (folder / "model.safetensors").stat().st_size - 1040
    assert params == (1040 + header) // 2 and 520 <= params < 520 + header


def test_synthetic_parameters_by_hand() -> None:
    # Llama-3.1-8B: h 4096, i 14336, 32 layers, 32 q / 8 kv heads of 128, vocab 128256, untied:
    # per layer 4096*4096 + 2*4096*1024 + 4096*4096 + 3*4096*14336 = 16,777,216 + 8,388,608 + 16,777,216
    # + 176,160,768 = 218,103,808; x 32 = 6,979,321,856; embeddings 2 x 128256 x 4096 = 1,050,673,152
    cfg = {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "vocab_size": 128256,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
    }
    assert synthetic_parameters(cfg) == 8_029_995_008
    assert synthetic_parameters({"hidden_size": 8}) is None


def test_fit_on_cpu(tmp_path: Path) -> None:
    # 9e9 parameters: 9e9 x 4 B x 1.25 = 45e9 B = 41.9 GiB of memory; disk 9e9 x 4 B = 33.5 GiB
    small = MachineResources(mem_available_bytes=23 * GIB, disk_free_bytes=80 * GIB)
    problems = fit_problems(9_000_000_000, "cpu", small, tmp_path, materialized=False)
    assert len(problems) == 1 and "41.9 GiB of memory" in problems[0] and "23.0 GiB available" in problems[0]
    assert "env=gpu" in problems[0]
    tight_disk = MachineResources(mem_available_bytes=100 * GIB, disk_free_bytes=30 * GIB)
    assert "33.5 GiB of disk" in fit_problems(9_000_000_000, "cpu", tight_disk, tmp_path, materialized=False)[0]
    # once materialized only a checkpoint is written: 9e9 x 2 B = 16.8 GiB fits 30 GiB
    assert fit_problems(9_000_000_000, "cpu", tight_disk, tmp_path, materialized=True) == []
    # SmolLM2-135M: 134,515,008 x 5 B = 0.63 GiB fits; nothing is checked on cuda
    assert fit_problems(134_515_008, "cpu", small, tmp_path, materialized=False) == []
    assert fit_problems(9_000_000_000, "cuda", small, tmp_path, materialized=False) == []


def test_check_raises_one_error_with_every_problem(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HOME", raising=False)
    cfg = compose(["model=qwen3.5-9b", f"paths.cache_root={tmp_path}"])
    with pytest.raises(ConfigError, match="this machine cannot run the job"):
        check(cfg)


def test_machine_resources_read_memavailable(tmp_path: Path) -> None:
    # the kernel's MemAvailable (kB in /proc/meminfo), read here by hand; memory moves between the reads
    kib = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemAvailable:")
    )
    here = MachineResources.here(tmp_path / "not" / "yet")
    assert here.mem_available_bytes is not None
    assert abs(here.mem_available_bytes - kib * 1024) < 512 * 2**20
    assert here.disk_free_bytes is not None and here.disk_free_bytes > 0  # measured at the nearest existing folder


def test_the_record_names_this_cpu() -> None:
    # /proc/cpuinfo's model name, checked against lscpu's (util-linux reads the same field on x86), and
    # environment.host carries it only when given (older records have no cpu_model)
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    expected = next(line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name"))
    assert cpu_model_name() == expected
    assert host_environment(expected)["cpu_model"] == expected
    assert "cpu_model" not in host_environment()
