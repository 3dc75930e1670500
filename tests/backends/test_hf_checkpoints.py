"""Pre-quantized checkpoints as setups on the hf backend: described from their own
quantization_config, refused in one line where this device or environment cannot run them.
(Served for real, beside vLLM, in tests/backends/test_vllm_backend.py on `qeval quantize`'s
checkpoints.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from qeval.backends.hf import support
from qeval.config.setups import Setup
from qeval.errors import UserError
from qeval.model.checkpoint import describe

#: what llm-compressor 0.14 writes for `qeval quantize`'s W8A8 and GPTQ W4A16 (abridged)
W8A8 = {
    "quant_method": "compressed-tensors",
    "format": "int-quantized",
    "ignore": ["lm_head"],
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False},
            "input_activations": {
                "num_bits": 8,
                "type": "int",
                "symmetric": True,
                "strategy": "token",
                "dynamic": True,
            },
        }
    },
}
W4A16 = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "ignore": ["lm_head"],
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "input_activations": None,
            "weights": {
                "num_bits": 4,
                "type": "int",
                "symmetric": True,
                "strategy": "group",
                "group_size": 64,
                "dynamic": False,
            },
        }
    },
}


def test_the_description_is_read_from_the_checkpoint() -> None:
    w8 = describe(W8A8)
    assert w8["text"] == (
        "compressed-tensors: Linear: weights int8 sym per channel (static), activations int8 sym "
        "per token (dynamic); unquantized: lm_head"
    )
    assert (w8["bits"], w8["group_size"], w8["activation_bits"], w8["ignore"]) == (8, None, 8, ["lm_head"])
    w4 = describe(W4A16)
    assert "weights int4 sym per group of 64 (static), activations 16-bit" in w4["text"]
    assert (w4["bits"], w4["group_size"], w4["format"]) == (4, 64, "pack-quantized")
    gptq = describe(
        {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": False, "modules_to_not_convert": ["lm_head"]}
    )
    assert gptq["text"] == "gptq: 4-bit, group 128, asym; unquantized: lm_head"


def _checkpoint(tmp: Path, qc: dict[str, Any] | None) -> str:
    folder = tmp / "ck"
    folder.mkdir()
    config: dict[str, Any] = {"model_type": "llama"} | ({"quantization_config": qc} if qc else {})
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def _refused(setup: Setup, device: str = "cpu") -> str:
    with pytest.raises(UserError) as err:
        support.validate(setup, device)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_checkpoint_this_device_cannot_run_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bnb = Setup(name="nf4", checkpoint=_checkpoint(tmp_path, {"quant_method": "bitsandbytes", "load_in_4bit": True}))
    assert "bitsandbytes' kernels (CUDA)" in _refused(bnb)
    odd = Setup(name="odd", checkpoint=str(tmp_path / "ck"))
    (tmp_path / "ck" / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "aqlm"}}))
    assert "quant_method 'aqlm', which qeval does not serve on transformers" in _refused(odd)
    (tmp_path / "ck" / "config.json").write_text(json.dumps({"quantization_config": W8A8}))
    ct = Setup(name="w8a8", checkpoint=str(tmp_path / "ck"))
    real = support._installed
    monkeypatch.setattr(support, "_installed", lambda m: m != "compressed_tensors" and real(m))
    assert "needs the compressed-tensors package on transformers, which is not installed" in _refused(ct)
    # a `qeval quantize` method setup (its folder filled in at preflight) needs the same package
    made = Setup(name="w4a8", weights="int4", method="w4a8")
    assert "compressed-tensors package" in _refused(made)
    twice = Setup(name="x", weights="int4", checkpoint=str(tmp_path / "ck"))
    assert "a checkpoint brings its own quantization" in _refused(twice)
    assert "no such folder" in _refused(Setup(name="gone", checkpoint=str(tmp_path / "nowhere")))


def test_a_plain_folder_is_served_as_it_is(tmp_path: Path) -> None:
    support.validate(Setup(name="finetune", checkpoint=_checkpoint(tmp_path, None)), "cpu")  # no error


def test_the_resume_key_carries_the_checkpoint_content(tmp_path: Path) -> None:
    """A checkpoint remade at the same path (`qeval quantize --force`) recomputes its setup."""
    import shutil

    from qeval.config import load_config
    from qeval.records.keys import setup_keys
    from qeval.run.preflight import preflight
    from tests.helpers import MODEL, make_config

    copy = tmp_path / "finetune"
    shutil.copytree(MODEL, copy)
    cfg = make_config(tmp_path, setups=[{"name": "bf16", "baseline": True}, {"name": "ft", "checkpoint": str(copy)}])

    def keys() -> tuple[str, str]:
        pre = preflight(load_config(cfg))
        base, ft = (setup_keys(pre, s) for s in pre.setups)
        assert "checkpoint_sha256" not in base.parts  # other setups' keys are as they were
        return base.key, ft.key

    before = keys()
    (copy / "generation_config.json").write_text((copy / "generation_config.json").read_text() + "\n")
    after = keys()
    assert after[0] == before[0] and after[1] != before[1]
