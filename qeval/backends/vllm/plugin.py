"""A vLLM general plugin (entry point `vllm.general_plugins`, pyproject.toml): vLLM loads it in
every process it starts, its engine core and its workers included, which qeval starts no other
way. It acts only inside a qeval worker (`QEVAL_WORKER=1`), so other uses of vLLM in the same
environment are left alone:

- each vLLM process dies with its parent (Linux PR_SET_PDEATHSIG), so a killed `qeval run`
  leaves no engine computing (measured: its EngineCore otherwise lingered for seconds under PID 1);
- AMX tile data is requested for the process before any kernel runs. vLLM 0.32's CPU attention
  picks its AMX kernel for bfloat16 on an AMX CPU (`torch.cpu._is_amx_tile_supported()`) but
  never asks Linux for the AMX state (arch_prctl ARCH_REQ_XCOMP_PERM); it works only when a
  oneDNN bfloat16 matmul in the same process asked first. A W4A8 model has none (its linear
  layers run KleidiAI's int4 kernel), and its worker died of SIGILL in `cpu_attention_with_kv_cache`
  on an AMX Xeon. `torch.cpu._init_amx()` asks for it.
"""

from __future__ import annotations

import os


def register() -> None:
    """vLLM calls this in each of its processes (vllm.plugins.load_general_plugins)."""
    if os.environ.get("QEVAL_WORKER") != "1":
        return
    from qeval.files.processes import die_with_parent

    die_with_parent(os.getppid())
    try:
        import torch

        init_amx = getattr(torch.cpu, "_init_amx", None)
        if init_amx is not None and torch.cpu._is_amx_tile_supported():
            init_amx()
    except Exception:  # noqa: BLE001 - no AMX, or an older torch: nothing to ask for
        pass
