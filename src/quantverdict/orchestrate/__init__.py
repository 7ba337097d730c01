"""The orchestrator (the project's own venv): one job's stage flow, resume and caches, what the machine can run
(preflight, the GPU's facts) and the grid's end-of-run callback."""
