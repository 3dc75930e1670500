"""vLLM's own KV formats on the transformers backend (qeval/backends/hf/kv_cache.py
`EmulatedCodec`): FP8 with a scale per token and head, and NVFP4 (E2M1 in blocks of 16 with an
E4M3 scale), rounded in software token by token and planned at the format's bytes; a run of them,
flagged as emulated: tests/quantize/test_float_formats.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from qeval.backends.hf.kv_cache import EmulatedCodec, new_cache
from qeval.config.setups import Setup
from qeval.memory.ledger import kv_bytes_per_layer_token
from qeval.model.shape import ModelShape
from tests.helpers import MODEL, make_config, run_cli

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def test_fp8_per_token_head_scales_each_head_vector_on_its_own() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 32) * torch.logspace(-2, 2, 5).view(1, 1, 5, 1)  # tokens of very different sizes
    y = EmulatedCodec("fp8_per_token_head").encode(x)
    # E4M3 keeps 3 mantissa bits: at most 1/16 off relative to the head vector's own maximum
    err = (y - x).abs() / x.abs().amax(dim=-1, keepdim=True)
    assert 0 < err.max() <= 1 / 16
    # a token's values do not depend on any other token's (vLLM writes its cache token by token)
    x2 = x.clone()
    x2[:, :, 0] *= 1000
    assert torch.equal(EmulatedCodec("fp8_per_token_head").encode(x2)[:, :, 1:], y[:, :, 1:])


def test_nvfp4_rounds_to_e2m1_times_a_block_scale() -> None:
    torch.manual_seed(1)
    x = torch.randn(1, 2, 4, 32)
    y = EmulatedCodec("nvfp4").encode(x)
    blocks, yb = x.reshape(1, 2, 4, 2, 16), y.reshape(1, 2, 4, 2, 16)
    scale = (blocks.abs().amax(-1, keepdim=True) / 6).to(torch.float8_e4m3fn).float()
    q = yb / scale  # each value is an E2M1 value times its block's E4M3 scale
    assert torch.allclose(q.abs().unsqueeze(-1).sub(E2M1).abs().amin(-1), torch.zeros(()), atol=1e-5)
    assert 0 < (y - x).abs().max() <= (blocks.abs().amax(-1, keepdim=True) / 6 * 1.07).max()


@pytest.mark.parametrize(("kv", "per_token_head"), [("fp8_per_token_head", 32 + 4), ("nvfp4", 16 + 2)])
def test_the_plan_counts_the_formats_bytes(kv: str, per_token_head: int) -> None:
    """fp8: 32 values and a float32 scale per head vector; nvfp4: 32 x 4 bits and one byte per 16."""
    shape = ModelShape.from_config(json.loads((MODEL / "config.json").read_text()))
    setup = Setup(name="k", kv_cache=kv)  # type: ignore[arg-type]
    assert kv_bytes_per_layer_token(shape, setup, "bfloat16") == 2 * 2 * per_token_head  # K and V, 2 KV heads


def test_an_emulated_cache_is_the_round_trip_and_refuses_hf_knobs(tmp_path: Path) -> None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(MODEL)
    names = {type(layer).__name__ for layer in new_cache(config, Setup(name="k", kv_cache="nvfp4")).layers}
    assert names == {"_RoundTrip"}
    bad = make_config(
        tmp_path, setups=[{"name": "bf16", "baseline": True}, {"name": "k", "kv_cache": "nvfp4", "kv_group_size": 8}]
    )
    res = run_cli("validate", str(bad))
    assert res.returncode == 2 and "kv_group_size and kv_residual_length do not apply" in res.stderr
