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


def validate_backend(cfg: RunConfig) -> None:
    """Raise UserError when the backend's engine is not available in this installation."""
    if cfg.backend == "vllm":
        raise UserError("backend vllm: the vLLM engine backend is not in this qeval version yet "
                        "(its setup translation and refusals are: see qeval/backends/vllm_support.py); use backend: hf")


def create_backend(cfg: RunConfig, setup: Setup, device: str) -> Backend:
    if cfg.backend == "hf":
        from qeval.backends.hf import HFBackend

        return HFBackend(cfg, setup, device)
    raise ValueError(f"unknown backend {cfg.backend}")  # unreachable: the config validates it
