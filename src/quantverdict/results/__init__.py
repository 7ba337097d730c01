"""Results (orchestrator and review): the versioned per-job record, MLflow tracking, the per-scheme table and
the join of a scheme's record with its baseline."""
