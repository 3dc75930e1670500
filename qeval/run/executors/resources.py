"""What one job reserves on a cluster, from the device and the vLLM engine's parallel sizes,
and whether any node of a cluster can grant it.

    device cpu                      num_cpus_per_job CPUs, no GPU
    cuda, one GPU                   1 GPU
    cuda, tensor_parallel_size t    one placement-group bundle of t GPUs on one node: qeval's
                                    worker drives them all (vLLM's multiprocessing backend)
    cuda, pipeline_parallel_size p  no GPU for the job itself: vLLM's Ray backend places its
                                    t x p workers on the cluster (its own placement group)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qeval.backends import backend_entry

if TYPE_CHECKING:
    from qeval.config import RunConfig


@dataclass(frozen=True)
class JobResources:
    """The resources a job's Ray task reserves, and the GPUs its engine reserves beside it."""

    num_cpus: float
    #: GPUs the job's own process holds (Ray sets CUDA_VISIBLE_DEVICES to them)
    num_gpus: int = 0
    #: GPUs vLLM's Ray backend reserves for its own workers (pipeline stages across nodes)
    engine_gpus: int = 0

    @property
    def bundle(self) -> dict[str, float] | None:
        """The one placement-group bundle of a tensor-parallel job (one process drives every
        GPU of its group, so they must come as one bundle on one node); None otherwise."""
        return {"CPU": self.num_cpus, "GPU": float(self.num_gpus)} if self.num_gpus > 1 else None

    @property
    def threads(self) -> int:
        """OMP_NUM_THREADS for the worker: the CPUs reserved, as Ray itself sets it."""
        return max(1, int(self.num_cpus))

    def describe(self) -> str:
        text = f"{self.num_cpus:g} CPU" + ("s" if self.num_cpus != 1 else "")
        if self.num_gpus:
            text += f" and {self.num_gpus} GPU" + ("s" if self.num_gpus > 1 else "") + " on one node"
        if self.engine_gpus:
            text += f", and {self.engine_gpus} GPUs for vLLM's own workers across the cluster"
        return text


def job_resources(cfg: RunConfig, device: str) -> JobResources:
    """What each job of `cfg` reserves (see the module docstring)."""
    cpus = cfg.executor.num_cpus_per_job
    if device != "cuda":
        return JobResources(cpus)
    tp, pp = cfg.engine.tensor_parallel_size, cfg.engine.pipeline_parallel_size
    if backend_entry(cfg.backend).distributed(cfg) == "ray":
        return JobResources(cpus, engine_gpus=tp * pp)
    return JobResources(cpus, num_gpus=tp)


def unplaceable(res: JobResources, nodes: list[dict[str, Any]]) -> str | None:
    """Why no node of the cluster can ever grant `res` (`ray.nodes()` entries), or None. A
    request no node can hold would wait forever in Ray's queue: it fails the setup instead."""
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive")]
    if any(r.get("CPU", 0) >= res.num_cpus and r.get("GPU", 0) >= res.num_gpus for r in alive):
        if sum(r.get("GPU", 0) for r in alive) >= res.engine_gpus:
            return None
        return f"needs {res.engine_gpus} GPUs across the cluster; it has {sum(r.get('GPU', 0) for r in alive):g}"
    best: dict[str, float] = max(alive, key=lambda r: (r.get("GPU", 0), r.get("CPU", 0)), default={})
    return (
        f"needs {res.describe()}; the largest node of the cluster has {best.get('CPU', 0):g} CPUs and "
        f"{best.get('GPU', 0):g} GPUs"
    )
