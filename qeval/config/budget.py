"""The deployment budget a recommendation is sized for (memory.capacity holds the formula)."""

from __future__ import annotations

from pydantic import Field

from qeval.strict import Strict


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
        return (
            f"{self.gpu_memory_gib:g} GiB x {self.utilization:g} utilization, {self.overhead_gib:g} GiB runtime "
            f"overhead, {self.margin:.0%} fragmentation margin, {self.context_len}-token sequences"
        )
