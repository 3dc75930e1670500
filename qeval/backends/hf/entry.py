"""The hf backend's registry entry (qeval/backends/__init__.py): transformers in the worker's own
process. Imports no engine: `create` imports transformers' backend when a worker calls it."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from qeval.backends import BackendEntry
from qeval.backends.hf.kv_rule import HeldKv
from qeval.backends.hf.support import key_parts, validate, validate_model

if TYPE_CHECKING:
    from qeval.backends.base import Backend
    from qeval.config import RunConfig
    from qeval.config.setups import Setup


def _quantize_weights(model: Any, setup: Setup) -> dict[str, Any]:
    from qeval.backends.hf.quant import quantize_weights

    return quantize_weights(model, setup)


def _kv_cache_for(config: Any, setup: Setup) -> Any:
    from qeval.backends.hf.kv_cache import round_trip_cache

    return round_trip_cache(config, setup)


def _create(cfg: RunConfig, setup: Setup, device: str) -> Backend:
    from qeval.backends.hf.backend import HFBackend

    return HFBackend(cfg, setup, device)


BACKEND = BackendEntry(
    "hf",
    validate,
    check_install=lambda cfg: None,
    worker_python=lambda cfg: sys.executable,
    create=_create,
    validate_model=validate_model,
    key_parts=key_parts,  # the decoding path, where a KV setup makes it the cache's
    serves_checkpoints=True,
    # transformers' cache layers (cache_utils.py): what qeval's own worker holds per sequence
    kv_accounting=lambda cfg, device: HeldKv(),
    plan_kv_rule=lambda block_size, in_flight_tokens: HeldKv(),
    waves_from_workload=True,
    quantize_weights=_quantize_weights,
    kv_cache_for=_kv_cache_for,
    control_fields=frozenset({"batch_size"}),
)
