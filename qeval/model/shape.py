"""The numbers of a decoder-only transformer that decide its memory, read from config.json: a
record on the ground floor (the Preflight record holds one; memory.ledger predicts from it)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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
    #: each layer's kind, as the engines read config.json: "full", "sliding", "chunked" or
    #: "linear" (a state layer: linear attention); empty: every layer full attention
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    #: latent attention (MLA): what one token caches per layer is kv_lora_rank + qk_rope_head_dim
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    #: linear-attention state layers (Gated DeltaNet, Qwen3-Next)
    linear_num_key_heads: int | None = None
    linear_num_value_heads: int | None = None
    linear_key_head_dim: int | None = None
    linear_value_head_dim: int | None = None
    linear_conv_kernel_dim: int | None = None

    def kinds(self) -> tuple[str, ...]:
        """Each layer's kind (`layer_types`, or full attention throughout)."""
        return tuple(self.layer_types) or ("full",) * self.num_layers

    @property
    def uniform(self) -> bool:
        """Every layer caches every token with full K/V heads: the per-token figure says it all."""
        return set(self.kinds()) == {"full"} and self.kv_lora_rank is None

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> ModelShape:
        """The shape a config.json describes; ValueError naming the field that is missing or
        not a positive integer (a zero head count would divide by zero further on)."""
        text = cfg.get("text_config", cfg) if isinstance(cfg, dict) else cfg
        if not isinstance(text, dict):  # multimodal wrappers keep the LM under text_config
            raise ValueError("is not a JSON object")
        # a published config.json leaves out what its config class defaults (Gemma 3's vocabulary)
        text = _DEFAULTS.get(str(text.get("model_type")), {}) | text
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
            layer_types=layer_kinds(text, _positive(text, "num_hidden_layers")),
            sliding_window=_optional(text, "sliding_window") if _uses_window(text) else None,
            attention_chunk_size=_optional(text, "attention_chunk_size"),
            kv_lora_rank=_optional(text, "kv_lora_rank"),
            qk_rope_head_dim=_optional(text, "qk_rope_head_dim") if text.get("kv_lora_rank") else None,
            qk_nope_head_dim=_optional(text, "qk_nope_head_dim") if text.get("kv_lora_rank") else None,
            v_head_dim=_optional(text, "v_head_dim") if text.get("kv_lora_rank") else None,
            **{k: _optional(text, k) for k in _LINEAR},
        )

    @classmethod
    def from_model_dir(cls, path: Path) -> ModelShape:
        return cls.from_config(json.loads((path / "config.json").read_text()))

    def linear_shapes(self) -> list[tuple[int, int]]:
        """(out_features, in_features) of every decoder linear layer: the quantized ones."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        per_layer = [
            (q, h),
            (kv, h),
            (kv, h),
            (h, q),
            (self.intermediate_size, h),
            (self.intermediate_size, h),
            (h, self.intermediate_size),
        ]
        return per_layer * self.num_layers

    def linear_modules(self) -> list[tuple[str, int, int]]:
        """(module name, out_features, in_features) of every decoder linear layer, named as
        transformers' Llama-family models name them (what a setup's `keep` patterns match)."""
        names = (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        )
        shapes = self.linear_shapes()
        return [(f"model.layers.{i // len(names)}.{names[i % len(names)]}", o, n) for i, (o, n) in enumerate(shapes)]

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


#: fields a published config.json may leave to its config class, with transformers 5.23's defaults
_DEFAULTS: dict[str, dict[str, Any]] = {"gemma3_text": {"vocab_size": 262208, "sliding_window": 4096}}
_LINEAR = (
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)
#: transformers' layer_types -> qeval's layer kinds
LAYER_KINDS = {
    "full_attention": "full",
    "sliding_attention": "sliding",
    "chunked_attention": "chunked",
    "linear_attention": "linear",
}


def _optional(cfg: dict[str, Any], key: str) -> int | None:
    return _positive(cfg, key) if cfg.get(key) is not None else None


def _uses_window(text: dict[str, Any]) -> bool:
    # Qwen2-style configs carry a `sliding_window` that `use_sliding_window: false` switches off
    return text.get("sliding_window") is not None and text.get("use_sliding_window", True) is not False


def layer_kinds(text: dict[str, Any], n: int) -> tuple[str, ...]:
    """Each layer's kind as transformers 5.23's config classes (and vLLM 0.32, which reads them)
    resolve it: an explicit `layer_types`, else the model type's own default pattern, else one
    kind for every layer (`sliding_window` set: all sliding, as Mistral-7B-v0.1; vLLM's
    engine/arg_utils.py applies a model-wide window the same way). Empty: all full attention."""
    explicit = text.get("layer_types")
    if isinstance(explicit, list) and explicit:
        unknown = sorted({k for k in explicit if k not in LAYER_KINDS})
        if unknown:
            raise ValueError(f"has layer_types {unknown[0]!r}, a layer kind qeval does not know")
        if len(explicit) != n:
            raise ValueError(f"has {len(explicit)} layer_types for {n} layers")
        kinds = tuple(LAYER_KINDS[k] for k in explicit)
        return () if set(kinds) == {"full"} else kinds
    model_type = str(text.get("model_type", ""))
    window = _uses_window(text)
    if model_type.startswith("gemma3") and window:  # Gemma3TextConfig: every 6th layer global
        every = int(text.get("sliding_window_pattern") or 6)
        return tuple("full" if (i + 1) % every == 0 else "sliding" for i in range(n))
    if model_type.startswith("gemma2") and window:  # Gemma2Config: alternating, sliding first
        return tuple("sliding" if (i + 1) % 2 else "full" for i in range(n))
    if model_type.startswith("cohere2") and window:  # Cohere2Config: every 4th layer global
        every = int(text.get("sliding_window_pattern") or 4)
        return tuple("full" if (i + 1) % every == 0 else "sliding" for i in range(n))
    if text.get("attention_chunk_size") is not None:  # Llama4TextConfig: NoPE layers are global
        rope = text.get("no_rope_layers") or [
            int((i + 1) % int(text.get("no_rope_layer_interval") or 4) != 0) for i in range(n)
        ]
        return tuple("chunked" if r else "full" for r in rope)
    if text.get("full_attention_interval"):  # Qwen3NextConfig: linear attention between global layers
        every = int(text["full_attention_interval"])
        return tuple("full" if (i + 1) % every == 0 else "linear" for i in range(n))
    if window:
        return ("sliding",) * n
    return ()
