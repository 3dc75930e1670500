"""The openai backend's registry entry (qeval/backends/__init__.py): an OpenAI-compatible server,
attached to or launched per setup (vLLM's server serves the checkpoints). Imports no engine."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qeval.backends import BackendEntry
from qeval.backends.openai.support import (
    check_install,
    key_parts,
    kv_accounting,
    validate,
    validate_served,
    validate_tasks,
    worker_python,
)
from qeval.backends.vllm.serve import VllmServing
from qeval.backends.vllm.support import validate_model

if TYPE_CHECKING:
    from qeval.backends.base import Backend
    from qeval.config import RunConfig
    from qeval.config.setups import Setup


def _create(cfg: RunConfig, setup: Setup, device: str) -> Backend:
    from qeval.backends.openai.backend import OpenAIBackend

    return OpenAIBackend(cfg, setup, device)


BACKEND = BackendEntry(
    "openai",
    validate,
    check_install,
    worker_python,
    _create,
    key_parts=key_parts,
    serves_checkpoints=True,
    validate_tasks=validate_tasks,
    validate_served=validate_served,
    # a server's device is not this machine's to know: its pool is modelled as on a GPU
    validate_model=lambda setup, config, device: validate_model(setup, config, "cuda"),
    kv_accounting=kv_accounting,
    # a launched vLLM server: `qeval goodput` starts its own; an attached one or a command is not vLLM's to tune
    serving=VllmServing(lambda cfg: cfg.server is None or (cfg.server.mode == "launch" and cfg.server.command is None)),
    takes_server=True,
    control_fields=frozenset({"concurrency"}),
)
