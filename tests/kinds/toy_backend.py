"""A backend from outside qeval, registered through the registry alone (QEVAL_BACKENDS): it
serves with transformers on the real tiny model (a plugin of its own would wrap its own engine
the same way), refuses quantized KV caches, adds a resume-key part and says whose rules size its
KV cache. Nothing in qeval/ names it."""

from __future__ import annotations

import sys

from qeval.backends import BackendEntry
from qeval.backends.base import Backend
from qeval.backends.hf.backend import HFBackend
from qeval.backends.hf.kv_rule import HeldKv
from qeval.config import RunConfig
from qeval.config.setups import Setup
from qeval.errors import UserError


def _validate(setup: Setup, device: str) -> None:
    if setup.kv_cache != "auto":
        raise UserError(f"setup {setup.name!r}: the toy backend keeps its KV cache at the model's dtype")


def _create(cfg: RunConfig, setup: Setup, device: str) -> Backend:
    backend = HFBackend(cfg, setup, device)
    backend.name = "toy"
    return backend


BACKEND = BackendEntry(
    "toy",
    _validate,
    check_install=lambda cfg: None,
    worker_python=lambda cfg: sys.executable,
    create=_create,
    key_parts=lambda cfg: {"toy_backend": "1"},
    kv_accounting=lambda cfg, device: HeldKv(),
)
