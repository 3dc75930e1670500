"""Hardware placement (docs/backends.md, "Hardware placement"): each setup's formats on vLLM by
device class, before any model loads, as vLLM 0.32's schemes and docs say (GPU; not run by qeval)
and as measured on its CPU build; and `qeval validate --placement` prints them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qeval.backends.vllm.placement import DEVICE_CLASSES, place, verdict
from qeval.config.setups import Setup
from tests.helpers import ROOT, run_cli

FP8 = Setup(name="fp8", weights="fp8")
W8A8 = Setup(name="w8a8", weights="int8", method="w8a8")
W4A16 = Setup(name="w4a16", weights="int4", method="gptq")
KV_FP8 = Setup(name="kv", kv_cache="fp8")
FP8_CKPT = Setup(name="fp8c", weights="fp8", method="fp8_dynamic")
NVFP4 = Setup(name="nvfp4", weights="fp4", method="nvfp4")


@pytest.mark.parametrize(
    ("setup", "device", "status", "why"),
    [
        (FP8, "hopper", "native", ""),
        (FP8, "ada", "native", ""),
        (FP8, "ampere", "fallback", "weight-only FP8 through Marlin"),  # CompressedTensorsW8A16Fp8 below 8.9
        (FP8, "cpu-avx512", "refused", "no FP8 quantization kernel"),
        (W8A8, "hopper", "native", ""),
        (W8A8, "blackwell", "refused", "INT8 is not supported on compute capability >= 10.0"),
        (W8A8, "cpu-avx2", "native", "measured"),
        (W4A16, "ampere", "native", "Marlin"),
        (W4A16, "turing", "fallback", "no Marlin"),
        (W4A16, "cpu-avx2", "refused", "AVX-512"),
        (KV_FP8, "cpu-avx512", "native", ""),
        (KV_FP8, "cpu-avx2", "refused", "AVX-512 or AMX"),
        (Setup(name="kv2", kv_cache="int2"), "hopper", "refused", "not a vLLM KV dtype"),
        (FP8_CKPT, "cpu-avx512", "native", "ChannelWiseTorchFP8ScaledMMLinearKernel"),  # measured
        (FP8_CKPT, "cpu-avx2", "refused", "AVX-512 or AMX"),
        (FP8_CKPT, "hopper", "native", ""),
        (NVFP4, "blackwell", "native", ""),
        (NVFP4, "hopper", "fallback", "weight-only FP4 through Marlin"),  # the issue's own example
        (NVFP4, "cpu-avx512", "refused", "no FP4 kernel"),  # measured
        (NVFP4, "turing", "untested", ""),
        (Setup(name="n", weights="fp4", method="nvfp4a16"), "hopper", "native", "weight-only"),
        (Setup(name="m", weights="fp4", method="mxfp4"), "ampere", "fallback", "Marlin"),
        (Setup(name="m", weights="fp4", method="mxfp4"), "turing", "refused", "8.0"),
        (Setup(name="m", weights="fp4", method="mxfp4a16"), "blackwell", "untested", "may quantize the activations"),
        (Setup(name="s", weights="fp8", method="fp8_static"), "cpu-avx512", "refused", "static_scaled_fp8_quant"),
        (Setup(name="k", kv_cache="nvfp4"), "blackwell", "native", "FlashInfer"),
        (Setup(name="k", kv_cache="nvfp4"), "hopper", "refused", "10.x"),
        (Setup(name="k", kv_cache="fp8_per_token_head"), "cpu-avx512", "refused", "garbage"),
        (Setup(name="q", weights="int8"), "hopper", "refused", "transformers-side quantizer"),
    ],
)
def test_each_format_is_placed_as_vllm_says(setup: Setup, device: str, status: str, why: str) -> None:
    (placed,) = place(setup, device)
    assert placed.status == status and why in placed.why, placed


def test_a_setup_is_its_worst_format_and_16_bit_runs_everywhere() -> None:
    mixed = Setup(name="m", weights="int4", method="gptq", kv_cache="fp8")
    assert [p.status for p in place(mixed, "cpu-avx2")] == ["refused", "refused"]
    assert verdict(place(mixed, "turing")) == "untested"  # FP8 KV below 8.9: neither source settles it
    assert all(place(Setup(name="b", baseline=True), d) == [] for d in DEVICE_CLASSES)
    with pytest.raises(ValueError, match="device class 'volta'"):
        place(FP8, "volta")


def test_validate_prints_the_placement_before_what_this_machine_lacks(tmp_path: Path) -> None:
    res = run_cli("validate", str(ROOT / "configs" / "gpu-llama3-8b.yaml"), "--placement")
    assert res.returncode == 2  # no GPU here: refused after the table, in one line
    table = res.stdout.splitlines()
    assert table[0].startswith("placement on vLLM 0.32") and table[2].split() == ["setup", *DEVICE_CLASSES]
    fp8 = next(line.split() for line in table if line.startswith("fp8 "))
    assert fp8 == ["fp8", "refused", "refused", "fallback", "fallback", "native", "native", "native"]
    assert "fp8 on ampere: FP8 W8A8: fallback (weight-only FP8 through Marlin" in res.stdout
    assert len(res.stderr.strip().splitlines()) == 1 and "no NVIDIA GPU" in res.stderr


def test_plan_places_each_format_or_the_configs_setups(tmp_path: Path) -> None:
    """`qeval plan --placement`: without a config, one row per format vLLM serves (FP8 and FP4
    checkpoints among them); --json carries the same lines."""
    from tests.helpers import MODEL

    res = run_cli("plan", "--model", str(MODEL), "--placement")
    assert res.returncode == 0, res.stderr[-2000:]
    rows = {line.split()[0]: line.split()[1:] for line in res.stdout.splitlines() if line[:1].isalnum()}
    assert rows["nvfp4"] == ["refused", "refused", "untested", "fallback", "fallback", "fallback", "native"]
    assert rows["fp8_dynamic"][:2] == ["refused", "native"] and rows["w8a8"][-1] == "refused"
    as_json = run_cli("plan", "--model", str(MODEL), "--placement", "--json")
    lines = json.loads(as_json.stdout)["placement"]
    assert any(line.startswith("  nvfp4 on hopper: NVFP4 W4A4: fallback") for line in lines)
