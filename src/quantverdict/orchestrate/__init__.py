"""The orchestrator (the project's own venv): one job's stage flow (job), finished-job reuse (resume), the cache
entries jobs share (caches), what the machine can run (hardware, preflight) and the grid's end (hydra_callbacks)."""
