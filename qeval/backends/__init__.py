"""Backend registry: validation (no model load) and construction by name."""

from __future__ import annotations

from qeval.backends.base import Backend
from qeval.config import RunConfig
from qeval.setups import Setup


def validate_setup(cfg: RunConfig, setup: Setup, device: str) -> None:
    """Raise UserError if `cfg.backend` cannot run `setup` on `device`. Loads no model."""
    if cfg.backend == "hf":
        from qeval.backends import hf_support

        hf_support.validate(setup, device)


def create_backend(cfg: RunConfig, setup: Setup, device: str) -> Backend:
    if cfg.backend == "hf":
        from qeval.backends.hf import HFBackend

        return HFBackend(cfg, setup, device)
    raise ValueError(f"unknown backend {cfg.backend}")  # unreachable: the config validates it
