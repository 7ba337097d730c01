"""Pure measurement (standard library and numpy only; imported by the orchestrator and by child stages):
sweep results and their aggregation, the memory model, vLLM log parsing, perplexity, roofline, file integrity."""
