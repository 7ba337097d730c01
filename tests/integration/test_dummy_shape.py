"""``bench.server.load_format=dummy``: a synthetic model served from its shape alone (no weight files).

``tiny-llama-shape`` in w8a8 (int8 W8A8, round-to-nearest for random weights) on this CPU: the job writes a
shape folder (``config.json`` with the scheme's compressed-tensors ``quantization_config``, the borrowed
tokenizer, no ``*.safetensors``), vLLM serves it with ``--load-format dummy`` and the sweep runs. Expected by
hand: the quantization_config is the one llm-compressor wrote for the proxy (8-bit int weights and
activations, ``lm_head`` ignored), the record says the weights were dummy and that the checkpoint was not
measured, and vLLM picked an int8 W8A8 kernel for the shape, i.e. it read the quantization config. The host
sampler ran beside the sweep: every point has its host window (client and server CPU, vLLM's running and waiting
requests).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from clihelp import run_cli
from quantverdict.results.record import find_records, load

# the host sampler's roles as vLLM lays out its processes by default (API server, engine core, worker)
# serial: the host sampler's samples per 250 ms window fall short when another test's processes hold the cores
pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.usefixtures("worker_process")]


def test_shape_is_served_with_dummy_weights(tmp_path: Path, stage_envs: dict, embedded_model: dict) -> None:
    proc = run_cli(
        tmp_path,
        "model=tiny-llama-shape",
        "scheme=w8a8",
        "bench.server.load_format=dummy",
        "bench.server.port=0",
        "bench.num_prompts=2",
        "bench.warmup_prompts=1",
        "bench.input_len=32",
        "bench.output_len=8",
        "bench.rates=[inf]",
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (rec,) = map(load, find_records(tmp_path / "runs"))
    assert rec["status"] == "ok", rec.get("error")
    shape = Path(rec["checkpoint"]["path"])
    assert rec["checkpoint"]["load_format"] == "dummy" and rec["model"]["load_format"] == "dummy"
    assert not list(shape.glob("*.safetensors")) and (shape / "tokenizer.json").is_file()
    config = json.loads((shape / "config.json").read_text())
    assert config["hidden_size"] == 256 and config["num_hidden_layers"] == 2  # the model's own dims, not the proxy's
    qc = config["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and "lm_head" in qc["ignore"]
    group = next(iter(qc["config_groups"].values()))
    assert group["weights"]["num_bits"] == 8 and group["weights"]["type"] == "int"
    assert group["input_activations"]["num_bits"] == 8
    assert any("load_format=dummy" in n for n in rec["notes"])
    assert rec["memory"]["checkpoint"]["not_measured"].startswith("not measured: bench.server.load_format=dummy")
    assert rec["memory"]["checkpoint"]["predicted_weight_bytes"] > 0
    log = (Path(rec["job"]["output_dir"]) / "vllm_server.log").read_text(errors="replace")
    assert "load_format=dummy" in log or "'load_format': 'dummy'" in log or "load_format='dummy'" in log
    assert rec["memory"]["server"]["kernels"], "vLLM named no quantized kernel: the quantization_config was not read"
    assert rec["speed"]["points"] and all(p["output_tok_s"] > 0 for p in rec["speed"]["points"])
    _host_windows_are_sane(rec)


def _host_windows_are_sane(rec: dict) -> None:
    """The host sampler ran beside the CPU sweep (conf/bench/cpu.yaml: every 250 ms) and each point has its window:
    the sweep client and the server worked in it, the server's processes by role, and vLLM never ran more requests
    than the point sent or bench.server.max_num_seqs (16) allows."""
    sampling = rec["speed"]["host_sampling"]
    assert (sampling["source"], sampling["interval_ms"], sampling["cores"]) == ("psutil", 250, os.cpu_count())
    assert sampling["metrics_path"].startswith("/metrics/?name%5B%5D=") and sampling["metrics_errors"] == 0
    assert Path(sampling["file"]).is_file() and Path(sampling["file"]).parent.name == "bench"
    assert sampling["samples"] > 0 and 0 < sampling["sampler_cpu_s"] < sampling["sampler_wall_s"]
    for p in rec["speed"]["points"]:
        host = p["host"]
        window = host["window_unix_s"][1] - host["window_unix_s"][0]
        assert host["samples"] >= max(1, int(window / 0.25) - 1), (host["samples"], window)
        assert host["cores"] == os.cpu_count()
        assert host["client_cpu_pct_mean"] > 0 and host["server_cpu_pct_mean"] > 0
        assert set(host["server_cpu_pct_median_by_role"]) == {"api_server", "engine_core", "worker", "other"}
        assert host["server_cpu_pct_p95_by_role"]["worker"] > 0  # the model runs in vLLM's CPU worker
        assert 0 < host["host_cpu_pct_median"] <= 100
        assert 1 <= host["running_requests_max"] <= min(16, p["num_prompts"])
        assert host["waiting_requests_min"] >= 0 and 0 <= host["kv_cache_usage_pct_max"] <= 100
        assert "gpu_idle" not in host and "gpu" not in p  # no GPU: no idle/busy split
