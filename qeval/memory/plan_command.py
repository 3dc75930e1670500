"""`qeval plan`: the options checked, the model's setups planned against the budget, and (with
--gpus-per-node) on a cluster, (with --workload) on a workload's lengths. The command line
(qeval/cli.py) parses the options into a `PlanRequest`; what is printed is qeval/report/plan.py's."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qeval.errors import UserError
from qeval.memory.capacity import Budget

if TYPE_CHECKING:
    from qeval.config.setups import Setup
    from qeval.config.workload import WorkloadSpec
    from qeval.memory.cluster import Cluster, ClusterRow
    from qeval.memory.layouts import KvRule
    from qeval.memory.planner import PlanRow
    from qeval.memory.workload_plan import WorkloadSource
    from qeval.workload.stats import WorkloadStats
    from qeval.workload.trace import Trace


@dataclass(frozen=True)
class PlanRequest:
    """`qeval plan`'s options as given (None: not given, the default applies)."""

    model: str | None = None
    gpu_gib: float | None = None
    utilization: float | None = None
    context_len: int | None = None
    margin: float | None = None
    overhead_gib: float | None = None
    gpus_per_node: int | None = None
    nodes: int | None = None
    concurrency: int | None = None
    engine: str = "vllm"
    block_size: int = 16
    max_num_batched_tokens: int = 2048
    workload: Path | None = None
    percentile: float | None = None
    workload_format: str | None = None
    custom_output_len: int | None = None


@dataclass(frozen=True)
class Planned:
    """What `qeval plan` prints: every setup's row, and the cluster and workload views asked for."""

    model: str
    engine: str
    budget: Budget
    rows: list[PlanRow]
    concurrency: int
    cluster: Cluster | None = None
    grouped: tuple[list[ClusterRow], int] | None = None
    workload: tuple[WorkloadStats, Trace] | None = None
    spec: WorkloadSpec | None = None
    #: where the run config's setups run on the engine by device class (its backend's placement
    #: capability; empty without a config or where the engine has none)
    placement: list[str] = field(default_factory=list)


def _check_options(req: PlanRequest) -> None:
    """One line for options that cannot go together, or numbers click's ranges let through (inf
    and nan: every comparison with nan is false)."""
    for name in ("gpu_gib", "utilization", "margin", "overhead_gib", "percentile"):
        value = getattr(req, name)
        if value is not None and not math.isfinite(value):
            raise UserError(f"--{name.replace('_', '-')} {value}: expected a finite number")
    if req.gpus_per_node is None and (req.nodes is not None or req.concurrency is not None):
        raise UserError(
            f"{'--nodes' if req.nodes is not None else '--concurrency'} applies to the cluster view: "
            "give --gpus-per-node too"
        )
    if req.workload is None and (req.percentile, req.workload_format, req.custom_output_len) != (None, None, None):
        raise UserError("--percentile, --workload-format and --custom-output-len apply to --workload: give it too")
    if req.workload is not None and req.context_len is not None:
        raise UserError("--context-len and --workload: the workload's max-model-len is the context")


#: the KV accounting `--engine` names, at its --block-size and --max-num-batched-tokens; UserError
#: (one line) for an engine it may not name (the backends' entries decide: backends.plan_kv_rule)
RuleOf = Callable[[str, int, int], "KvRule"]
#: the engine's placement lines for a list of setups (BackendEntry.placement_lines)
PlaceOf = Callable[[list["Setup"]], list[str]]


def plan_setups(req: PlanRequest, rule_of: RuleOf, place: PlaceOf | None = None) -> Planned:
    """The plan `req` asks for, each sequence held as `rule_of` says `req.engine` holds it, and a
    run config's setups placed on device classes by `place` (the engine's placement capability);
    UserError (one line) for bad options, a model or workload that cannot be read."""
    from qeval.memory.cluster import Cluster, cluster_plan
    from qeval.memory.planner import load_model_config, plan
    from qeval.memory.workload_plan import workload_source

    _check_options(req)
    rule = rule_of(req.engine, req.block_size, req.max_num_batched_tokens)
    source = workload_source(req.workload, req.workload_format, req.custom_output_len) if req.workload else None
    run_cfg = source.run if source else None
    model = req.model or (run_cfg.model.path if run_cfg else None)
    if model is None:
        raise UserError("--model is required (or --workload with a run config, whose model is planned)")
    given = {
        "gpu_memory_gib": req.gpu_gib,
        "utilization": req.utilization,
        "context_len": req.context_len,
        "overhead_gib": req.overhead_gib,
        "margin": req.margin,
    }
    base = run_cfg.budget if run_cfg else Budget()
    budget = Budget(**(base.model_dump() | {k: v for k, v in given.items() if v is not None}))
    config = load_model_config(model)
    planned = _plan_workload(source, model, config, req.percentile, req.block_size) if source else None
    if planned:
        budget = Budget(**(budget.model_dump() | {"context_len": planned[0].max_model_len}))
    # a run config's own setups after the standard rows (its controls serve a setup already planned)
    own = [s for s in run_cfg.setups if s.control is None and not s.baseline] if run_cfg else None
    rows = plan(config, budget, rule=rule, setups=own)
    concurrency = req.concurrency or 1
    cluster = Cluster(req.nodes or 1, req.gpus_per_node) if req.gpus_per_node else None
    grouped = cluster_plan(config, budget, cluster, concurrency, rule=rule) if cluster else None
    placement = place(own or []) if place is not None else []  # no config: each format the engine offers
    return Planned(
        model,
        req.engine,
        budget,
        rows,
        concurrency,
        cluster,
        grouped,
        planned,
        source.spec if source else None,
        placement,
    )


def _plan_workload(
    source: WorkloadSource, model: str, config: dict[str, Any], percentile: float | None, block_size: int
) -> tuple[WorkloadStats, Trace]:
    """The workload's requests, checked against the model's context (a run config's
    model.max_context, else config.json's), and their plan at the percentile and block size."""
    from qeval.memory.workload_plan import model_context, tokenizer_source
    from qeval.workload.draw import requests_of
    from qeval.workload.stats import summarize
    from qeval.workload.tokens import TokenCounter

    run = source.run
    own = run is not None and run.model.path == model  # --model names another model: its own context
    context = run.model.max_context if run is not None and own else model_context(config)
    tok, why = tokenizer_source(model)
    counter = TokenCounter(
        tok, run.model.trust_remote_code if run and own else False, run.model.revision if run and own else None, why
    )
    trace = requests_of(source.spec, counter, context)
    return summarize(trace, percentile or source.spec.max_model_len_percentile, block_size, context), trace
