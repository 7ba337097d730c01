"""Serving (orchestrator side): the vLLM server's lifecycle and the benchmark client driven against it."""
