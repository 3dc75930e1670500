"""What `qeval plan` prints (qeval/memory/plan_command.py plans it): each setup's weights, KV
cache and the sequences that fit, as a table or as JSON (`--json`), with the cluster view and the
workload view when asked for."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from qeval.config.workload import WorkloadSpec
    from qeval.memory.cluster import Cluster, ClusterRow
    from qeval.memory.plan_command import Planned
    from qeval.memory.planner import PlanRow
    from qeval.memory.workload_plan import ServingRow
    from qeval.workload.stats import WorkloadStats
    from qeval.workload.trace import Trace


def mib(n: int) -> str:
    """Bytes as MiB, one decimal."""
    return f"{n / 2**20:,.1f} MiB"


def show_plan(p: Planned, as_json: bool) -> None:
    """The plan on stdout: JSON, or the setups' table and the views asked for."""
    from qeval.memory.cluster import cluster_json
    from qeval.memory.planner import plan_json

    gpu_gib = p.budget.gpu_memory_gib
    if as_json:
        out = plan_json(p.rows)
        if p.cluster and p.grouped:
            out["cluster"] = cluster_json(*p.grouped, p.cluster, gpu_gib, p.concurrency)
        if p.workload and p.spec:
            out["workload"] = workload_json(p.workload, p.rows, p.spec)
        if p.placement:
            out["placement"] = [line for line in p.placement if line.strip()]
        print(json.dumps(out, indent=2))
        return
    _print_setups(p)
    if p.placement:  # the config's setups by device class: where the plan's figures would be served
        print("\n".join(p.placement))
    if p.cluster and p.grouped:
        _print_cluster(p.model, p.cluster, gpu_gib, p.budget.context_len, p.concurrency, *p.grouped)
    if p.workload and p.spec:
        print_workload(p.workload, p.rows, p.spec)


def _print_setups(p: Planned) -> None:
    context_len = p.budget.context_len
    title = escape(f"{p.model} on {p.budget.gpu_memory_gib:g} GiB x {p.budget.utilization:g} ({p.engine})")
    table = Table(
        "setup",
        "weights",
        "KV / token",
        f"KV / sequence @ {context_len}",
        "KV tokens",
        f"sequences @ {context_len}",
        title=title,
    )
    for r in p.rows:
        table.add_row(
            escape(r.setup),
            f"{r.weights_bytes / 2**30:.2f} GiB",
            f"{r.kv_bytes_per_token / 1024:.1f} KiB",
            mib(r.kv_bytes_per_sequence),
            f"{r.kv_cache_tokens:,}",
            f"{math.floor(r.max_concurrency):,}" + ("" if r.fits else " (does not fit)"),
        )
    Console().print(table)
    first = p.rows[0]
    if set(first.kv_by_layer_type) != {"full"} or first.state_bytes_per_sequence:
        parts = [f"{kind} {mib(b)}" for kind, b in first.kv_by_layer_type.items()]
        parts += [f"state {mib(first.state_bytes_per_sequence)}"] if first.state_bytes_per_sequence else []
        Console().print(
            escape(
                f"{first.setup}: one {context_len}-token sequence holds {', '.join(parts)} "
                f"({p.engine}), against {mib(first.naive_kv_bytes_per_sequence)} if every layer "
                "cached every token; KV / token counts the attention layers only, below the "
                "shortest window or chunk"
            )
        )


def workload_json(planned: tuple[WorkloadStats, Trace], rows: list[PlanRow], spec: WorkloadSpec) -> dict[str, Any]:
    """`--json`'s workload block: the lengths, max-model-len, blocks and each setup's concurrency."""
    from qeval.memory.workload_plan import serving_rows
    from qeval.memory.workload_plan import workload_json as stats_json

    stats, trace = planned
    slo = spec.slo.model_dump() if spec.slo else None
    return stats_json(stats, serving_rows(rows, stats), trace.source, trace.format, trace.skipped, trace.arrivals, slo)


def print_workload(planned: tuple[WorkloadStats, Trace], rows: list[PlanRow], spec: WorkloadSpec) -> None:
    """The workload's lengths, max-model-len and what it refuses, blocks, sharing, and each setup's
    concurrency on the distribution beside the worst case."""
    from qeval.memory.workload_plan import serving_rows

    stats, trace = planned
    out = Console()
    _print_lengths(out, stats, trace)
    out.print(_concurrency_table(serving_rows(rows, stats), stats))
    if spec.slo:
        from qeval.perf.slo import ms

        targets = ", ".join(f"{k.removesuffix('_ms')} {ms(v)} ms" for k, v in spec.slo.targets().items())
        out.print(
            escape(
                f"SLO at p{spec.slo.percentile:g}: {targets} (the plan sizes memory only; `qeval goodput` serves "
                "this workload against it with `vllm serve`, as does `qeval run` with recommend_by: goodput)"
            )
        )


def _print_lengths(out: Console, stats: WorkloadStats, trace: Trace) -> None:
    """The workload's source, its request lengths, max-model-len and what it refuses, KV blocks
    per request and prefix sharing."""
    skipped = f", {trace.skipped} entries skipped (fewer than two turns)" if trace.skipped else ""
    out.print(
        escape(
            f"workload: {trace.source} ({trace.format}), {stats.requests:,} requests{skipped}; "
            f"arrivals: {trace.arrivals}"
        )
    )
    lengths = Table("tokens", "p50", "p90", "p95", "p99", "max", "mean", title="request lengths")
    for name, ls in (("prompt", stats.prompt), ("output", stats.output), ("prompt + output", stats.total)):
        lengths.add_row(name, *(f"{v:,}" for v in (ls.p50, ls.p90, ls.p95, ls.p99, ls.max)), f"{ls.mean:,.1f}")
    out.print(lengths)
    p = f"p{stats.percentile:g}"
    out.print(
        escape(
            f"max-model-len {stats.max_model_len:,}: {p} of prompt + output ({stats.percentile_tokens:,} "
            f"tokens) rounded up to whole {stats.block_size}-token KV blocks; it refuses {stats.refused:,} "
            f"of {stats.requests:,} requests ({stats.refused_share:.1%})"
        )
    )
    b = stats.blocks
    out.print(
        escape(
            f"KV blocks per admitted request (paged attention, ceil(tokens / {stats.block_size})): mean "
            f"{b.mean:g}, {p} {b.at_percentile:,}, max {b.max:,}, against "
            f"{-(-stats.max_model_len // stats.block_size):,} at max-model-len"
        )
    )
    if stats.prefix:
        x = stats.prefix
        out.print(
            escape(
                f"prefix caching: {x.groups:,} shared-prefix group(s), {x.requests_sharing:,} request(s) "
                f"reuse a prefix: {x.blocks_saved:,} blocks saved ({x.share_saved:.1%} of the blocks), mean "
                f"{x.mean_blocks_with_cache:g} blocks per request"
            )
        )


def _concurrency_table(serving: list[ServingRow], stats: WorkloadStats) -> Table:
    """Each setup's concurrent requests: the worst case, on the distribution, with prefix caching."""
    p = f"p{stats.percentile:g}"
    table = Table(
        "setup",
        "KV pool (blocks)",
        f"worst case @ {stats.max_model_len:,}",
        "distribution (mean)",
        f"at {p}",
        "with prefix cache",
        title="concurrent requests the KV pool holds",
    )
    for r in serving:
        cached = f"{r.concurrency_with_prefix_cache:,.1f}" if r.concurrency_with_prefix_cache is not None else "-"
        table.add_row(
            escape(r.setup),
            f"{r.pool_blocks:,}",
            f"{r.worst_case_concurrency:,.1f}",
            f"{r.concurrency_mean:,.1f}",
            f"{r.concurrency_at_percentile:,.1f}",
            cached,
        )
    return table


def _print_cluster(
    model: str,
    cluster: Cluster,
    gpu_gib: float,
    context_len: int,
    concurrency: int,
    rows: list[ClusterRow],
    at_once: int,
) -> None:
    table = Table(
        "setup",
        "GPUs (TP x PP)",
        "KV tokens",
        f"sequences @ {context_len}",
        "copies at once",
        title=escape(
            f"{model} on {cluster.nodes} node(s) x {cluster.gpus_per_node} GPUs of {gpu_gib:g} "
            f"GiB, {concurrency} sequence(s) each"
        ),
    )
    for r in rows:
        if r.gpus is None:
            table.add_row(escape(r.setup), "does not fit", "", "", "0")
            continue
        table.add_row(
            escape(r.setup),
            f"{r.gpus} ({r.tensor_parallel_size} x {r.pipeline_parallel_size})",
            f"{r.kv_cache_tokens:,}",
            f"{math.floor(r.max_concurrency):,}",
            str(r.copies_at_once),
        )
    Console().print(table)
    Console().print(f"all {len(rows)} setups side by side: {at_once} run at once on this cluster")
