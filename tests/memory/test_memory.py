"""Memory ledger arithmetic: KV bytes with grouped-query attention, weights with scales."""

from __future__ import annotations

import pytest

from qeval.config.setups import Setup
from qeval.memory.ledger import ModelShape, predict_kv_bytes_per_token, predict_weights_bytes

LLAMA2_7B = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
}
LLAMA3_8B = {
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
}
FP16 = Setup(name="fp16")


def test_llama2_kv_is_half_a_mib_per_token() -> None:
    kv = predict_kv_bytes_per_token(ModelShape.from_config(LLAMA2_7B), FP16, "float16")
    assert kv == 512 * 1024
    assert kv * 2048 == 2**30


def test_llama3_gqa_kv_is_a_quarter() -> None:
    kv = predict_kv_bytes_per_token(ModelShape.from_config(LLAMA3_8B), FP16, "float16")
    assert kv == 128 * 1024


def test_parameter_counts_match_published_sizes() -> None:
    assert ModelShape.from_config(LLAMA2_7B).n_params() == pytest.approx(6.74e9, rel=0.01)
    assert ModelShape.from_config(LLAMA3_8B).n_params() == pytest.approx(8.03e9, rel=0.01)


def test_quantized_kv_adds_group_scales() -> None:
    shape = ModelShape.from_config(LLAMA3_8B)
    kv4 = predict_kv_bytes_per_token(shape, Setup(name="k", kv_cache="int4"), "float16")
    # 4 bits per element plus a 16-bit scale and zero point per 128-element head vector
    assert kv4 == 128 * 1024 // 4 + (2 * 32 * 8) * 4


def test_int4_weights_with_group_scales() -> None:
    shape = ModelShape.from_config(LLAMA2_7B)
    fp16 = predict_weights_bytes(shape, FP16, "float16")
    int4 = predict_weights_bytes(shape, Setup(name="q", weights="int4", group_size=128), "float16")
    linear = sum(o * i for o, i in shape.linear_shapes())
    quanto_scalars = len(shape.linear_shapes()) * 2 * 2  # input/output scale per module, fp16
    assert int4 == (shape.n_params() - linear) * 2 + linear // 2 + linear // 128 * 4 + quanto_scalars
    assert 0.25 < int4 / fp16 < 0.35


def test_tied_embeddings_count_once() -> None:
    tied = ModelShape.from_config(LLAMA2_7B | {"tie_word_embeddings": True})
    assert ModelShape.from_config(LLAMA2_7B).n_params() - tied.n_params() == 32000 * 4096


def test_a_quantized_kv_caches_scales_are_counted_where_hqq_keeps_them() -> None:
    """HQQ (the 8-bit KV cache) keeps a quantized tensor's scale and zero point in a meta dict
    beside it: the measured KV bytes count them (they were missed: 11,520 measured against the
    12,960 predicted a SmolLM2 token)."""
    import torch

    from qeval.memory.ledger import tensor_bytes

    data = torch.zeros(4, 64, dtype=torch.uint8)
    meta = {"scale": torch.ones(4, 1), "zero": torch.zeros(4, 1), "shape": torch.Size([4, 64]), "nbits": 8}
    assert tensor_bytes([(data, meta)]) == 4 * 64 + 2 * 4 * 4
