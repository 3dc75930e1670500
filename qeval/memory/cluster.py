"""`qeval plan`'s cluster view: for each setup, the smallest GPU group that holds its weights
and the target concurrency at the target context, and how many setups a cluster runs at once.

Each GPU gets the budget of `qeval plan` (GiB x utilization - overhead). A group of t GPUs
(tensor-parallel degree t, a power of two dividing the attention heads, on one node; past one
node, pipeline stages of whole nodes) pools t budgets: its weights and KV cache are sharded
over the group, so the one capacity formula (memory.capacity.kv_capacity) applies to the
group's total. KV heads are replicated once t exceeds their number (vLLM does this), which
costs KV bytes per token. Predictions only: no multi-GPU run has been measured by this project.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from qeval.errors import UserError
from qeval.memory.capacity import Budget, kv_capacity
from qeval.memory.layouts import KvRule, predict_sequence
from qeval.memory.ledger import ModelShape, predict_weights_bytes
from qeval.memory.planner import PLAN_SETUPS, model_shape


@dataclass(frozen=True)
class Cluster:
    """Nodes of identical GPUs."""

    nodes: int
    gpus_per_node: int


@dataclass
class ClusterRow:
    """One setup on the cluster: the group it needs (None: no group of this cluster fits it)."""

    setup: str
    tensor_parallel_size: int | None
    pipeline_parallel_size: int | None
    gpus: int | None
    kv_cache_tokens: int
    max_concurrency: float
    copies_at_once: int


def layouts(shape: ModelShape, cluster: Cluster) -> list[tuple[int, int]]:
    """(tensor, pipeline) parallel sizes to try, fewest GPUs first: powers of two within a node
    that divide the attention heads, then the largest of them over 2, 3, … whole nodes."""
    tps = [
        t
        for t in (2**i for i in range(cluster.gpus_per_node.bit_length()))
        if t <= cluster.gpus_per_node and shape.num_heads % t == 0
    ]
    return [(t, 1) for t in tps] + [(tps[-1], p) for p in range(2, cluster.nodes + 1)]


def group_kv_bytes_per_token(shape: ModelShape, kv_bytes_per_token: int, tp: int) -> int:
    """KV bytes (per token, or per sequence) over a tensor-parallel group: each GPU holds
    ceil(heads / t) KV heads, so past t = heads every GPU holds a copy; an MLA latent is one
    vector, replicated on every GPU of the group (vLLM's MLAAttentionSpec: max_tp_shards=1)."""
    heads = 1 if shape.kv_lora_rank is not None else shape.num_kv_heads
    held = math.ceil(heads / tp) * tp
    return math.ceil(kv_bytes_per_token * held / heads)


def cluster_plan(
    config: dict[str, Any],
    budget: Budget,
    cluster: Cluster,
    concurrency: int = 1,
    dtype: str = "float16",
    *,
    rule: KvRule,
) -> tuple[list[ClusterRow], int]:
    """Each plan setup's group on `cluster` for `concurrency` sequences of budget.context_len
    tokens (a sequence as the engine's accounting `rule` holds it), and how many of the setups run
    at once on the cluster."""
    if cluster.nodes < 1 or cluster.gpus_per_node < 1 or concurrency < 1:
        raise UserError("a cluster needs at least one node, one GPU per node and a concurrency of at least 1")
    shape = model_shape(config)
    rows = []
    for setup in PLAN_SETUPS:
        weights = predict_weights_bytes(shape, setup, dtype)
        seq = predict_sequence(shape, setup, dtype, budget.context_len, rule).total
        row = ClusterRow(setup.name, None, None, None, 0, 0.0, 0)
        for tp, pp in layouts(shape, cluster):
            gpus = tp * pp
            group = budget.model_copy(
                update={"gpu_memory_gib": budget.gpu_memory_gib * gpus, "overhead_gib": budget.overhead_gib * gpus}
            )
            cap = kv_capacity(weights, group_kv_bytes_per_token(shape, seq, tp), group)
            if cap.kv_cache_tokens >= budget.context_len * concurrency:
                copies = cluster.nodes * (cluster.gpus_per_node // tp) if pp == 1 else cluster.nodes // pp
                row = ClusterRow(setup.name, tp, pp, gpus, cap.kv_cache_tokens, cap.max_concurrency, copies)
                break
        rows.append(row)
    return rows, setups_at_once(rows, cluster)


def setups_at_once(rows: list[ClusterRow], cluster: Cluster) -> int:
    """How many of the setups run side by side: the smallest groups first, each tensor-parallel
    group inside one node, pipeline groups on whole free nodes."""
    free = [cluster.gpus_per_node] * cluster.nodes
    placed = 0
    for row in sorted((r for r in rows if r.gpus), key=lambda r: r.gpus or 0):
        assert row.tensor_parallel_size is not None and row.pipeline_parallel_size is not None
        if row.pipeline_parallel_size == 1:
            node = next((i for i, f in enumerate(free) if f >= row.tensor_parallel_size), None)
            if node is None:
                continue
            free[node] -= row.tensor_parallel_size
        else:
            whole = [i for i, f in enumerate(free) if f == cluster.gpus_per_node][: row.pipeline_parallel_size]
            if len(whole) < row.pipeline_parallel_size:
                continue
            for i in whole:
                free[i] = 0
        placed += 1
    return placed


def cluster_json(
    rows: list[ClusterRow], at_once: int, cluster: Cluster, gpu_gib: float, concurrency: int
) -> dict[str, Any]:
    """The `cluster` block of `qeval plan --json`."""
    return {
        "nodes": cluster.nodes,
        "gpus_per_node": cluster.gpus_per_node,
        "gpu_gib": gpu_gib,
        "concurrency": concurrency,
        "setups_at_once": at_once,
        "setups": [asdict(r) for r in rows],
    }
