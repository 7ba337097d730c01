"""quantverdict: which quantization scheme to deploy, proven with memory, accuracy and speed."""

__version__ = "0.1.0"
RECORD_SCHEMA_VERSION = 3  # older versions are read through quantverdict.results.migrate
