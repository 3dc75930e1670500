"""vLLM 0.32's TurboQuant KV caches (qeval/backends/hf/turboquant.py): the codebook is vLLM's own to
the bit (its centroids.py run in .venv-vllm), keys and values round as its store kernel does, the
plan counts its slot bytes, the boundary layers it keeps are kept, and what cannot be served is one
line. The Triton kernels themselves run on GPU builds only: not run here."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
import torch

from qeval.backends.hf.kv_cache import new_cache
from qeval.backends.hf.turboquant import hadamard, lloyd_max, round_keys, round_values
from qeval.config.setups import TURBOQUANT, Setup
from qeval.memory.ledger import kv_bytes_per_layer_token, predict_kv_bytes_per_token, turboquant_slot_bytes
from qeval.model.shape import ModelShape
from tests.helpers import ROOT

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
CENTROIDS = "lib/python3.11/site-packages/vllm/model_executor/layers/quantization/turboquant/centroids.py"
SMOLLM2 = ROOT / "models" / "smollm2-135m"


def test_the_codebook_is_vllms_own() -> None:
    """vLLM's solve_lloyd_max (loaded from its file, without importing vLLM) against the port, exactly."""
    path = ROOT / ".venv-vllm" / CENTROIDS
    assert path.is_file(), "vLLM's CPU build is installed by `make vllm` (make test does)"
    code = (
        "import importlib.util, json, sys\n"
        f"spec = importlib.util.spec_from_file_location('c', {str(path)!r})\n"
        "m = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(m)\n"
        "print(json.dumps({f'{d},{b}': m.solve_lloyd_max(d, b)[0].tolist() for d in (64, 256) for b in (3, 4)}))"
    )
    out = subprocess.run([str(VLLM_PYTHON), "-c", code], capture_output=True, text=True, timeout=300, check=True)
    theirs = json.loads(out.stdout)
    for key, values in theirs.items():
        d, bits = map(int, key.split(","))
        assert lloyd_max(d, bits).tolist() == values, key
    # and the shape vLLM's codebook has: symmetric, 2^bits levels, its 3-bit levels x sqrt(d)
    c = lloyd_max(64, 3) * 8
    assert torch.allclose(c[4:], torch.tensor([0.244984, 0.755646, 1.34318, 2.15035]), atol=1e-5)
    assert torch.allclose(c, -c.flip(0), atol=1e-6)


def _levels(row: torch.Tensor, tol: float = 1e-4) -> int:
    """Distinct values in `row`, those within `tol` of each other counted once."""
    ordered = row.sort().values
    return 1 + int((ordered.diff() > tol).sum())


def test_keys_keep_their_norm_and_land_on_the_codebook() -> None:
    torch.manual_seed(0)
    k = torch.randn(2, 3, 7, 64, dtype=torch.bfloat16) * 4
    h = hadamard(64)
    assert torch.allclose(h @ h, torch.eye(64), atol=1e-6)  # orthonormal and symmetric: its own inverse
    for kind in ("turboquant_4bit_nc", "turboquant_k3v4_nc"):
        bits = TURBOQUANT[kind][0]
        y = round_keys(k.float(), kind)
        # the norm correction: the read-back key has exactly the stored float16 norm
        assert torch.allclose(y.norm(dim=-1), k.float().norm(dim=-1).half().float(), rtol=1e-5)
        # rotated back, each coordinate is one of 2^bits levels (one codebook, rescaled per vector)
        rotated = (y @ h) / y.norm(dim=-1, keepdim=True)
        assert all(_levels(r) <= 2**bits for r in rotated.reshape(-1, 64))
        cos = torch.nn.functional.cosine_similarity(y, k.float(), dim=-1)
        assert cos.min() > (0.97 if bits == 4 else 0.93), (kind, cos.min())
    fp8 = round_keys(k.float(), "turboquant_k8v4")  # FP8 keys: a plain E4M3 cast, no scale
    assert torch.equal(fp8, k.float().to(torch.float8_e4m3fn).float())
    # a token's keys do not depend on another token's (the cache is written token by token)
    k2 = k.float().clone()
    k2[:, :, 0] *= 100
    assert torch.equal(
        round_keys(k2, "turboquant_3bit_nc")[:, :, 1:], round_keys(k.float(), "turboquant_3bit_nc")[:, :, 1:]
    )


@pytest.mark.parametrize("kind", ["turboquant_4bit_nc", "turboquant_3bit_nc"])
def test_values_are_uniform_between_each_vectors_min_and_max(kind: str) -> None:
    torch.manual_seed(1)
    v = torch.randn(4, 2, 5, 64) * torch.logspace(-1, 1, 5).view(1, 1, 5, 1)
    y = round_values(v, kind)
    steps = 2 ** TURBOQUANT[kind][1] - 1
    lo, hi = v.amin(-1, keepdim=True), v.amax(-1, keepdim=True)
    scale = (hi - lo) / steps
    assert ((y - v).abs() <= scale / 2 * 1.01 + 1e-3 * hi.abs()).all()  # half a step, plus float16 scales
    assert all(len(torch.unique(r)) <= steps + 1 for r in y.reshape(-1, 64))


@pytest.mark.parametrize(
    ("head_dim", "slots"),
    [(64, (100, 70, 62, 54)), (128, (196, 134, 118, 102)), (256, (388, 262, 230, 198))],
)
def test_the_slot_bytes_are_vllms_page_layout(head_dim: int, slots: tuple[int, ...]) -> None:
    """turboquant/config.py slot_size_aligned: k8v4, 4bit_nc, k3v4_nc, 3bit_nc."""
    assert tuple(turboquant_slot_bytes(kind, head_dim) for kind in TURBOQUANT) == slots


def test_the_plan_keeps_vllms_boundary_layers_at_16_bits() -> None:
    """SmolLM2 (30 layers, 3 KV heads of 64): layers 0, 1, 28 and 29 at bfloat16, the rest one
    70-byte slot per head under turboquant_4bit_nc; the per-layer cache is the same."""
    from transformers import AutoConfig

    shape = ModelShape.from_config(json.loads((SMOLLM2 / "config.json").read_text()))
    setup = Setup(name="tq", kv_cache="turboquant_4bit_nc")
    assert setup.kv_kept_layers(shape.kinds()) == (0, 1, 28, 29)
    assert kv_bytes_per_layer_token(shape, setup, "bfloat16") == 3 * 70
    assert predict_kv_bytes_per_token(shape, setup, "bfloat16") == 26 * 3 * 70 + 4 * 2 * 3 * 64 * 2
    cache = new_cache(AutoConfig.from_pretrained(SMOLLM2), setup)
    names = [type(layer).__name__ for layer in cache.layers]
    assert names[:2] == names[-2:] == ["DynamicLayer"] * 2 and set(names[2:-2]) == {"_RoundTrip"}
    # a hybrid keeps none; four layers keep all: refused as a setup that quantizes nothing
    assert Setup(name="h", kv_cache="turboquant_3bit_nc").kv_kept_layers(("full", "linear") * 4) == ()
    problem = Setup(name="t", kv_cache="turboquant_3bit_nc").kv_keep_problem(("full",) * 4)
    assert "first and last 2 layers" in problem and "nothing would be quantized" in problem


def test_windowed_layers_must_be_kept() -> None:
    """vLLM's TurboQuant attention does not apply a layer's window (read from its source): refused
    unless the windowed layers are kept."""
    kinds = ("sliding",) * 5 + ("full",) + ("sliding",) * 5 + ("full",)
    problem = Setup(name="g", kv_cache="turboquant_4bit_nc").kv_keep_problem(kinds)
    assert "does not apply their window" in problem and "kv_keep: [sliding]" in problem
    assert Setup(name="g", kv_cache="turboquant_4bit_nc", kv_keep=("sliding",)).kv_keep_problem(kinds) == ""


def test_vllm_serves_it_on_gpus_only_and_places_it() -> None:
    from qeval.backends.vllm import support as vllm_support
    from qeval.backends.vllm.placement import place
    from qeval.errors import UserError

    setup = Setup(name="tq", kv_cache="turboquant_k3v4_nc")
    assert vllm_support.kv_args(setup, None)["kv_cache_dtype"] == "turboquant_k3v4_nc"
    vllm_support.validate(setup, "cuda")
    with pytest.raises(UserError, match="GPU builds of vLLM only"):
        vllm_support.validate(setup, "cpu")
    assert [p.status for p in place(setup, "cpu-avx512")] == ["refused"]
    assert [p.status for p in place(setup, "hopper")] == ["untested"]


@pytest.mark.slow
def test_a_real_model_under_turboquant_is_scored_emulated_and_moves(tmp_path: Path) -> None:
    """SmolLM2 on the hf backend, the 3-bit preset against the baseline: scored, flagged emulated
    with the boundary layers named, its KV bytes planned at the slots, and its outputs moved."""
    from tests.helpers import make_config, run_cli

    assert (SMOLLM2 / ".prepared").is_file(), "run `make smollm2` (make test does)"
    cfg = make_config(
        tmp_path,
        model={"path": SMOLLM2, "dtype": "bfloat16-if-native"},
        setups=[{"name": "bf16", "baseline": True}, {"name": "tq3", "kv_cache": "turboquant_3bit_nc"}],
        tasks=["ppl"],
        gates=None,
    )
    res = run_cli("run", str(cfg), "--output", str(tmp_path / "out"), "--limit", "8")
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads((tmp_path / "out" / "results.json").read_text())
    tq = next(s for s in r["setups"] if s["name"] == "tq3")
    assert "layers 0, 1, 28, 29 at 16 bits" in tq["quantization"]["emulated"]
    assert tq["vs_baseline"]["ppl"]["kl"] > 1e-3 and not any("no_effect" in f for f in tq["flags"])
    dtype_bytes = 2 if r["run"]["dtype"] != "float32" else 4
    assert tq["memory"]["kv_bytes_per_token"]["predicted"] == 26 * 3 * 54 + 4 * 2 * 3 * 64 * dtype_bytes
    assert math.isfinite(tq["tasks"]["ppl"]["metrics"]["bits_per_byte"]["value"])
