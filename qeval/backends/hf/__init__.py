"""The transformers backend: one setup per worker process, batched scoring on CPU or CUDA."""
