"""FP8 and FP4 checkpoints (docs/backends.md, "FP8 and FP4"): made by `qeval quantize` through
llm-compressor on this CPU, scored on transformers with their exact weights and their activations
rounded in software, flagged so in results.json and the report, and planned to the byte; and
vLLM's own KV formats (FP8 per token-head, NVFP4) rounded in software beside them, in one run."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from qeval.config import load_config
from qeval.memory.ledger import predict_weights_bytes
from qeval.model.shape import ModelShape
from tests.helpers import MODEL, TASKS, run_cli

CONFIG = f"""name: float-formats
model: {{path: "{MODEL}", dtype: float32, max_context: 256}}
tasks_dir: "{TASKS}"
backend: hf
device: cpu
quantize: {{output_dir: "@CK@", num_samples: 16, max_seq_length: 128}}
setups:
  - {{name: bf16, baseline: true}}
  - {{name: fp8, weights: fp8, method: fp8_dynamic}}
  - {{name: nvfp4, weights: fp4, method: nvfp4, kv_cache: nvfp4}}
  - {{name: kv-fp8-pth, kv_cache: fp8_per_token_head}}
tasks: [compare_mc]
"""


def _tensor_bytes(folder: Path) -> int:
    """Every tensor's bytes in a one-file safetensors checkpoint, read from its header."""
    with (folder / "model.safetensors").open("rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    return sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")


@pytest.mark.slow
def test_fp8_and_nvfp4_made_scored_emulated_and_planned(tmp_path: Path) -> None:
    cfg_path = tmp_path / "formats.yaml"
    cfg_path.write_text(CONFIG.replace("@CK@", str(tmp_path / "ck")))
    made = run_cli("quantize", str(cfg_path))
    assert made.returncode == 0, made.stderr[-3000:]
    assert "FP8_DYNAMIC" in made.stderr and "(no calibration text)" in made.stderr  # dynamic: nothing to calibrate
    assert "NVFP4" in made.stderr and "on 16 calibration texts" in made.stderr  # the input's global scale is

    # the plan counts each format's scales as compressed-tensors stores them: to the byte
    cfg = load_config(cfg_path)
    shape = ModelShape.from_config(json.loads((MODEL / "config.json").read_text()))
    folders = {p.name.split("-")[-2]: p for p in (tmp_path / "ck").iterdir()}
    for setup in cfg.setups[1:3]:
        assert predict_weights_bytes(shape, setup, "float32") == _tensor_bytes(folders[setup.method]), setup.name

    out = tmp_path / "out"
    res = run_cli("run", str(cfg_path), "--output", str(out), "--limit", "30", "--no-performance")
    assert res.returncode == 0, res.stderr[-3000:]
    setups = {s["name"]: s for s in json.loads((out / "results.json").read_text())["setups"]}
    for name, rounded in (("fp8", "float8 sym per token (dynamic)"), ("nvfp4", "float4 sym per tensor_group")):
        s = setups[name]
        assert s["status"] == "ok", s.get("error")
        assert rounded in s["quantization"]["emulated"], s["quantization"]
        assert any(f.startswith("activations_emulated:") for f in s["flags"]), s["flags"]
        # the rounding is real: the answers' distributions moved off the baseline's
        assert s["vs_baseline"]["compare_mc"]["kl"] > 0
    for name in ("nvfp4", "kv-fp8-pth"):  # vLLM's KV formats, rounded token by token
        s = setups[name]
        assert "KV cache" in s["quantization"]["emulated"], s["quantization"]
        assert any(f.startswith("kv_cache_emulated:") for f in s["flags"]), s["flags"]
        kv = s["memory"]["kv_bytes_per_token"]
        assert kv["measured"] is None and kv["predicted"] > 0  # no storage of the format was measured
    assert setups["kv-fp8-pth"]["vs_baseline"]["compare_mc"]["kl"] > 0  # the rounding changed the model's answers
    report = (out / "report.md").read_text()
    assert "fp8 (activations emulated)" in report and "nvfp4 (activations and KV cache emulated)" in report
    # and where vLLM would serve it otherwise, beside the figure: Hopper runs NVFP4 weight-only
    caveat = next(line for line in report.splitlines() if line.startswith("- **nvfp4** on GPUs:"))
    assert "hopper: NVFP4 W4A4: fallback (weight-only FP4 through Marlin" in caveat, caveat
    assert "hopper: KV cache nvfp4: refused" in caveat, caveat
