"""The vLLM backend's translation layer and refusals (pure: no engine starts here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import ROOT, run_cli, write_config
from qeval.backends import vllm_support
from qeval.config import load_config
from qeval.errors import UserError
from qeval.setups import Setup


def _args(setup: Setup, **kw: object) -> dict:
    base = dict(dtype="float16", max_model_len=4096, utilization=0.9, max_num_seqs=64, tensor_parallel_size=1,
                enforce_eager=True, seed=1234)
    return vllm_support.engine_args("meta-llama/Meta-Llama-3-8B-Instruct", setup, **(base | kw))  # type: ignore[arg-type]


def test_gpu_example_config_translates_to_engine_arguments() -> None:
    cfg = load_config(ROOT / "configs" / "gpu-llama3-8b.yaml")
    args = {s.name: _args(s) for s in cfg.setups}
    assert args["fp16"] == {"model": "meta-llama/Meta-Llama-3-8B-Instruct", "dtype": "float16", "max_model_len": 4096,
                            "gpu_memory_utilization": 0.9, "tensor_parallel_size": 1, "enforce_eager": True,
                            "seed": 1234, "trust_remote_code": False, "enable_prefix_caching": False,
                            "max_num_seqs": 64}
    assert args["fp8"]["quantization"] == "fp8" and "kv_cache_dtype" not in args["fp8"]
    assert args["w4a16"]["model"] == "checkpoints/llama3-8b-w4a16-gptq" and "quantization" not in args["w4a16"]
    assert args["fp16-kv-fp8"]["kv_cache_dtype"] == "fp8"
    assert args["w4a16-kv-fp8"]["kv_cache_dtype"] == "fp8" and args["w4a16-kv-fp8"]["model"].endswith("gptq")
    for name in ("fp16", "fp8", "fp16-kv-fp8"):  # a CUDA device validates them all
        vllm_support.validate(next(s for s in cfg.setups if s.name == name), "cuda")


def test_bitsandbytes_and_e5m2() -> None:
    assert _args(Setup(name="b", weights="int4", method="bnb"))["quantization"] == "bitsandbytes"
    assert _args(Setup(name="e", kv_cache="fp8_e5m2"))["kv_cache_dtype"] == "fp8_e5m2"


@pytest.mark.parametrize(("setup", "device", "message"), [
    (Setup(name="k", kv_cache="int4"), "cuda", "not a vLLM kv_cache_dtype"),
    (Setup(name="q", weights="int4", method="rtn"), "cuda", "transformers-side quantizer"),
    (Setup(name="g", weights="int4", method="gptq"), "cuda", "set `checkpoint:`"),
    (Setup(name="g", weights="int4", method="gptq", checkpoint="x/y"), "cpu", "no kernel in vLLM's AVX2 CPU build"),
    (Setup(name="b", weights="int4", method="bnb"), "cpu", "GPU builds of vLLM only"),
    (Setup(name="w", weights="int8", method="w4a8", checkpoint="x/y"), "cuda", "does not make int8 weights"),
])
def test_refusals(setup: Setup, device: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        vllm_support.validate(setup, device)


def test_fp8_kv_on_this_cpu_is_refused_before_any_engine(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.yaml", """\
name: v
model: {path: "@MODEL@"}
tasks_dir: "@TASKS@"
backend: vllm
device: cpu
setups:
  - {name: bf16, baseline: true}
  - {name: kv-fp8, kv_cache: fp8}
tasks: [addition]
""")
    res = run_cli("validate", str(cfg))
    if vllm_support.cpu_has_fp8():  # an AVX-512 / AMX machine can run it
        assert res.returncode == 0, res.stderr
        return
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "FP8 KV cache needs AVX-512 or AMX" in res.stderr
