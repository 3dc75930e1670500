"""The vLLM backend's piece of the run config."""

from __future__ import annotations

import json

from pydantic import Field

from qeval.strict import Strict


class EngineSpec(Strict):
    """vLLM engine settings (the `vllm` backend); memory utilization comes from `budget`."""

    max_num_seqs: int | None = Field(default=None, gt=0)
    #: tokens one scheduler step takes (vLLM's chunked-prefill budget; null: vLLM's default): a
    #: long prompt is prefilled in chunks of it, one of the serving conditions a floor can vary
    max_num_batched_tokens: int | None = Field(default=None, gt=0)
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

    def key_json(self) -> str:
        """The settings as a resume key holds them: an option added later, at its default
        (batch_invariant off, max_num_batched_tokens unset), leaves the key as it was."""
        unset = ({"batch_invariant"} if not self.batch_invariant else set()) | (
            {"max_num_batched_tokens"} if self.max_num_batched_tokens is None else set()
        )
        return json.dumps(self.model_dump(mode="json", exclude=unset), sort_keys=True)
