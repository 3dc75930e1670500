"""The openai backend: an OpenAI-compatible server (vLLM, SGLang, ...) attached to or launched per setup."""
