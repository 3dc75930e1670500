"""A setup's `keep:` list on the hf backend: the matched linear layers stay at the model's
dtype (quanto skips them), and the ledger's prediction and the measured tensor bytes agree."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from qeval.backends.hf.backend import HFBackend
from qeval.config import ModelSpec, RunConfig
from qeval.config.setups import Setup
from qeval.memory.ledger import ModelShape, predict_weights_bytes


def _backend(model_path: Path, setup: Setup) -> HFBackend:
    cfg = RunConfig(
        name="t",
        model=ModelSpec(path=str(model_path), dtype="bfloat16", max_context=256),
        setups=[setup],
        tasks=["x"],
        batch_size=8,
    )
    b = HFBackend(cfg, setup, "cpu")
    b.load()
    return b


def test_keep_skips_matched_layers_and_memory_follows(model_path: Path) -> None:
    shape = ModelShape.from_model_dir(model_path)
    uniform = Setup(name="i4", weights="int4", group_size=128)
    mixed = Setup(
        name="mix", weights="int4", group_size=128, keep=("model.layers.1.mlp.*", "model.layers.0.self_attn.q_proj")
    )
    b_uni, b_mix = _backend(model_path, uniform), _backend(model_path, mixed)
    kept = {
        "model.layers.1.mlp.gate_proj",
        "model.layers.1.mlp.up_proj",
        "model.layers.1.mlp.down_proj",
        "model.layers.0.self_attn.q_proj",
    }
    assert set(b_mix.quant_info["kept_modules"]) == kept
    modules = dict(b_mix.model.named_modules())
    for name in kept:  # a plain torch Linear in bf16, not a quanto QLinear
        assert type(modules[name]) is torch.nn.Linear and modules[name].weight.dtype == torch.bfloat16
    assert getattr(modules["model.layers.1.self_attn.q_proj"], "weight_qtype", None) is not None
    m_uni, m_mix = (b.memory()["weights_bytes"].measured for b in (b_uni, b_mix))
    assert m_uni is not None and m_mix is not None
    p_uni, p_mix = (predict_weights_bytes(shape, s, "bfloat16") for s in (uniform, mixed))
    assert m_mix > m_uni
    assert m_mix == pytest.approx(p_mix, rel=0.02)
    # the keep adds what the ledger says it adds, to within the quanto scalars per module
    assert abs((m_mix - m_uni) - (p_mix - p_uni)) <= 4 * len(kept)


def test_keep_in_id_and_refusals() -> None:
    a = Setup(name="a", weights="int4")
    b = Setup(name="b", weights="int4", keep=["model.layers.0.*"])  # type: ignore[arg-type]  # YAML gives a list
    assert b.keep == ("model.layers.0.*",)
    assert a.id != b.id and a.weights_key() != b.weights_key()
    assert (
        Setup(name="c", weights="int4", keep=("y", "x", "x")).id == Setup(name="d", weights="int4", keep=("x", "y")).id
    )
    # a setup without keep (or checkpoint_revision, control, kv_keep) keeps the id it had before those
    # fields existed (stored results stay valid)
    unset = {"keep", "checkpoint_revision", "control", "kv_keep"}
    old = a.model_dump(exclude={"name", "baseline", "memory_limit_mib", "optional"} | unset)
    assert a.id == hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:16]
    assert b.keeps("model.layers.0.mlp.up_proj") and not b.keeps("model.layers.10.mlp.up_proj")
    for bad in (
        {"weights": None, "keep": ("x",)},
        {"weights": "int4", "method": "bnb", "keep": ("x",)},
        {"weights": "int4", "keep": ("x; rm",)},
        {"weights": "int4", "keep": ("",)},
    ):
        with pytest.raises(ValidationError):
            Setup(name="bad", **bad)
