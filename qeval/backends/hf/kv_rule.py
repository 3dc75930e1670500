"""transformers' accounting of one sequence's KV cache and state (qeval/memory/layouts.py `KvRule`).

transformers 5.23.0 (cache_utils.py): DynamicLayer holds every token; DynamicSlidingWindowLayer
(sliding and chunked layers alike) keeps the last W - 1 tokens, in a slice of the last update's
tensor: min(L, W) tokens of storage once decoding runs (all L right after a prefill, until the
first decode step); under a quantized KV cache qeval's own QuantizedSlidingLayer
(backends/hf/kv_cache.py) keeps min(L, W - 1) tokens, quantized, in storage of its own;
LinearAttentionLayer holds a conv state of the full kernel width in the model dtype and the
recurrent state in float32; DeepSeek-V3's attention caches the latent (kv_nope, k_rot) before
expanding it.
"""

from __future__ import annotations

from dataclasses import dataclass

from qeval.memory.layouts import (
    DTYPE_BYTES,
    NO_LAYERS,
    LayerBytes,
    Layers,
    SequenceKV,
    attention_kind,
    conv_dim,
    layer_counts,
    naive_bytes,
    recurrent_elements,
)
from qeval.model.shape import ModelShape


def linear_state_bytes(shape: ModelShape, dtype: str) -> int:
    """One linear-attention layer's state per sequence: the full kernel width of conv columns in
    the model's dtype and a float32 recurrent state."""
    kernel = shape.linear_conv_kernel_dim or 4
    return conv_dim(shape) * kernel * DTYPE_BYTES[dtype] + recurrent_elements(shape) * 4


def _held(shape: ModelShape, kind: str, context: int, span: int) -> int:
    """Tokens one layer of `kind` holds at `context`; `span` 1: a quantized windowed layer's W - 1."""
    window = {"sliding": shape.sliding_window, "chunked": shape.attention_chunk_size}.get(kind)
    return context if window is None else min(context, window - span)


@dataclass(frozen=True)
class HeldKv:
    """transformers' rule (the module docstring): the tokens each cache layer holds."""

    engine: str = "hf"

    def sequence(
        self, shape: ModelShape, layer_bytes: LayerBytes, context: int, dtype: str, quantized: Layers = NO_LAYERS
    ) -> SequenceKV:
        """One sequence at `context` tokens, each layer at its own bytes per token; a quantized
        windowed layer (in `quantized`) keeps W - 1 tokens of its own storage (qeval's
        QuantizedSlidingLayer), not a slice of the last update's W (a layer `kv_keep` keeps is
        transformers' own: the slice)."""
        counts = layer_counts(shape)
        kept: dict[str, int] = {}
        for i, (kind, per_token) in enumerate(zip(shape.kinds(), layer_bytes, strict=True)):
            if kind != "linear":
                k = attention_kind(shape, kind)
                kept[k] = kept.get(k, 0) + per_token * _held(shape, kind, context, 1 if i in quantized else 0)
        state = counts.get("linear", 0) * linear_state_bytes(shape, dtype) if "linear" in counts else 0
        return SequenceKV(self.engine, context, kept, state, naive_bytes(shape, DTYPE_BYTES[dtype], context))
