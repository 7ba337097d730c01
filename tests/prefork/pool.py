"""Shim stage environments whose children are forked from pre-imported interpreters (the integration tier's pool).

The integration tier starts a few hundred stage children (vLLM servers and sweep clients, evaluations,
quantizations); each would import vLLM, lm-eval or llm-compressor afresh, 10-20 s of CPU apiece on a 2-core host.
:func:`start` builds, beside the real environments of ``env.root``, a shim root holding one folder per environment
(``QV_ENV_ROOT`` for the commands the tests start): every file a link to the real one but ``bin/python*``, which is
:mod:`prefork.launcher`; and it starts one :mod:`prefork.zygote` per environment. The product runs unchanged: it
finds a ready environment under ``QV_ENV_ROOT`` and starts ``bin/python -m quantverdict.children.X``; the launcher
has the zygote fork it (or runs the real interpreter: anything else, or before the zygote is ready).

vLLM's engine core is still spawned afresh by the forked server (vLLM's CPU platform spawns it), so each server
start still imports it once.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from quantverdict.processes.envs import StageEnv

HERE = Path(__file__).resolve().parent
# imported once per zygote: what the environment's children import (a module the environment lacks is skipped)
PRELOAD = {
    "serve": [
        "torch",
        "transformers",
        "vllm.entrypoints.openai.api_server",
        "vllm.entrypoints.cli.main",
        "vllm.benchmarks.serve",
        "lm_eval",
        "lm_eval.evaluator",
        "lm_eval.models.huggingface",
    ],
    "quantize": [
        "torch",
        "transformers",
        "compressed_tensors",
        "llmcompressor",
        "llmcompressor.modifiers.quantization",
        "llmcompressor.modifiers.awq",
        "llmcompressor.modifiers.smoothquant",
        "gguf",
    ],
}
LAUNCHER = """#!{interpreter} -SE
import sys
sys.path.insert(0, {here!r})
from launcher import main
main({real!r}, {sock!r})
"""


class Pool:
    """The shim root and the zygotes started for it; :meth:`close` ends them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sockets: Path | None = None
        self.zygotes: list[subprocess.Popen[bytes]] = []

    def close(self) -> None:
        for proc in self.zygotes:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # its workers follow (their parent-death signal)
            except ProcessLookupError:
                pass
            proc.wait()
        if self.sockets is not None:
            shutil.rmtree(self.sockets, ignore_errors=True)


def shim(real: Path, root: Path, sock: Path) -> Path:
    """The shim folder of the real environment ``real`` under ``root`` (same name): links to every entry but
    ``bin/python*``, launchers that ask the zygote listening on ``sock``. Returns the shim folder."""
    target = root / real.name
    (target / "bin").mkdir(parents=True)
    for entry in real.iterdir():
        if entry.name != "bin":
            (target / entry.name).symlink_to(entry)
    interpreter = os.path.realpath(real / "bin" / "python")
    for entry in (real / "bin").iterdir():
        if entry.name.startswith("python"):
            script = target / "bin" / entry.name
            script.write_text(LAUNCHER.format(interpreter=interpreter, here=str(HERE), real=str(entry), sock=str(sock)))
            script.chmod(0o755)
        else:
            (target / "bin" / entry.name).symlink_to(entry)
    return target


def start(stage_envs: dict[str, StageEnv], root: Path, log_dir: Path) -> Pool:
    """Shims of the real ``stage_envs`` (venvs: ``python`` is ``<env>/bin/python``) under ``root``, and a zygote
    each, started in the background (a launcher runs the real interpreter until its zygote listens)."""
    pool = Pool(root)
    log_dir.mkdir(parents=True, exist_ok=True)
    # the sockets in a short folder of their own: a Unix socket's path holds at most 107 bytes
    pool.sockets = Path(tempfile.mkdtemp(prefix="qv-prefork-"))
    for name, env in stage_envs.items():
        real = Path(env.python).parent.parent
        sock = pool.sockets / f"{name}.sock"
        shim(real, root, sock)
        log = open(log_dir / f"zygote-{name}.log", "wb")  # noqa: SIM115 - the zygote's own, closed when this process ends
        pool.zygotes.append(
            subprocess.Popen(
                [env.python, str(HERE / "zygote.py"), str(sock), *PRELOAD.get(name, [])],
                env={**os.environ, **env.env, "PYTHONUNBUFFERED": "1"},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
    return pool
