"""`qeval quantize`: llm-compressor checkpoints for the vllm backend, made in their own environment."""
