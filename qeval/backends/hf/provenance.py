"""What transformers actually ran for a setup (docs/backends.md, "Kernel provenance"): each linear
module type with its weight's storage (quanto's qtype, a torchao tensor subclass, bitsandbytes'
module, or the dtype), the attention implementation, and the KV cache's layer classes."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from qeval.backends.hf.kv_cache import cache_layer_classes
from qeval.config.setups import Setup


def model_provenance(model: Any, setup: Setup) -> dict[str, Any]:
    """The provenance block of a loaded (and quantized) transformers model."""
    linear: Counter[str] = Counter(_label(m) for m in model.modules() if isinstance(m, torch.nn.Linear))
    layers = cache_layer_classes(model.config, setup)
    kv = setup.kv_cache if setup.quantizes_kv else f"the model's dtype ({str(model.dtype).removeprefix('torch.')})"
    return {
        "linear": dict(linear),
        "attention": [str(getattr(model.config, "_attn_implementation", None) or "unknown")],
        "kv_cache": f"{kv}: " + ", ".join(f"{n} x {c}" for c, n in layers.items()),
        "kv_scales": None,
        "source": "the loaded model's modules (transformers)",
        "fallbacks": [],
    }


def _label(module: torch.nn.Module) -> str:
    qtype = getattr(module, "weight_qtype", None)
    if qtype is not None:  # optimum-quanto's QLinear
        return f"{type(module).__name__} ({getattr(qtype, 'name', qtype)})"
    weight = getattr(module, "weight", None)
    data = getattr(weight, "data", weight)
    if data is not None and type(data) is not torch.Tensor:  # a tensor subclass: torchao, bitsandbytes
        return f"{type(module).__name__} ({type(data).__name__})"
    dtype = str(getattr(data, "dtype", "unknown")).removeprefix("torch.")
    return f"{type(module).__name__} ({dtype})"
