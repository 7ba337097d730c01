"""Where the data comes from: no offline folder by default, one message when neither it nor the hub is there,
environment set-up without data, and eval.tasks as any lm-eval name (config side; lm-eval's own check of the names
is tests/integration/test_task_names.py)."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from quantverdict.config.compose import compose
from quantverdict.config.schema import ConfigError
from quantverdict.orchestrate import data_access, preflight
from quantverdict.processes.envs import setup_config


@pytest.fixture
def no_data_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's shell: no QV_DATA_ROOT, no offline variables (the test harness sets QV_DATA_ROOT for the others)."""
    monkeypatch.delenv("QV_DATA_ROOT", raising=False)
    for name in data_access.OFFLINE_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    data_access.hub_probe.cache_clear()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def answering_hub() -> Iterator[str]:
    """A local HTTP server that answers every request with 404 (an answer: the 'hub' is reachable)."""

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:  # noqa: N802 - the stdlib's name
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# --- the default: no offline folder -------------------------------------------------------------------------------


def test_default_offline_root_is_null(no_data_root: None) -> None:
    assert compose([]).data.offline_root is None


def test_data_root_from_the_environment(no_data_root: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("QV_DATA_ROOT", str(tmp_path))
    cfg = compose(["eval.enabled=false", "scheme=int8"])  # no offline file is read: only the folder is checked
    assert cfg.data.offline_root == str(tmp_path)


def test_empty_data_root_is_refused(no_data_root: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QV_DATA_ROOT", "")
    with pytest.raises(ConfigError, match=r"data.offline_root is empty \(QV_DATA_ROOT set to ''\?\)"):
        compose([])


def test_environment_setup_composes_without_a_data_folder(no_data_root: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # `make setup` (python -m quantverdict.processes.envs) builds the stage environments: no data is read
    cfg = setup_config([])
    assert cfg.data.offline_root is None and cfg.env.serve.requirements == "requirements/serve.txt"
    # a data folder that does not exist stops a job, not the set-up
    monkeypatch.setenv("QV_DATA_ROOT", "/nonexistent/data")
    with pytest.raises(ConfigError, match="data.offline_root='/nonexistent/data' is not a directory"):
        compose([])
    assert setup_config([]).data.offline_root is None
    assert setup_config(["data.offline_root=/elsewhere", "env.root=/tmp/qv-envs"]).env.root == "/tmp/qv-envs"


# --- neither the offline folder nor the hub: one message before any work ----------------------------------------


ONE_MESSAGE = (
    "data: eval.tasks wikitext, arc_easy, piqa, hellaswag (lm-eval's hub datasets); eval.token_perplexity (the "
    "WikiText-2 test text); scheme.calibration (wikitext wikitext-2-raw-v1 validation) would be read from the Hugging "
    "Face hub, which is not reachable here (HF_HUB_OFFLINE=1 is set), and no offline data folder is set "
    "(data.offline_root is null). Point the job at the offline data folder (wikitext-2-raw/, arc_genmc/, piqa/, "
    "hellaswag/, boolq/; see its SOURCES.md) with the environment variable QV_DATA_ROOT=/path/to/data or the "
    "override data.offline_root=/path/to/data; for other tasks give lm-eval task YAMLs over local files in a folder "
    "named by eval.include_path; or run where the hub is reachable"
)


def test_no_data_and_no_hub_is_one_message(no_data_root: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = compose(["scheme=gptq"])
    assert data_access.problems(cfg) == [ONE_MESSAGE]
    # the job's preflight raises it, once, with the machine's other checks
    with pytest.raises(ConfigError) as err:
        preflight.check(cfg, preflight.MachineResources(None, None))
    msg = str(err.value)
    assert msg.startswith("this machine cannot run the job:\n  - ") and msg.count("QV_DATA_ROOT") == 1
    assert ONE_MESSAGE in msg


def test_datasets_offline_variable_counts_too(no_data_root: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "true")
    (msg,) = data_access.problems(compose(["scheme=int8", "eval.token_perplexity.enabled=false"]))
    assert "(HF_DATASETS_OFFLINE=true is set)" in msg
    assert msg.startswith("data: eval.tasks wikitext, arc_easy, piqa, hellaswag (lm-eval's hub datasets) would be")


def test_unanswered_hub_is_probed_once_and_named(no_data_root: None, monkeypatch: pytest.MonkeyPatch) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    (msg,) = data_access.problems(compose(["eval.tasks=[gsm8k]", "eval.token_perplexity.enabled=false"]))
    assert f"which is not reachable here (no answer from {endpoint} within 5 s: " in msg
    assert msg.startswith("data: eval.tasks gsm8k (lm-eval's hub datasets) would be read")
    assert data_access.hub_probe.cache_info().misses == 1


def test_reachable_hub_is_no_problem(no_data_root: None, monkeypatch: pytest.MonkeyPatch, answering_hub: str) -> None:
    monkeypatch.setenv("HF_ENDPOINT", answering_hub)
    assert data_access.hub_unreachable() is None  # a 404 is an answer
    assert data_access.problems(compose(["scheme=gptq"])) == []


def test_what_reads_the_hub(no_data_root: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = compose(["scheme=awq"])
    cfg.data.offline_root = str(tmp_path)  # every default task and the calibration text have offline copies
    assert data_access.hub_needs(cfg) == [] and data_access.problems(cfg) == []
    cfg.eval.tasks = ["arc_easy", "gsm8k", "mmlu"]
    cfg.scheme.calibration.text_file = None  # the hub dataset, even with an offline folder
    assert data_access.hub_needs(cfg) == [
        "eval.tasks gsm8k, mmlu (lm-eval's hub datasets)",
        "scheme.calibration (wikitext wikitext-2-raw-v1 validation)",
    ]
    (msg,) = data_access.problems(cfg)
    assert f"and data.offline_root='{tmp_path}' has offline copies of wikitext, arc_easy, arc_challenge, piqa, " in msg
    # a synthetic model is neither evaluated nor calibrated (round-to-nearest stands in)
    syn = compose(["model=tiny-llama-shape", "scheme=gptq", "bench.enabled=false"])
    assert data_access.hub_needs(syn) == []


def test_own_tasks_over_local_files_need_no_hub(no_data_root: None, tmp_path: Path) -> None:
    (tmp_path / "local.yaml").write_text(
        "task: qv_local\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: /data/items.jsonl\n"
        "output_type: generate_until\ndoc_to_text: !function utils.prompt\n"
    )
    (tmp_path / "hub.yaml").write_text("task: qv_hub\ndataset_path: openai/gsm8k\ndataset_name: main\n")
    (tmp_path / "sub").mkdir()  # a variant: its dataset from the file it includes (resolved beside it)
    (tmp_path / "sub" / "variant.yaml").write_text("include: ../local.yaml\ntask: qv_local_variant\n")
    (tmp_path / "group.yaml").write_text("group: qv_group\ntask:\n  - qv_local\n  - task: qv_local_variant\n")
    (tmp_path / "mixed.yaml").write_text("group: qv_mixed\ntask: [qv_local, arc_easy]\n")
    own = data_access.include_path_tasks(tmp_path)
    assert set(own) == {"qv_local", "qv_hub", "qv_local_variant", "qv_group", "qv_mixed"}
    assert own["qv_local"]["doc_to_text"] is None  # !function is not run here
    assert own["qv_local_variant"]["dataset_path"] == "json"
    cfg = compose(
        [
            f"eval.include_path={tmp_path}",
            "eval.tasks=[qv_local,qv_local_variant,qv_group,qv_hub,qv_mixed]",
            "eval.token_perplexity.enabled=false",
        ]
    )
    assert data_access.hub_needs(cfg) == ["eval.tasks qv_hub, qv_mixed (lm-eval's hub datasets)"]


# --- eval.tasks: any lm-eval name, checked for what needs no lm-eval -----------------------------------------------


def test_any_lm_eval_task_name_composes() -> None:
    cfg = compose(["eval.tasks=[gsm8k,mmlu,arc_challenge,winogrande]"])  # eval=cpu limits wikitext and hellaswag
    assert cfg.eval.tasks == ["gsm8k", "mmlu", "arc_challenge", "winogrande"]
    assert all(type(t) is str for t in cfg.eval.tasks) and cfg.eval.include_path is None
    assert data_access.names_to_check(cfg) == ["gsm8k", "mmlu", "winogrande"]  # arc_challenge: the project's


def test_task_names_that_cannot_be_lm_eval_names(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError) as err:
        compose(
            [
                "eval.tasks=[gsm8k,'../x',gsm8k]",
                "+eval.task_limits.arc_esay=5",
                f"eval.include_path={tmp_path / 'missing'}",
            ]
        )
    msg = str(err.value)
    assert "eval.tasks[1]='../x' is not an lm-eval task name (letters, digits, '_', '-', '.', '+';" in msg
    assert "eval.tasks lists 'gsm8k' more than once; list each task once" in msg
    assert "eval.task_limits key 'arc_esay' names no task of eval.tasks (gsm8k, ../x, gsm8k) (did you mean" in msg
    assert f"eval.include_path='{tmp_path / 'missing'}' is not a directory" in msg
    with pytest.raises(ConfigError, match=r"holds no \*\.yaml task file"):
        compose([f"eval.include_path={empty}"])
