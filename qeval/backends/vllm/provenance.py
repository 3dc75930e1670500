"""What a vLLM engine actually ran for a setup (docs/backends.md, "Kernel provenance"): the linear
method, scheme and kernel per layer type, the attention backend, the KV cache's dtype and
whether its FP8 scales are calibrated or 1.0, read from the engine itself where it runs in the
worker's process, else from its log (vLLM 0.32: `LLM.collective_rpc` takes a callable in process;
across processes it would need VLLM_ALLOW_INSECURE_SERIALIZATION, which qeval does not set).

A setup that ran on a fallback is said so (`fallbacks`): an FP8 KV cache with unit scales (no
calibrated k/v scales: the cache's range is unscaled), and on CUDA a 4-bit weight-only layer on a
kernel other than Marlin (a practitioner's AWQ ran 741 against 67 tokens/s on the two)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from qeval.backends.vllm.logs import quantized_kernels


def engine_provenance(llm: Any, in_process: bool, log: str, device: str) -> dict[str, Any]:
    """The provenance block of a setup served by `llm` (see the module docstring)."""
    cache_dtype = str(llm.llm_engine.vllm_config.cache_config.cache_dtype)
    if in_process:
        seen = llm.collective_rpc(_inspect)[0]
        out: dict[str, Any] = {
            "linear": seen["linear"],
            "attention": seen["attention"],
            "kv_cache": cache_dtype,
            "kv_scales": seen["kv_scales"],
            "source": "the engine's model and attention groups, inspected in the worker's process",
        }
    else:
        kernels = quantized_kernels(log)
        out = {
            "linear": {f"{scheme} / {kernel}": 0 for scheme, kernel in kernels.items()},
            "attention": [],
            "kv_cache": cache_dtype,
            "kv_scales": None,
            "source": "the engine's log and config (its model runs in processes of its own)",
        }
    out["fallbacks"] = fallbacks(out, device)
    return out


def fallbacks(seen: dict[str, Any], device: str) -> list[str]:
    """What the engine ran that is not the format's own path, in words (see the module docstring)."""
    out = []
    if str(seen.get("kv_cache", "")).startswith("fp8") and seen.get("kv_scales") == "unit":
        out.append(
            "fp8 KV cache with unit scales: no calibrated k/v scales were loaded, so every value is cast "
            "unscaled (calibrate them with llm-compressor's kv_cache_scheme)"
        )
    if device == "cuda":
        slow = [k for k in seen.get("linear", {}) if "WNA16" in k and "Marlin" not in k]
        if slow:
            out.append(
                f"4-bit weight-only layers on a non-Marlin kernel ({slow[0]}): quality valid, speed not the format's"
            )
    return out


def _inspect(worker: Any) -> dict[str, Any]:
    """Inside the engine's worker: each module type's quantization method / scheme / kernel, with
    counts; the attention backends of its attention groups; and the attention layers' KV scales."""
    runner = worker.model_runner
    attention = sorted({g.backend.get_name() for groups in runner.attn_groups for g in groups})
    linear: Counter[str] = Counter()
    scales: set[str] = set()
    for _, module in runner.get_model().named_modules():
        method = getattr(module, "quant_method", None)
        if method is None:
            continue
        scheme = getattr(module, "scheme", None)
        kernel = getattr(scheme, "kernel", None) if scheme is not None else None
        parts = [type(x).__name__ for x in (method, scheme, kernel) if x is not None]
        linear[f"{type(module).__name__}: {' / '.join(parts)}"] += 1
        if hasattr(module, "_k_scale_float"):
            unit = module._k_scale_float == 1.0 and module._v_scale_float == 1.0
            scales.add("unit" if unit else "calibrated")
    kv_scales = scales.pop() if len(scales) == 1 else ("mixed" if scales else None)
    return {"linear": dict(linear), "attention": attention, "kv_scales": kv_scales}
