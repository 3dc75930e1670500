"""The `executor:` piece of the run config: where the setups' worker processes run.

    executor:
      kind: ray            # local (default): one setup after another on this machine
      address: null        # a running cluster's GCS (host:port, or auto); else RAY_ADDRESS; else a local Ray
      max_retries: 2       # re-runs of a job lost to a dead worker process or node
      max_parallel: null   # jobs at once; null: as many as the cluster's resources allow
      num_cpus_per_job: 1  # CPUs each job reserves (its OMP_NUM_THREADS too)

GPUs per job are not configured: they follow from the device and the vLLM engine's
tensor/pipeline parallel sizes (qeval.run.executors.resources).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from qeval.strict import Strict


class ExecutorSpec(Strict):
    """How a run's jobs (one per model and setup) are executed (docs/cluster.md)."""

    kind: Literal["local", "ray"] = "local"
    #: a running Ray cluster's address (host:port of its GCS, or `auto`); None: RAY_ADDRESS, else a local Ray
    address: str | None = None
    max_retries: int = Field(default=2, ge=0)
    max_parallel: int | None = Field(default=None, gt=0)
    num_cpus_per_job: float = Field(default=1.0, gt=0)
    #: a job whose resources (a placement group) are not granted within this time fails with that cause
    placement_timeout_s: float = Field(default=600.0, gt=0)

    @model_validator(mode="after")
    def _check(self) -> ExecutorSpec:
        if self.kind == "local" and self.address is not None:
            raise ValueError("executor.address applies to kind: ray only")
        return self
