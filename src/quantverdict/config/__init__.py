"""Configuration (orchestrator): the schema of every Hydra config group, its validation, the scheme
registry, command-line overrides and the Hydra wiring. Runs before any work starts."""
