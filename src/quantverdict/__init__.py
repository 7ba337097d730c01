"""quantverdict: which quantization scheme to deploy, proven with memory, accuracy and speed."""

__version__ = "0.1.0"
RECORD_SCHEMA_VERSION = 2  # 1 and 2 share one layout (quantverdict.results.record)
