"""The backend registry: for each engine, how a setup is checked before any model loads, how
its install is checked, which interpreter its worker runs in, and how it is created in the
worker. Everything else dispatches through `backend_entry(name)`, never on the name itself.

Importing this is cheap: each entry imports its engine only when called.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qeval.backends.base import Backend
    from qeval.config import RunConfig
    from qeval.config.setups import Setup
    from qeval.records.preflight import Preflight


@dataclass(frozen=True)
class BackendEntry:
    """What qeval needs to know of one backend."""

    name: str
    #: raise a one-line UserError for a setup this backend cannot run on the device; loads nothing
    validate_setup: Callable[[Setup, str], None]
    #: raise a one-line UserError when the engine is not installed where the workers run
    check_install: Callable[[RunConfig], None]
    #: the interpreter a setup's worker process runs in
    worker_python: Callable[[RunConfig], str]
    #: the engine, inside the worker: one instance serves one setup
    create: Callable[[RunConfig, Setup, str], Backend]
    #: raise a one-line UserError for a setup this model's config.json rules out on this backend
    validate_model: Callable[[Setup, dict[str, Any]], None] = lambda setup, config: None
    #: resume-key parts of this backend beyond the common ones (settings that change its numbers)
    key_parts: Callable[[RunConfig], dict[str, str]] = lambda cfg: {}
    #: whether setups of the `qeval quantize` methods (w8a8, w4a8, gptq, awq) are served from its
    #: checkpoints (both backends: vLLM's kernels, transformers' compressed-tensors quantizer)
    serves_checkpoints: bool = False
    #: how the engine spreads one setup over several devices: None (one device, or qeval's own
    #: worker drives them: "mp"), or "ray" (the engine places its own workers on the cluster)
    distributed: Callable[[RunConfig], str | None] = lambda cfg: None
    #: raise a one-line UserError for a task the backend cannot score (its tasks expanded, before any
    #: setup runs): an attached server that refuses prompt log-probabilities refuses likelihood tasks
    validate_tasks: Callable[[Preflight], None] = lambda pre: None
    #: as validate_setup, where the answer depends on the config too (how the openai backend's
    #: server is started: a launched vLLM refuses what the in-process engine refuses)
    validate_served: Callable[[RunConfig, Setup, str], None] = lambda cfg, setup, device: None


def _hf_validate(setup: Setup, device: str) -> None:
    from qeval.backends.hf.support import validate

    validate(setup, device)


def _hf_validate_model(setup: Setup, config: dict[str, Any]) -> None:
    from qeval.backends.hf.support import validate_model

    validate_model(setup, config)


def _hf_create(cfg: RunConfig, setup: Setup, device: str) -> Backend:
    from qeval.backends.hf.backend import HFBackend

    return HFBackend(cfg, setup, device)


def _vllm_validate(setup: Setup, device: str) -> None:
    from qeval.backends.vllm.support import validate

    validate(setup, device)


def _vllm_check_install(cfg: RunConfig) -> None:
    from qeval.backends.vllm.install import check_install

    check_install(cfg)


def _vllm_python(cfg: RunConfig) -> str:
    from qeval.backends.vllm.install import worker_python

    return worker_python(cfg)


def _vllm_create(cfg: RunConfig, setup: Setup, device: str) -> Backend:
    from qeval.backends.vllm.backend import VLLMBackend

    return VLLMBackend(cfg, setup, device)


def _vllm_key_parts(cfg: RunConfig) -> dict[str, str]:
    import json

    # the engine's scheduler decides the batching there: its settings change the numbers
    return {"engine": json.dumps(cfg.engine.model_dump(mode="json"), sort_keys=True)}


def _vllm_distributed(cfg: RunConfig) -> str | None:
    from qeval.backends.vllm.support import distributed_backend

    return distributed_backend(cfg.engine.tensor_parallel_size, cfg.engine.pipeline_parallel_size)


def _openai_validate(setup: Setup, device: str) -> None:
    from qeval.backends.openai.support import validate

    validate(setup, device)


def _openai_validate_served(cfg: RunConfig, setup: Setup, device: str) -> None:
    from qeval.backends.openai.support import validate_served

    validate_served(cfg, setup, device)


def _openai_check_install(cfg: RunConfig) -> None:
    from qeval.backends.openai.support import check_install

    check_install(cfg)


def _openai_python(cfg: RunConfig) -> str:
    from qeval.backends.openai.support import worker_python

    return worker_python(cfg)


def _openai_create(cfg: RunConfig, setup: Setup, device: str) -> Backend:
    from qeval.backends.openai.backend import OpenAIBackend

    return OpenAIBackend(cfg, setup, device)


def _openai_key_parts(cfg: RunConfig) -> dict[str, str]:
    from qeval.backends.openai.support import key_parts

    return key_parts(cfg)


def _openai_validate_tasks(pre: Preflight) -> None:
    from qeval.backends.openai.support import validate_tasks

    validate_tasks(pre)


REGISTRY: dict[str, BackendEntry] = {
    "hf": BackendEntry("hf", _hf_validate, lambda cfg: None, lambda cfg: sys.executable, _hf_create,
                       _hf_validate_model, serves_checkpoints=True),
    "vllm": BackendEntry("vllm", _vllm_validate, _vllm_check_install, _vllm_python, _vllm_create,
                         key_parts=_vllm_key_parts, serves_checkpoints=True, distributed=_vllm_distributed),
    # an OpenAI-compatible server, attached to or launched per setup (vLLM's server serves the checkpoints)
    "openai": BackendEntry("openai", _openai_validate, _openai_check_install, _openai_python, _openai_create,
                           key_parts=_openai_key_parts, serves_checkpoints=True,
                           validate_tasks=_openai_validate_tasks, validate_served=_openai_validate_served),
}


def backend_entry(name: str) -> BackendEntry:
    """The registry entry of a backend; one line naming the registered ones if there is none."""
    if name not in REGISTRY:
        from qeval.errors import UserError

        raise UserError(f"backend: {name!r} is not a backend qeval has (registered: {', '.join(REGISTRY)})")
    return REGISTRY[name]
