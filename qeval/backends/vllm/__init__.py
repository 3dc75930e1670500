"""The vLLM backend: the offline engine in the worker process, and its translation layer."""
