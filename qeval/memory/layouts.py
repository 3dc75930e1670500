"""KV cache and state of one sequence at a context L, per layer kind, following the accounting
of the engine that serves (docs/memory.md, "Attention layouts"):

    full       every token, every layer                         (Llama)
    sliding    the last `sliding_window` tokens                 (Gemma 2/3, GPT-OSS, Mistral-7B-v0.1)
    chunked    the current `attention_chunk_size` chunk         (Llama 4's RoPE layers)
    latent     kv_lora_rank + qk_rope_head_dim per token (MLA)  (DeepSeek-V2/V3, Kimi-K2)
    linear     a constant state per sequence                    (Qwen3-Next's Gated DeltaNet)

Each engine's rules are its backend's (a `KvRule` its registry entry gives: `kv_accounting`, and
`plan_kv_rule` for `qeval plan --engine`): vLLM's paged blocks in qeval/backends/vllm/kv_rule.py,
transformers' cache layers in qeval/backends/hf/kv_rule.py. This module holds what they share:
the protocol, the result, and the engine-free figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from qeval.config.setups import Setup
from qeval.memory.ledger import kv_layer_bytes
from qeval.model.shape import ModelShape

#: what one token costs in each decoder layer (memory.ledger.kv_layer_bytes), and a set of layers
LayerBytes = tuple[int, ...]
Layers = frozenset[int]
NO_LAYERS: Layers = frozenset()
#: bytes per element of the model's dtypes (state layers, the naive figure)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class SequenceKV:
    """What one sequence of `context` tokens holds, in bytes: KV per layer kind, and the constant
    state of state layers. `naive` is 2 x layers x KV heads x head_dim x bytes x L, as if every
    layer cached every token with full K/V heads."""

    engine: str
    context: int
    by_kind: dict[str, int] = field(default_factory=dict)
    state: int = 0
    naive: int = 0
    #: vLLM: the bytes of one block over a group's width (its pool is sized in these); 0 for hf
    block_bytes: int = 0

    @property
    def total(self) -> int:
        return sum(self.by_kind.values()) + self.state


class KvRule(Protocol):
    """One engine's rules for what a sequence holds (the module docstring), with the settings it
    runs with. A backend's registry entry gives it (qeval/backends/__init__.py
    `BackendEntry.kv_accounting`), None where qeval cannot know the engine."""

    @property
    def engine(self) -> str:
        """The engine's name as the memory block and `qeval plan` show it."""
        ...

    def sequence(
        self, shape: ModelShape, layer_bytes: LayerBytes, context: int, dtype: str, quantized: Layers = NO_LAYERS
    ) -> SequenceKV:
        """One sequence at `context` tokens, from what one token costs in each decoder layer
        (memory.ledger.kv_layer_bytes: the KV dtype, quantization scales included, a kept layer's
        at the model's dtype). `dtype` is the model's (state layers, the naive figure);
        `quantized`: the layers whose K/V is quantized (a `kv_keep` layer is not)."""
        ...


#: the name the backends' entries and the memory block give the rule
KvAccounting = KvRule


def cdiv(a: int, b: int) -> int:
    """a / b rounded up."""
    return -(-a // b)


def layer_counts(shape: ModelShape) -> dict[str, int]:
    """How many layers of each kind the model has, in the order they first appear."""
    kinds = shape.kinds()
    return {k: kinds.count(k) for k in dict.fromkeys(kinds)}


def attention_kind(shape: ModelShape, kind: str) -> str:
    """A full-attention layer's kind as it caches: `latent` on MLA models."""
    return "latent" if kind == "full" and shape.kv_lora_rank is not None else kind


def conv_dim(shape: ModelShape) -> int:
    """A linear-attention layer's causal-conv channels: q, k and v (Gated DeltaNet)."""
    nk, nv = shape.linear_num_key_heads or 0, shape.linear_num_value_heads or 0
    dk, dv = shape.linear_key_head_dim or 0, shape.linear_value_head_dim or 0
    return 2 * nk * dk + nv * dv


def recurrent_elements(shape: ModelShape) -> int:
    """A linear-attention layer's recurrent state: num_value_heads x key_dim x value_dim."""
    nv = shape.linear_num_value_heads or 0
    return nv * (shape.linear_key_head_dim or 0) * (shape.linear_value_head_dim or 0)


def naive_bytes(shape: ModelShape, dtype_bytes: float, context: int) -> int:
    """The textbook figure: every layer caches K and V of every KV head for every token (MLA:
    decompressed, heads x (qk_nope + qk_rope) for K and heads x v_head_dim for V)."""
    if shape.kv_lora_rank is not None:
        k = (shape.qk_nope_head_dim or 0) + (shape.qk_rope_head_dim or 0)
        per_layer = shape.num_heads * (k + (shape.v_head_dim or 0))
    else:
        per_layer = 2 * shape.num_kv_heads * shape.head_dim
    return int(shape.num_layers * per_layer * dtype_bytes * context)


def predict_sequence(shape: ModelShape, setup: Setup, model_dtype: str, context: int, rule: KvRule) -> SequenceKV:
    """One sequence of `setup` at `context` tokens under the engine's `rule`: KV per layer kind
    (the setup's KV dtype, scales included) and the state of state layers."""
    kept = set(setup.kv_kept_layers(shape.kinds()))
    quantized = frozenset(
        i for i, k in enumerate(shape.kinds()) if setup.quantizes_kv and k != "linear" and i not in kept
    )
    return rule.sequence(shape, kv_layer_bytes(shape, setup, model_dtype), context, model_dtype, quantized)
