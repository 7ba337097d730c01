"""Everything that runs inside a stage environment (quantize or serve), started as
``python -m quantverdict.children.<name> SPEC_JSON RESULT_JSON``. These modules import the standard library,
the stage environment's own packages and :mod:`quantverdict.measure`, never the orchestrator (import contract
``children`` in pyproject.toml)."""
