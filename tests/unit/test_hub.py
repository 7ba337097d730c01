"""Hub models (model.source=hf): the revision resolved to a commit in preflight, by the hub or from a cache
filled by hand in huggingface_hub's layout (real huggingface_hub, HF_HUB_OFFLINE=1, no request).

The hub's refusals (a missing or gated repo, a revision that does not exist) need the network: they are
raised here as huggingface_hub's own exception classes, with real httpx responses, from the lookup function
:func:`quantverdict.orchestrate.hub.resolve` takes, and the messages are checked.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from huggingface_hub.errors import (
    DisabledRepoError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from hub_cache import TINY_PARAMETERS, fill_hub_cache, write_tiny_folder
from quantverdict.config.compose import compose
from quantverdict.config.schema import ConfigError
from quantverdict.orchestrate import hub, preflight
from quantverdict.orchestrate.caches import hub_keys
from quantverdict.orchestrate.hub import HubUnavailable, hub_cache_dir, resolve

HF_ID = "qv-test/tiny-llama"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TAGGED = "fedcba9876543210fedcba9876543210fedcba98"
ROOMY = preflight.MachineResources(mem_available_bytes=2**40, disk_free_bytes=2**40)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """HF_HUB_OFFLINE=1 and no user hub cache: the cache is <paths.cache_root>/hf."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for var in ("HF_HOME", "HF_HUB_CACHE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "HF_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)


def _filled(cache_root: Path, tmp_path: Path) -> Path:
    folder = write_tiny_folder(tmp_path / "tiny")
    return fill_hub_cache(cache_root / "hf", HF_ID, folder, COMMIT)


def _cfg(cache_root: Path, *more: str):  # type: ignore[no-untyped-def]
    return compose(["model=qwen3.5-9b", f"model.hf_id={HF_ID}", f"paths.cache_root={cache_root}", *more])


def test_offline_preflight_resolves_the_commit_of_a_prefilled_cache(offline: None, tmp_path: Path) -> None:
    cache_root = tmp_path / "cache"
    snapshot = _filled(cache_root, tmp_path)
    found = preflight.check(_cfg(cache_root), ROOMY)
    assert found.hub is not None
    assert found.hub.commit == COMMIT and found.hub.hf_id == HF_ID and found.hub.revision == "main"
    assert found.hub.offline and found.hub.cache_dir == str(cache_root / "hf")
    # 32x8 + 32x8 + 8 elements in the safetensors header (TINY_TENSORS)
    assert found.params == TINY_PARAMETERS == 520
    assert hub.cached_snapshot(HF_ID, "main", cache_root / "hf") == snapshot
    # the child's spec carries the commit, not the branch name
    assert found.hub.spec() == {
        "hf_id": HF_ID,
        "revision": "main",
        "commit": COMMIT,
        "cache_dir": str(cache_root / "hf"),
        "offline": True,
        "num_parameters": 520,
    }


def test_offline_a_tag_and_a_commit_resolve_from_the_cache(offline: None, tmp_path: Path) -> None:
    cache_root = tmp_path / "cache"
    _filled(cache_root, tmp_path)
    fill_hub_cache(cache_root / "hf", HF_ID, tmp_path / "tiny", TAGGED, refs=("v1.0",))
    assert resolve(HF_ID, "v1.0", cache_root).commit == TAGGED
    assert resolve(HF_ID, "main", cache_root).commit == COMMIT
    assert resolve(HF_ID, TAGGED, cache_root).commit == TAGGED  # a commit needs no ref


def test_offline_and_not_cached_names_the_id_the_cache_folder_and_hf_hub_offline(offline: None, tmp_path: Path) -> None:
    cache_root = tmp_path / "cache"
    with pytest.raises(ConfigError) as err:
        preflight.check(_cfg(cache_root), ROOMY)
    msg = str(err.value)
    assert "this machine cannot run the job" in msg
    assert f"model.hf_id='{HF_ID}'" in msg and str(cache_root / "hf") in msg and "HF_HUB_OFFLINE" in msg
    assert "model.source=local" in msg  # what to do instead
    # the repo is cached, the branch asked for is not
    _filled(cache_root, tmp_path)
    with pytest.raises(HubUnavailable) as err2:
        resolve(HF_ID, "dev", cache_root)
    assert "model.revision='dev'" in str(err2.value) and "HF_HUB_OFFLINE is set" in str(err2.value)


def test_offline_snapshot_without_weights_is_refused(offline: None, tmp_path: Path) -> None:
    cache_root = tmp_path / "cache"
    folder = write_tiny_folder(tmp_path / "tiny")
    (folder / "model.safetensors").unlink()
    fill_hub_cache(cache_root / "hf", HF_ID, folder, COMMIT)
    with pytest.raises(HubUnavailable, match=r"has no \*\.safetensors weights, and HF_HUB_OFFLINE is set"):
        resolve(HF_ID, "main", cache_root)


def test_the_hub_cache_is_the_projects_unless_the_user_names_one(tmp_path: Path) -> None:
    assert hub_cache_dir(tmp_path, {}) == tmp_path / "hf"
    assert hub_cache_dir(tmp_path, {"HF_HOME": "/data/hf"}) == Path("/data/hf/hub")
    assert hub_cache_dir(tmp_path, {"HF_HOME": "/data/hf", "HF_HUB_CACHE": "/fast/hub"}) == Path("/fast/hub")


def _response(status: int) -> httpx.Response:
    return httpx.Response(status, request=httpx.Request("GET", f"https://huggingface.co/api/models/{HF_ID}"))


def _raising(exc: Exception):  # type: ignore[no-untyped-def]
    def lookup(hf_id: str, revision: str, timeout_s: float) -> tuple[str, int | None, list[str]]:
        raise exc

    return lookup


@pytest.mark.parametrize(
    "exc, expected",
    [
        (
            GatedRepoError("403 Client Error. Cannot access gated repo", response=_response(403)),
            [f"model.hf_id='{HF_ID}'", "gated", "HF_TOKEN", f"https://huggingface.co/{HF_ID}"],
        ),
        (
            RepositoryNotFoundError("401 Client Error. Repository Not Found", response=_response(401)),
            [f"model.hf_id='{HF_ID}'", "does not exist or is private/gated", "HF_TOKEN", "check the id"],
        ),
        (
            RevisionNotFoundError("404 Client Error. Revision Not Found", response=_response(404)),
            ["model.revision='nope'", f"{HF_ID} has no such branch, tag or commit"],
        ),
        (
            DisabledRepoError("403 Client Error. Access to this resource is disabled.", response=_response(403)),
            [f"model.hf_id='{HF_ID}'", "HTTP 403", "HF_TOKEN"],
        ),
    ],
)
def test_the_hubs_refusals_are_config_errors_naming_the_key(
    online: None, tmp_path: Path, exc: Exception, expected: list[str]
) -> None:
    _filled(tmp_path / "cache", tmp_path)  # a cached copy does not hide a refusal
    with pytest.raises(ConfigError) as err:
        resolve(HF_ID, "nope", tmp_path / "cache", lookup=_raising(exc))
    assert not isinstance(err.value, HubUnavailable)
    for part in expected:
        assert part in str(err.value)


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ConnectError("[Errno 111] Connection refused"),
        httpx.ReadTimeout("timed out"),
        HfHubHTTPError("503 Server Error", response=_response(503)),
    ],
)
def test_a_hub_that_does_not_answer_falls_back_to_the_cache(online: None, tmp_path: Path, exc: Exception) -> None:
    cache_root = tmp_path / "cache"
    with pytest.raises(HubUnavailable) as err:
        resolve(HF_ID, "main", cache_root, lookup=_raising(exc))
    assert "the hub is not reachable" in str(err.value) and str(cache_root / "hf") in str(err.value)
    _filled(cache_root, tmp_path)
    found = resolve(HF_ID, "main", cache_root, lookup=_raising(exc))
    assert found.commit == COMMIT and found.offline


def test_the_hubs_answer_is_recorded_for_a_later_offline_run(
    online: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache_root = tmp_path / "cache"

    def lookup(hf_id: str, revision: str, timeout_s: float) -> tuple[str, int | None, list[str]]:
        assert (hf_id, revision) == (HF_ID, "main")
        return COMMIT, 9_000_000_000, ["config.json", "model-00001-of-00002.safetensors", "tokenizer.json"]

    found = resolve(HF_ID, "main", cache_root, lookup=lookup)
    assert (found.commit, found.num_parameters, found.offline) == (COMMIT, 9_000_000_000, False)
    ref = cache_root / "hf" / "models--qv-test--tiny-llama" / "refs" / "main"
    assert ref.read_text() == COMMIT
    # the download (here: the snapshot written by hand, without refs) then serves offline by that ref
    fill_hub_cache(cache_root / "hf", HF_ID, write_tiny_folder(tmp_path / "tiny"), COMMIT, refs=())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve(HF_ID, "main", cache_root).commit == COMMIT


@pytest.mark.parametrize(
    "files", [["config.json", "pytorch_model.bin"], ["config.json", "original/model.safetensors", "model.gguf"]]
)
def test_a_commit_without_top_level_safetensors_is_refused(online: None, tmp_path: Path, files: list[str]) -> None:
    with pytest.raises(ConfigError, match=r"has no \*\.safetensors weights at its top level"):
        resolve(HF_ID, "main", tmp_path, lookup=lambda *_: (COMMIT, None, files))


def test_an_unreachable_hub_is_asked_for_real_and_refused_fast(
    online: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # huggingface_hub's own client against an endpoint where nothing listens (HF_ENDPOINT read per call)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    problems, params, found = preflight.source_problems(_cfg(tmp_path).model, tmp_path)
    assert params is None and found is None and len(problems) == 1
    assert f"model.hf_id='{HF_ID}'" in problems[0] and "not reachable" in problems[0]
    assert f"127.0.0.1:{port}" in problems[0] and "model=smollm2-135m" in problems[0]


def test_hub_models_key_their_caches_by_id_and_commit() -> None:
    assert hub_keys({"source": "hf", "hf_id": HF_ID, "revision": "main", "commit": COMMIT}) == {
        "hf_id": HF_ID,
        "commit": COMMIT,
    }
    # other sources: no new keys, so their checkpoint and KLD keys stay what they were
    assert hub_keys({"source": "pypi_gguf", "hf_id": HF_ID, "commit": COMMIT}) == {}
