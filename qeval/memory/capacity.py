"""The one capacity formula: how many sequences, and so how many KV-cache tokens, fit a
deployment budget. `qeval plan` and a run's recommendation both call `kv_capacity`, so they
report the same concurrency for the same setup and budget (docs/memory.md). It takes what one
sequence of the budget's context holds (memory.layouts: per layer kind, and the state of state
layers; on a uniform model that is KV bytes per token x context_len).

    pool      = gpu_memory_gib x utilization - overhead_gib - weights
    tokens    = floor(pool x (1 - margin) x context_len / sequence_bytes)
    sequences = tokens / context_len
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from qeval.config.budget import Budget

GIB = 2**30
__all__ = ["GIB", "Budget", "Capacity", "kv_capacity"]


@dataclass(frozen=True)
class Capacity:
    """KV tokens that fit, and sequences of the budget's context length."""

    kv_cache_tokens: int
    max_concurrency: float


def kv_capacity(weights_bytes: int, sequence_bytes: int, budget: Budget) -> Capacity:
    """The formula of the module docstring; 0 tokens when the weights alone do not fit."""
    pool = budget.gpu_memory_gib * GIB * budget.utilization - budget.overhead_gib * GIB - weights_bytes
    if sequence_bytes % budget.context_len == 0:  # exact per token (a uniform model): no rounding in between
        tokens = int(pool * (1 - budget.margin) // (sequence_bytes // budget.context_len))
    else:
        tokens = int(pool * (1 - budget.margin) * budget.context_len // sequence_bytes)
    tokens = max(tokens, 0)
    return Capacity(tokens, round(tokens / budget.context_len, 2))


def whole_sequences(count: float) -> str:
    """A concurrency as text: the whole sequences that fit (rounded down, with thousands separators),
    since a fraction of a sequence is not served; the exact figure stays in results.json and --json."""
    return f"{math.floor(count):,}"
