"""Serving (orchestrator side): the vLLM server process (server), a job's server from start to stop with the
record filled in (lifecycle), the benchmark client driven against it (benchmark), the sweep's summaries (speed)."""
