"""Which device the setups run on (`device: auto`), which 16-bit dtypes it runs natively, and
what `model.dtype: auto` resolves to.

Measured on an AVX2-only AMD EPYC (torch 2.13 CPU): a 512x512 matmul runs
at 76.8 GFLOP/s in float32 and 0.66 GFLOP/s in bfloat16. Without `avx512_bf16` or AMX, torch
emulates bfloat16 on the CPU, about 116x slower than float32; float16 likewise without
`avx512_fp16` / AMX-FP16. So a 16-bit baseline on such a CPU is not "the production precision,
cheaply": it is the same numbers at a hundredth of the speed. `auto` takes the model's own
16-bit dtype where the device runs it natively, float32 elsewhere.

Detection reads the CPU's feature flags (Linux `/proc/cpuinfo`: x86 `flags`, Arm `Features`;
macOS `sysctl hw.optional.arm.FEAT_BF16`), which costs no torch import, so `qeval validate`
stays a one-second check. Importing this module needs no torch.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any

from qeval.errors import UserError
from qeval.records.preflight import Precision


def resolve_device(requested: str, on_cluster: bool = False) -> str:
    """`auto` picks CUDA when an NVIDIA GPU is present (nvidia-smi on PATH, as the set-up does).
    On a cluster (`executor.kind: ray`) the GPUs are the workers', so cuda is not checked here."""
    has_gpu = shutil.which("nvidia-smi") is not None
    if requested == "cuda" and not has_gpu and not on_cluster:
        raise UserError("device cuda requested, but no NVIDIA GPU is present on this machine (no nvidia-smi)")
    if requested == "auto":
        return "cuda" if has_gpu else "cpu"
    return requested


SIXTEEN_BIT = ("bfloat16", "float16")

#: x86 flags (Linux names) that give torch's CPU kernels a native path for each 16-bit dtype
_X86_NATIVE = {"bfloat16": ("avx512_bf16", "amx_bf16"), "float16": ("avx512_fp16", "amx_fp16")}
#: Arm flags (Linux `Features`): bf16 (FEAT_BF16), fphp/asimdhp (half-precision arithmetic)
_ARM_NATIVE = {"bfloat16": ("bf16",), "float16": ("asimdhp", "fphp")}
#: what an emulated 16-bit matmul costs against float32 on the AVX2 machine measured above
EMULATED_SLOWDOWN = 116


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags (Linux /proc/cpuinfo `flags` or `Features`); empty where unreadable."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _macos_has(feature: str) -> bool:
    try:
        out = subprocess.run(
            ["sysctl", "-n", f"hw.optional.arm.{feature}"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return out.stdout.strip() == "1"


def native_16bit(device: str) -> frozenset[str]:
    """The 16-bit dtypes `device` computes natively (no emulation). CUDA: both (pre-Ampere
    GPUs lack bfloat16, which the engine itself refuses there)."""
    if device == "cuda":
        return frozenset(SIXTEEN_BIT)
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        # Apple silicon: half precision always; bfloat16 from M2 on (FEAT_BF16)
        return frozenset({"float16"} | ({"bfloat16"} if _macos_has("FEAT_BF16") else set()))
    flags = cpu_flags()
    table = _ARM_NATIVE if platform.machine() in ("aarch64", "arm64") else _X86_NATIVE
    native = frozenset(d for d, names in table.items() if any(n in flags for n in names))
    return native & _isa_allowed()


def _isa_allowed() -> frozenset[str]:
    """The 16-bit dtypes torch's CPU kernels may use natively under the environment's ISA caps:
    `ONEDNN_MAX_CPU_ISA=AVX2` (oneDNN, which runs torch's CPU matmuls) or
    `ATEN_CPU_CAPABILITY=avx2` make an AVX-512 machine compute like an AVX2 one (measured here:
    a bfloat16 512x512 matmul fell from 801 to 1.1 GFLOP/s, float32 stayed at 88)."""
    both = frozenset(SIXTEEN_BIT)
    aten = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if aten in ("default", "avx2", "avx", "sse", "zvector"):
        return frozenset()
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if not isa or isa in ("ALL", "DEFAULT") or isa.startswith("AVX10") or isa not in _ONEDNN_ISAS:
        return both
    level = _ONEDNN_ISAS.index(isa)  # oneDNN's ISAs are ordered: a cap allows every ISA below it
    return frozenset(
        d
        for d, first in (("bfloat16", "AVX512_CORE_BF16"), ("float16", "AVX512_CORE_FP16"))
        if level >= _ONEDNN_ISAS.index(first)
    )


#: oneDNN's x86 ISA names in its own order (ONEDNN_MAX_CPU_ISA, oneDNN 3.x)
_ONEDNN_ISAS = (
    "SSE41",
    "AVX",
    "AVX2",
    "AVX2_VNNI",
    "AVX2_VNNI_2",
    "AVX512_CORE",
    "AVX512_CORE_VNNI",
    "AVX512_CORE_BF16",
    "AVX512_CORE_FP16",
    "AVX512_CORE_AMX",
    "AVX512_CORE_AMX_FP16",
)


def isa_cap() -> str:
    """The environment variable that caps torch's CPU ISA, as `NAME=value`, or '' when none does."""
    for name in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA"):
        if os.environ.get(name, "").strip():
            return f"{name}={os.environ[name].strip()}"
    return ""


_KNOWN_DTYPES = ("float32", "bfloat16", "float16", "float64")


def model_dtype(config: dict[str, Any]) -> str | None:
    """The dtype a model's config.json says its weights are in (`dtype`, or the older
    `torch_dtype`, of a multimodal model's `text_config` too); None where neither names one."""
    text = config.get("text_config")
    places: list[dict[str, Any]] = [config, text if isinstance(text, dict) else {}]
    for where in places:
        for key in ("dtype", "torch_dtype"):
            value = where.get(key)
            if isinstance(value, str) and value.removeprefix("torch.") in _KNOWN_DTYPES:
                return value.removeprefix("torch.")
    return None


def resolve_precision(requested: str, config: dict[str, Any], device: str) -> Precision:
    """`auto` -> the model's 16-bit dtype where `device` runs it natively, else float32. An explicit
    16-bit dtype the device emulates is kept (the user asked for it) and flagged as slow."""
    native = native_16bit(device)
    where = "this GPU" if device == "cuda" else "this CPU"
    if requested == "bfloat16-if-native":
        if "bfloat16" in native:
            return Precision(requested, "bfloat16", f"dtype bfloat16-if-native: bfloat16, native on {where}")
        cap = isa_cap() if device != "cuda" else ""
        fallback = f"{cap} caps torch below native bfloat16" if cap else f"{where} has no native bfloat16"
        return Precision(
            requested,
            "float32",
            f"dtype bfloat16-if-native: float32, because {fallback}; "
            f"bfloat16 would run about {EMULATED_SLOWDOWN}x slower, emulated",
            fallback=fallback,
        )
    if requested == "auto":
        own = model_dtype(config)
        if own is None:  # as transformers loads a config that names no dtype
            return Precision(
                requested,
                "float32",
                "dtype auto: float32, because the model's config names no dtype",
                fallback="the model's config names no dtype",
            )
        if own not in SIXTEEN_BIT:
            return Precision(requested, "float32", f"dtype auto: the model's own dtype is {own}, so float32")
        if own in native:
            return Precision(requested, own, f"dtype auto: the model's own {own}, native on {where}")
        cap = isa_cap() if device != "cuda" else ""
        fallback = f"{cap} caps torch below native {own}" if cap else f"{where} has no native {own}"
        flags = "" if cap else f" ({_flag_names(own)})"
        return Precision(
            requested,
            "float32",
            f"dtype auto: float32, because {fallback}{flags}; "
            f"{own} would run about {EMULATED_SLOWDOWN}x slower, emulated",
            fallback=fallback,
        )
    if requested in SIXTEEN_BIT and requested not in native:
        return Precision(requested, requested, emulated_warning(requested, where), emulated=True)
    return Precision(requested, requested, f"dtype {requested}, as the config says")


def dtype_for(requested: str, model: Path, device: str = "cpu") -> str:
    """`requested` resolved for a model folder's config.json, for code that builds a RunConfig
    without a preflight (bench/): `auto` -> as a run would resolve it; others unchanged."""
    if requested not in ("auto", "bfloat16-if-native"):
        return requested
    import json

    try:
        config = json.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    return resolve_precision(requested, config if isinstance(config, dict) else {}, device).dtype


def emulated_warning(dtype: str, where: str = "this CPU") -> str:
    """One line: what an emulated 16-bit dtype costs, and what to use instead."""
    return (
        f"model.dtype {dtype}: {where} has no native {dtype} ({_flag_names(dtype)}), so torch emulates it, "
        f"about {EMULATED_SLOWDOWN}x slower than float32 in a matmul; use `dtype: auto` (float32 here) "
        f"or `dtype: float32`"
    )


def _flag_names(dtype: str) -> str:
    machine = platform.machine()
    names = _ARM_NATIVE[dtype] if machine in ("aarch64", "arm64") else _X86_NATIVE[dtype]
    return "no " + " / ".join(names)
