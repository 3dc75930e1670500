"""The one capacity formula: how many KV-cache tokens, and so how many sequences, fit a
deployment budget. `qeval plan` and a run's recommendation both call `kv_capacity`, so they
report the same concurrency for the same setup and budget (docs/memory.md).

    pool   = gpu_memory_gib x utilization - overhead_gib - weights
    tokens = floor(pool x (1 - margin) / kv_bytes_per_token)
    sequences = tokens / context_len
"""

from __future__ import annotations

from dataclasses import dataclass

from qeval.config.budget import Budget

GIB = 2**30
__all__ = ["GIB", "Budget", "Capacity", "kv_capacity"]


@dataclass(frozen=True)
class Capacity:
    """KV tokens that fit, and sequences of the budget's context length."""

    kv_cache_tokens: int
    max_concurrency: float


def kv_capacity(weights_bytes: int, kv_bytes_per_token: int, budget: Budget) -> Capacity:
    """The formula of the module docstring; 0 tokens when the weights alone do not fit."""
    pool = budget.gpu_memory_gib * GIB * budget.utilization - budget.overhead_gib * GIB - weights_bytes
    tokens = max(int(pool * (1 - budget.margin) // kv_bytes_per_token), 0)
    return Capacity(tokens, round(tokens / budget.context_len, 2))
