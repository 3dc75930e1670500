"""The one capacity formula: how many KV-cache tokens, and so how many sequences, fit a
deployment budget. `qeval plan` and a run's recommendation both call `kv_capacity`, so they
report the same concurrency for the same setup and budget (docs/memory.md).

    pool   = gpu_memory_gib x utilization - overhead_gib - weights
    tokens = floor(pool x (1 - margin) / kv_bytes_per_token)
    sequences = tokens / context_len
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field

from qeval.strict import Strict

GIB = 2**30


class Budget(Strict):
    """The deployment target the recommendation is sized for."""

    gpu_memory_gib: float = Field(default=24.0, gt=0)
    utilization: float = Field(default=0.9, gt=0, le=1)
    context_len: int = Field(default=4096, gt=0)
    #: activations, CUDA graphs, workspaces and the CUDA context, held inside the budget
    overhead_gib: float = Field(default=1.0, ge=0)
    #: share of the KV pool lost to fragmentation and block rounding
    margin: float = Field(default=0.05, ge=0, lt=1)

    def describe(self) -> str:
        """One line for reports: what the budget is and what it holds back."""
        return (f"{self.gpu_memory_gib:g} GiB x {self.utilization:g} utilization, {self.overhead_gib:g} GiB runtime "
                f"overhead, {self.margin:.0%} fragmentation margin, {self.context_len}-token sequences")


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
