"""The memory figures vLLM only logs, parsed from its engine output (vLLM 0.32 wording).

CPU build:  "Auto set (2.79/11.34) GiB for KV cache on node 0, ..."   (or "Explicitly set (X/Y) GiB")
            "CPU KV cache size: 2,925,824 tokens, Maximum concurrency for 256 tokens per request: 11429.00x"
GPU build:  "Model loading took 14.99 GiB memory and 8.1 seconds"
            "GPU KV cache size: 112,384 tokens", "Maximum concurrency for 4096 tokens per request: 27.44x"
            "Available KV cache memory: 6.86 GiB"
"""

from __future__ import annotations

import re
from typing import Any

from qeval.model.checkpoint import checkpoint_description

GIB = 2**30
_PATTERNS = {
    "kv_cache_tokens": re.compile(r"KV cache size: ([\d,]+) tokens"),
    "max_concurrency": re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x"),
    "kv_cache_gib": re.compile(
        r"(?:Auto|Explicitly) set \(([\d.]+)/[\d.]+\) GiB for KV cache"
        r"|Available KV cache memory: ([\d.]+) GiB"
    ),
    "weights_gib": re.compile(r"Model loading took ([\d.]+) GiB"),
}


_KERNEL = re.compile(r"(?:Selected|Using) (\w+) for (CompressedTensors\w+)")


def quantized_kernels(text: str) -> dict[str, str]:
    """The linear kernel vLLM chose for each compressed-tensors scheme it loaded (evidence
    that a checkpoint really ran quantized), e.g. {"CompressedTensorsW8A8Int8": "CPUInt8ScaledMMLinearKernel"}."""
    return {scheme: kernel for kernel, scheme in _KERNEL.findall(text)}


def served_checkpoint_info(checkpoint: str | None, revision: str | None, log: str) -> dict[str, Any]:
    """A vLLM engine's part of a setup's quant_info, for the in-process engine and a launched
    server alike: the served checkpoint's description (none without one) and the kernels the
    engine's `log` says it chose (none where it names none)."""
    # described from the checkpoint's own quantization_config
    info = checkpoint_description(checkpoint, revision) if checkpoint else {}
    kernels = quantized_kernels(log)
    if kernels:
        info["engine_kernels"] = kernels
    return info


def parse_engine_log(text: str) -> dict[str, Any]:
    """Figures found in the log (absent ones are left out), each with the line it came from."""
    out: dict[str, Any] = {}
    for name, pattern in _PATTERNS.items():
        found = list(pattern.finditer(text))
        if not found:
            continue
        m = found[-1]  # the last occurrence: the engine's final figure
        line = text[text.rfind("\n", 0, m.start()) + 1 : text.find("\n", m.end())].strip()
        groups = [g for g in m.groups() if g is not None]
        if name == "max_concurrency":
            out[name] = {"value": float(groups[1]), "context": int(groups[0].replace(",", "")), "line": line}
        elif name == "kv_cache_tokens":
            out[name] = {"value": int(groups[0].replace(",", "")), "line": line}
        else:
            out[name] = {"value": int(float(groups[0]) * GIB), "line": line}
    return out
