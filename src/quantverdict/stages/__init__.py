"""Pipeline stages.

Stages that import llm-compressor, transformers or vLLM (``materialize``, ``quantize``,
``evaluate``) run as child processes in their own environment via :mod:`.runner`; only JSON specs
and JSON results cross that boundary. Those modules import nothing from the orchestrator side
(no hydra, no mlflow). ``serve`` and ``memory`` run in the orchestrator and start external
programs (``vllm serve``, ``vllm bench serve``) rather than importing them.
"""
