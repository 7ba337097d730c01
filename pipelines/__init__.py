"""Command-line entry points: ``python -m pipelines.run`` (one job or a Hydra multirun grid)."""
