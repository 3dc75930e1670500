"""The vLLM backend's piece of the run config."""

from __future__ import annotations

from pydantic import Field

from qeval.strict import Strict


class EngineSpec(Strict):
    """vLLM engine settings (the `vllm` backend); memory utilization comes from `budget`."""

    max_num_seqs: int | None = Field(default=None, gt=0)
    tensor_parallel_size: int = Field(default=1, gt=0)
    #: pipeline stages, one per node: vLLM's Ray backend spreads them over the cluster (docs/cluster.md)
    pipeline_parallel_size: int = Field(default=1, gt=0)
    enforce_eager: bool = True  # CUDA graphs cost start-up time and memory that scoring does not need
    #: vLLM's batch-invariant mode (VLLM_BATCH_INVARIANT=1: kernels whose results do not depend on
    #: the batch a request lands in; GPU builds only): with it on, an A/A control's floor must be
    #: zero, and a run that finds otherwise says so (docs/statistics.md, "The noise floor")
    batch_invariant: bool = False
    #: the CPU build reserves this share of *host* memory (its `gpu_memory_utilization`)
    cpu_memory_utilization: float = Field(default=0.2, gt=0, le=1)
