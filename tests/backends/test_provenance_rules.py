"""Which engine paths are fallbacks (qeval/backends/vllm/provenance.py `fallbacks`): an FP8 KV
cache with unit scales anywhere, and on CUDA a 4-bit weight-only layer on a kernel other than
Marlin; the same layers on CPU, or calibrated scales, are the format's own path."""

from __future__ import annotations

from qeval.backends.vllm.provenance import fallbacks

WNA16 = "RowParallelLinear: CompressedTensorsLinearMethod / CompressedTensorsWNA16 / ExllamaLinearKernel"
MARLIN = "RowParallelLinear: CompressedTensorsLinearMethod / CompressedTensorsWNA16 / MarlinLinearKernel"


def test_an_fp8_cache_with_unit_scales_is_a_fallback_calibrated_scales_are_not() -> None:
    (unit,) = fallbacks({"kv_cache": "fp8", "kv_scales": "unit", "linear": {}}, "cpu")
    assert unit.startswith("fp8 KV cache with unit scales")
    assert fallbacks({"kv_cache": "fp8_e4m3", "kv_scales": "calibrated", "linear": {}}, "cuda") == []
    assert (
        fallbacks({"kv_cache": "auto", "kv_scales": "unit", "linear": {}}, "cuda") == []
    )  # a 16-bit cache is unscaled


def test_a_non_marlin_w4a16_layer_is_a_fallback_on_cuda_only() -> None:
    (slow,) = fallbacks({"kv_cache": "auto", "linear": {WNA16: 24}}, "cuda")
    assert "non-Marlin" in slow and "ExllamaLinearKernel" in slow
    assert fallbacks({"kv_cache": "auto", "linear": {MARLIN: 24}}, "cuda") == []
    assert fallbacks({"kv_cache": "auto", "linear": {WNA16: 24}}, "cpu") == []
