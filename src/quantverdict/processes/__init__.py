"""Processes (orchestrator side): the stage environments (venvs or prebuilt interpreters) and the child
processes started in them, each in its own process group, streamed to a log and never left behind."""
