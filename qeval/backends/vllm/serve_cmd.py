"""A setup's tuned engine flags as a ready `vllm serve` command line (docs/performance.md,
"Serving the workload"): the model or checkpoint, `--max-model-len` from the workload's plan,
the tuned `--max-num-seqs` (and `--max-num-batched-tokens`), `--gpu-memory-utilization` from the
budget, `--kv-cache-dtype` and `--quantization` from the setup (the vllm backend's translation
table, qeval/backends/vllm/support.py), and `--enable-prefix-caching` where the workload's
requests share prefixes. Flags as vLLM 0.32.0's EngineArgs argparse spells them."""

from __future__ import annotations

import shlex
from typing import Any

#: the engine arguments the printed command carries, in this order (others are qeval's own
#: measurement settings: seed, enforce_eager, revision pins stay only where they were set)
SHOWN = (
    "dtype",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "gpu_memory_utilization",
    "kv_cache_dtype",
    "kv_cache_dtype_skip_layers",
    "quantization",
    "enable_prefix_caching",
    "revision",
    "tensor_parallel_size",
)


def serve_command(args: dict[str, Any]) -> str:
    """`vllm serve MODEL --flag value ...` for the engine arguments `args` (engine_args' keys)."""
    parts = ["vllm", "serve", str(args["model"])]
    for key in SHOWN:
        value = args.get(key)
        if value is None or (key == "tensor_parallel_size" and value == 1):
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            if value:
                parts.append(flag)
            continue
        if key == "dtype" and value == "auto":
            continue
        if isinstance(value, list):  # a list flag (nargs="+" in vLLM's argparse): one value after another
            parts += [flag, *map(str, value)]
            continue
        parts += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return shlex.join(parts)
