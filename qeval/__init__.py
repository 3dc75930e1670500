"""qeval: quantization quality-vs-memory evaluation for large language models."""

__version__ = "0.1.0"
