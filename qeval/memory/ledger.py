"""The memory ledger: analytic predictions from a model's config.json, and byte counting of
what a loaded model or cache really holds.

Predictions follow docs/memory.md. KV bytes per token use `num_key_value_heads` (grouped-
query attention), never `num_attention_heads`: the `hidden_size` form overstates a GQA
model's cache (Llama-3-8B fourfold).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qeval.setups import KV_BITS, WEIGHT_BITS, Setup

_DTYPE_BITS = {"float32": 32, "bfloat16": 16, "float16": 16}
SCALE_BYTES = 2  # 16-bit scales and zero points, as quanto, GPTQ and AWQ store them


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only transformer that decide its memory."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool
    attention_bias: bool = False

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> ModelShape:
        """The shape a config.json describes; ValueError naming the field that is missing or
        not a positive integer (a zero head count would divide by zero further on)."""
        text = cfg.get("text_config", cfg) if isinstance(cfg, dict) else cfg
        if not isinstance(text, dict):  # multimodal wrappers keep the LM under text_config
            raise ValueError("is not a JSON object")
        heads = _positive(text, "num_attention_heads")
        hidden = _positive(text, "hidden_size")
        head_dim = _positive(text, "head_dim") if text.get("head_dim") else hidden // heads
        if head_dim < 1:
            raise ValueError(f"has hidden_size {hidden} below num_attention_heads {heads}: no head dimension")
        return cls(
            vocab_size=_positive(text, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=_positive(text, "intermediate_size"),
            num_layers=_positive(text, "num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=_positive(text, "num_key_value_heads") if text.get("num_key_value_heads") else heads,
            head_dim=head_dim,
            tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
            attention_bias=bool(text.get("attention_bias", False)),
        )

    @classmethod
    def from_model_dir(cls, path: Path) -> ModelShape:
        return cls.from_config(json.loads((path / "config.json").read_text()))

    def linear_shapes(self) -> list[tuple[int, int]]:
        """(out_features, in_features) of every decoder linear layer: the quantized ones."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        per_layer = [(q, h), (kv, h), (kv, h), (h, q), (self.intermediate_size, h),
                     (self.intermediate_size, h), (h, self.intermediate_size)]
        return per_layer * self.num_layers

    def other_params(self) -> int:
        """Parameters left in 16-bit by weight quantization: embeddings, lm_head, norms, biases."""
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embed
        norms = self.hidden_size * (2 * self.num_layers + 1)
        bias = 0
        if self.attention_bias:
            bias = self.num_layers * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        return embed + head + norms + bias

    def n_params(self) -> int:
        return sum(o * i for o, i in self.linear_shapes()) + self.other_params()


def _positive(cfg: dict[str, Any], key: str) -> int:
    """cfg[key] as a positive integer, else ValueError saying what it is."""
    if key not in cfg:
        raise ValueError(f"lacks {key!r}")
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"has {key} {value!r}: expected a positive integer")
    return value


def _int4_group(in_features: int, group_size: int) -> int:
    """quanto's rule (optimum-quanto 0.2.7, QModuleMixin): shrink the group by 32 until it
    divides the row; rows no longer than the group are quantized per channel."""
    g = group_size
    if in_features <= g:
        return in_features
    while in_features % g and g > 32:
        g -= 32
    return g if in_features % g == 0 else in_features


def predict_weights_bytes(shape: ModelShape, setup: Setup, model_dtype: str) -> int:
    """Bytes of the served weights, scales and zero points included."""
    base_bits = _DTYPE_BITS[model_dtype] if setup.weights is None else WEIGHT_BITS[setup.weights]
    other_bits = base_bits if not setup.quantizes_weights else _DTYPE_BITS.get(model_dtype, 16)
    total = shape.other_params() * other_bits // 8
    for out_f, in_f in shape.linear_shapes():
        total += out_f * in_f * base_bits // 8
        if setup.method == "bnb":  # bitsandbytes keeps float32 scales: per row (int8), per block of 64 (NF4)
            total += out_f * 4 if setup.weights == "int8" else out_f * in_f // 64 * 4
        elif setup.weights == "int8":
            total += out_f * SCALE_BYTES  # per output channel, symmetric
        elif setup.weights == "int4":
            groups = in_f // _int4_group(in_f, setup.group_size or 128)
            # quanto (rtn) and AWQ are asymmetric: a zero point beside each scale; GPTQ / W4A8 are symmetric
            per_group = 1 if setup.method in ("gptq", "w4a8") else 2
            total += out_f * groups * per_group * SCALE_BYTES
        if setup.quantizes_weights and setup.method == "rtn":
            # quanto keeps an input_scale and an output_scale scalar per module, in the model dtype
            total += 2 * _DTYPE_BITS[model_dtype] // 8
    return total


def predict_kv_bytes_per_token(shape: ModelShape, setup: Setup, model_dtype: str) -> int:
    """2 (K and V) x layers x KV heads x head_dim x bytes, plus per-group scales when quantized."""
    elems = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim
    if not setup.quantizes_kv:
        return elems * _DTYPE_BITS[model_dtype] // 8
    data = elems * KV_BITS[setup.kv_cache] // 8
    if setup.kv_cache in ("fp8", "fp8_e5m2"):
        return data  # one per-tensor scale per layer: nothing per token
    group = setup.kv_group_size or shape.head_dim
    return data + (elems // group) * 2 * SCALE_BYTES


def tensor_bytes(obj: Any, seen: set[int] | None = None) -> int:
    """Bytes held by a tensor, a quantized tensor subclass (counted through its inner
    tensors: packed data, scales, zero points) or a container of them; shared storage once."""
    import torch

    seen = set() if seen is None else seen
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(x, seen) for x in obj)
    if not isinstance(obj, torch.Tensor) or id(obj) in seen:
        return 0
    seen.add(id(obj))
    if hasattr(obj, "__tensor_flatten__") and type(obj) is not torch.nn.Parameter:
        names, _ = obj.__tensor_flatten__()
        return sum(tensor_bytes(getattr(obj, n), seen) for n in names)
    if isinstance(obj, torch.nn.Parameter) and hasattr(obj.data, "__tensor_flatten__"):
        return tensor_bytes(obj.data, seen)
    return obj.numel() * obj.element_size()


def model_weights_bytes(model: Any) -> int:
    """Bytes of every parameter and buffer of a loaded torch model (tied weights once)."""
    seen: set[int] = set()
    tensors = [p for _, p in model.named_parameters(remove_duplicate=True)]
    tensors += [b for _, b in model.named_buffers(remove_duplicate=True) if not _is_rope_cache(b, model)]
    return sum(tensor_bytes(t, seen) for t in tensors)


def _is_rope_cache(buf: Any, model: Any) -> bool:
    # rotary inv_freq is a recomputable buffer, not a weight; a few hundred bytes either way
    return any(buf is b for n, b in model.named_buffers() if n.endswith("inv_freq"))


def cache_bytes(cache: Any) -> int:
    """Bytes held by a transformers Cache (DynamicCache, QuantizedCache) across its layers."""
    seen: set[int] = set()
    return sum(tensor_bytes(list(vars(layer).values()), seen) for layer in cache.layers)
