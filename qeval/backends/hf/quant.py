"""Translate a Setup into transformers-side quantization: weight quantizers and KV caches."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch

from qeval.backends.hf.support import KV_BACKENDS
from qeval.config.setups import Setup


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def library_versions(setup: Setup) -> dict[str, str]:
    """The libraries that produced this setup's numbers (recorded in results.json)."""
    libs = {"torch": _version("torch"), "transformers": _version("transformers")}
    if (setup.quantizes_weights and setup.method == "rtn") or setup.kv_cache in ("int4", "int2"):
        libs["optimum-quanto"] = _version("optimum-quanto")
    if setup.method == "torchao":
        libs["torchao"] = _version("torchao")
    if setup.method == "bnb":
        libs["bitsandbytes"] = _version("bitsandbytes")
    if setup.kv_cache == "int8":
        libs["hqq"] = _version("hqq")
    return libs


def load_kwargs(setup: Setup, dtype: torch.dtype, device: str) -> dict[str, Any]:
    """Extra `from_pretrained` arguments: bitsandbytes quantizes while loading (NF4 for int4,
    LLM.int8 for int8), and places the model itself (a bnb model refuses `.to()`)."""
    if setup.method != "bnb" or setup.weights not in ("int8", "int4"):
        return {}
    from transformers import BitsAndBytesConfig

    config = (BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype)
              if setup.weights == "int4" else BitsAndBytesConfig(load_in_8bit=True))
    return {"quantization_config": config, "device_map": device}


def quantize_weights(model: Any, setup: Setup) -> dict[str, Any]:
    """Quantize the decoder's linear layers in place (embeddings and lm_head stay 16-bit,
    as in transformers' own quanto integration). Returns what was done, for the results."""
    if setup.weights not in ("int8", "int4"):  # fp8 weights are vLLM's, refused by hf_support
        return {"library": None}
    if setup.method == "bnb":  # quantized while loading (load_kwargs)
        scheme = "NF4, blocks of 64, compute in the model dtype" if setup.weights == "int4" else "LLM.int8()"
        return {"library": f"bitsandbytes {_version('bitsandbytes')}", "scheme": scheme}
    if setup.method == "torchao":
        return _torchao_int8(model)
    from optimum.quanto import freeze, qint4, qint8, quantize

    quantize(model, weights=qint8 if setup.weights == "int8" else qint4, exclude=["lm_head"])
    groups: set[int | None] = set()
    if setup.weights == "int4" and setup.group_size:
        for module in model.modules():
            if getattr(module, "weight_qtype", None) is qint4:
                in_f = module.weight.shape[1]
                # group_size must divide the row; a row no longer than it is per-channel
                divides = in_f > setup.group_size and in_f % setup.group_size == 0
                module.weight_group_size = setup.group_size if divides else None
    for module in model.modules():
        if getattr(module, "weight_qtype", None) is not None:
            groups.add(module.weight_group_size)
    freeze(model)
    scheme = "per-channel symmetric" if setup.weights == "int8" else "group-wise asymmetric (min-max)"
    return {
        "library": f"optimum-quanto {_version('optimum-quanto')}",
        "scheme": f"round-to-nearest, {scheme}",
        "group_sizes": sorted({"per-channel" if g is None else str(g) for g in groups}),
    }


def _torchao_int8(model: Any) -> dict[str, Any]:
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    quantize_(model.model, Int8WeightOnlyConfig())
    return {"library": f"torchao {_version('torchao')}", "scheme": "int8 weight-only, per-channel"}


def new_cache(config: Any, setup: Setup) -> Any:
    """A fresh cache for one batch: DynamicCache, or QuantizedCache for a quantized KV setup.

    `residual_length` is the count of recent tokens QuantizedCache keeps in full precision;
    with its default (128) every short prompt would stay unquantized, so qeval defaults it
    to 1. The group defaults to one head vector (head_dim), so no group straddles two
    tokens: a sample's score then cannot depend on its neighbours' padding.
    """
    from transformers import DynamicCache
    from transformers.cache_utils import QuantizedCache

    if not setup.quantizes_kv:
        return DynamicCache(config=config)
    backend, _, bits = KV_BACKENDS[setup.kv_cache]
    if backend == "fp8":
        return QuantizedCache(backend="fp8", config=config)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return QuantizedCache(
        backend=backend,
        config=config,
        nbits=bits,
        axis_key=0,
        axis_value=0,
        q_group_size=setup.kv_group_size or head_dim,
        residual_length=setup.kv_residual_length,
    )


def round_trip_cache(config: Any, setup: Setup) -> Any:
    """A cache for scoring whole texts in one forward pass under a quantized KV cache.

    Each layer passes every incoming K/V through the same quantizer QuantizedCache uses
    (quanto's, or transformers' FP8 one) and back before attention, so every token attends
    to quantized K/V of all tokens before it, as in token-by-token decoding, at the cost
    of one pass instead of one per token. With one group per head vector the round trip
    of a token does not depend on other tokens, so this equals decoding with
    `new_cache(...)` except that a token also sees its *own* K/V quantized (decoding
    attends to it fresh): slightly stricter, never more lenient.
    """
    from transformers.cache_utils import Cache, DynamicLayer

    template = new_cache(config, setup)

    class _RoundTripLayer(DynamicLayer):
        def __init__(self, quantizer: Any) -> None:
            super().__init__()
            self._q = quantizer
            self._fp8_scale: dict[str, Any] = {}

        def _round_trip(self, t: torch.Tensor, axis: int, which: str) -> torch.Tensor:
            q = self._q
            if setup.kv_cache == "fp8":
                # FP8's per-tensor scale is set by the first update and then frozen, as in
                # transformers' Fp8QuantizedLayer: chunked scoring sees what a chunked prefill would
                q.dtype = t.dtype
                data, self._fp8_scale[which] = q._quantize(t, scale=self._fp8_scale.get(which))
                return q._dequantize((data, self._fp8_scale[which]))
            return q._dequantize(q._quantize(t.contiguous(), axis=axis)).to(t.dtype)

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            k = self._round_trip(key_states, getattr(self._q, "axis_key", 0), "k")
            v = self._round_trip(value_states, getattr(self._q, "axis_value", 0), "v")
            return super().update(k, v, *args, **kwargs)

    return Cache(layers=[_RoundTripLayer(layer) for layer in template.layers])
