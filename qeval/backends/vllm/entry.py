"""The vllm backend's registry entry (qeval/backends/__init__.py): vLLM's engine in the worker's
process, run by the vLLM interpreter. Imports no engine: `create` imports vLLM when a worker calls it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from qeval.backends import BackendEntry
from qeval.backends.vllm.install import check_install, worker_python
from qeval.backends.vllm.kv_rule import PagedKv, plan_rule
from qeval.backends.vllm.serve import VllmServing
from qeval.backends.vllm.support import (
    cache_accounting,
    distributed_backend,
    validate,
    validate_engine,
    validate_model,
)

if TYPE_CHECKING:
    from qeval.backends.base import Backend
    from qeval.config import RunConfig
    from qeval.config.setups import Setup


def _placement_lines(setups: list[Setup]) -> list[str]:
    from qeval.backends.vllm.placement import placement_lines

    return placement_lines(setups)


def _create(cfg: RunConfig, setup: Setup, device: str) -> Backend:
    from qeval.backends.vllm.backend import VLLMBackend

    return VLLMBackend(cfg, setup, device)


def _key_parts(cfg: RunConfig) -> dict[str, str]:
    # the engine's scheduler decides the batching there: its settings change the numbers
    return {"engine": cfg.engine.key_json()}


BACKEND = BackendEntry(
    "vllm",
    validate,
    check_install,
    worker_python,
    _create,
    key_parts=_key_parts,
    serves_checkpoints=True,
    distributed=lambda cfg: distributed_backend(cfg.engine.tensor_parallel_size, cfg.engine.pipeline_parallel_size),
    # the LLM class's paged blocks, as qeval's worker runs it on this device
    kv_accounting=lambda cfg, device: PagedKv(cache_accounting(device)),
    plan_kv_rule=plan_rule,
    serving=VllmServing(),
    control_fields=frozenset({"max_num_seqs", "max_num_batched_tokens"}),
    validate_served=validate_engine,
    validate_model=validate_model,
    placement_lines=_placement_lines,
    batch_invariant_mode=True,
)
