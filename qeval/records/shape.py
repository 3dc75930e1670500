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
