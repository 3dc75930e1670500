"""The sequential phase (`sequential: {enabled: true}`; docs/architecture.md §4, "Sequential
runs"): the gates decided by confidence sequences, in passes to a growing document horizon. Its
plan (`SequentialPlan`) travels on every job; its settings join each task's resume key; its
results block and report section are the sequence's verdicts."""

from __future__ import annotations

import sys
from dataclasses import replace

from qeval.analysis.sequential_run import cell_caps, results_block
from qeval.analysis.sequential_run import plan as sequential_plan
from qeval.analysis.sequential_run import with_keys as sequential_keys
from qeval.config.sequential import SequentialPlan
from qeval.report.sequential_gates import SECTION
from qeval.run.jobs import pass_jobs
from qeval.run.passes import PassState, first_horizon, next_horizon, pass_line
from qeval.run.phases import PreparedRun, RunPhase


def _prepare(p: PreparedRun) -> PreparedRun:
    """The plan, its keys, and pass 1's horizon (announced on stderr)."""
    seq = sequential_plan(p.pre)
    if seq is None:
        return p
    keys = sequential_keys(p.pre, p.keys, seq)
    horizon = first_horizon(seq.min_docs, seq.chunk_docs)
    state = PassState(p.pre, p.store, keys, seq)
    cap = max(cell_caps(seq).values(), default=0)
    undecided = len(state.open_cells(s.name for s in p.pre.setups))
    print(f"{p.prefix}{pass_line(1, min(horizon, cap), undecided)}", file=sys.stderr, flush=True)
    return replace(p, keys=keys, sequential=seq, horizon=horizon)


def _schedule(p: PreparedRun, number: int) -> PreparedRun | None:
    """A pass after the first (its jobs written), or None where the run is done: no cell is open
    below the cap among the setups that ran ok, the last horizon reached every cap, or the
    baseline failed."""
    if number == 1 or p.sequential is None or p.horizon is None:
        return None
    pre, store = p.pre, p.store
    cap = max(cell_caps(p.sequential).values(), default=0)
    base = store.read_outcome(pre.cfg.baseline.name)
    if p.horizon >= cap or base is None or base.status != "ok":
        return None
    ran = [s.name for s in pre.setups if (o := store.read_outcome(s.name)) is not None and o.status == "ok"]
    state = PassState(pre, store, p.keys, p.sequential)
    opened = state.open_cells(ran)
    if not opened:
        return None
    horizon = next_horizon(p.horizon)
    print(f"{p.prefix}{pass_line(number, min(horizon, cap), len(opened))}", file=sys.stderr, flush=True)
    jobs = pass_jobs(pre, p.opts, store, p.keys, p.sequential, p.prefix, horizon, state, ran, number)
    return replace(p, jobs=jobs, horizon=horizon)


PHASE = RunPhase(
    name="sequential",
    config_block="sequential",
    wanted=lambda cfg: cfg.sequential is not None and cfg.sequential.enabled,
    plan=SequentialPlan,
    keyed_by="its order, chunk and cap settings (and, past the baseline, the level, floor, gate and the "
    "baseline's task key)",
    store="samples/ (each task up to its horizon), scratch/<setup>/ (a chunked task's saved state)",
    prepare=_prepare,
    schedule=_schedule,
    results=results_block,
    report=SECTION,
)
