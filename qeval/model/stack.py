"""Importing transformers' model stack in a worker process, without HQQ until a setup needs it.

transformers 5.23's `cache_utils` imports `hqq.core.quantize` whenever the hqq package is
installed (qeval installs it for the 8-bit KV cache). That module decorates its classes with
`torch.compile`, which costs about a second of every worker process's start on the 2-core CI
machines (measured: a tiny-model worker 7.3-8.1 s with it, 6.0-6.5 s without), although only a setup
with `kv_cache: int8` on the transformers backend uses it. So the worker imports `cache_utils`
with hqq reported absent, and `enable_hqq_cache()` gives `cache_utils` its HQQ quantizer when an
HQQ cache is built. Everything else that asks whether hqq is installed (an HQQ checkpoint's
loader) sees the true answer: the report is changed only while `cache_utils` is imported.
"""

from __future__ import annotations

import sys


def import_model_stack() -> None:
    """Import torch and transformers' Llama modelling (the engine's stack, before a memory cap
    applies) with transformers' `cache_utils` loaded without HQQ. A no-op for `cache_utils` where
    something imported it first (then HQQ, if installed, came with it)."""
    import torch  # noqa: F401

    if "transformers.cache_utils" not in sys.modules:
        import transformers.utils as tu

        real = tu.is_hqq_available
        tu.is_hqq_available = lambda *args, **kwargs: False  # read once, by `cache_utils`' import
        try:
            import transformers.cache_utils as cu
        finally:
            tu.is_hqq_available = real
        cu.is_hqq_available = real  # HQQQuantizedLayer's own check, at construction
    import transformers.models.llama.modeling_llama  # noqa: F401


def enable_hqq_cache() -> None:
    """Give transformers' `cache_utils` the HQQ quantizer its `HQQQuantizedLayer` uses (the
    module-level name its import would have bound, had hqq been reported installed)."""
    import transformers.cache_utils as cu

    if not hasattr(cu, "HQQQuantizer") and cu.is_hqq_available():
        from hqq.core.quantize import Quantizer

        cu.HQQQuantizer = Quantizer
