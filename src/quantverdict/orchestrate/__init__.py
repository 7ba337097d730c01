"""The orchestrator (the project's own venv): one job's stage flow, resume and caches, what the machine
can run (CPU/GPU capabilities, preflight), stage environments and the child processes started in them."""
