"""`qeval run`: the main loop, top to bottom.

preflight validate config, tasks, setups, model and device (no model loaded)
take      the output directory: refuse another run's folder, lock it against a second qeval
ceilings  the device's copy bandwidth and matmul peak, once per run (performance phase on)
advise    the config's advise: block: advice.json reused when stored under this run's
          advice key, else the advisor in a fresh process; its setup joins the run
for each setup, baseline first:
    skip it if its outcome is ok and every (setup, task) pair is stored under this run's key
    else a job: a worker process (load, score the missing tasks, measure memory, time the
    performance workload when it is not stored under this run's key, write), run by the
    config's executor: here one after another (local), or on a Ray cluster (ray)
passes    a sequential run only: the jobs above are pass 1, to a document horizon; each later
          pass (one executor call) extends the tasks of cells still undecided below the cap,
          the baseline first, until none is (qeval/run/passes.py)
assemble  results.json from the stored results whose keys match this run (others dropped, listed)
report    report.md, report.html and the summary table
serve     `recommend_by: goodput` only: every setup that scored served on the workload with
          `vllm serve` and tuned (qeval/run/serving.py), on this machine; results.json gets
          its `serving` block and the goodput recommendation, the report its section
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from qeval.analysis.assemble import assemble_results
from qeval.analysis.sequential_run import cell_caps
from qeval.analysis.sequential_run import plan as sequential_plan
from qeval.analysis.sequential_run import with_keys as sequential_keys
from qeval.backends import backend_entry
from qeval.config import RunConfig
from qeval.config.executor import ExecutorSpec
from qeval.config.sequential import SequentialPlan
from qeval.errors import UserError
from qeval.files.atomic import atomic_write_bytes
from qeval.perf.ceilings import ensure_ceilings
from qeval.records.keys import SetupKeys, setup_keys
from qeval.records.preflight import Preflight
from qeval.records.provenance import now_iso, run_info
from qeval.records.store import RunStore
from qeval.report.write import write_report
from qeval.results.advice import Advice
from qeval.results.schema import Results, read_results
from qeval.run.advice import advise_for_run, result_block
from qeval.run.executors import Executor, open_executor
from qeval.run.executors.address import cluster_address
from qeval.run.executors.worker_job import WorkerJob
from qeval.run.exits import announce_summary
from qeval.run.jobs import pass_jobs
from qeval.run.options import RunOptions
from qeval.run.passes import PassState, first_horizon, next_horizon, pass_line
from qeval.run.preflight import preflight
from qeval.run.rundir import RunDirLock, check_output, take_run_dir
from qeval.run.serving import serve_workload
from qeval.tasks.kinds import report_sections, results_blocks


@dataclass
class PreparedRun:
    """A checked run whose directory is taken: its keys, and the worker jobs still missing."""

    pre: Preflight
    opts: RunOptions
    store: RunStore
    keys: dict[str, SetupKeys]
    jobs: list[WorkerJob]
    started: str
    #: advice.json's content when the config has an `advise:` block (qeval/run/advice.py)
    advice: Advice | None = None
    #: a sequential run's plan (None: the switch is off) and its pass's horizon (qeval/run/passes.py)
    sequential: SequentialPlan | None = None
    horizon: int | None = None
    #: the job-id prefix (a sweep's model)
    prefix: str = ""


def run(cfg: RunConfig, opts: RunOptions) -> Results:
    """Run every setup of `cfg` and write RUN_DIR; returns the assembled results."""
    pre = check(cfg, opts)
    return execute([(pre, opts, "")], pre.cfg.executor, opts.force)[0]


def execute(
    runs: list[tuple[Preflight, RunOptions, str]],
    spec: ExecutorSpec,
    force: bool,
    outer: tuple[Path, str] | None = None,
    after: Callable[[list[PreparedRun], list[Results]], None] | None = None,
) -> list[Results]:
    """The one orchestration of `qeval run` and of a sweep (qeval/sweep/run.py): each checked run
    (preflight, options, job-id prefix) takes its directory (after `outer`'s, a sweep's root) and
    prepares its jobs; all of them go to one executor together; then each run is finished, and
    `after` runs while the directories are still held (a sweep's summary). Each run's summary is
    printed at the end, in order."""
    locks: list[RunDirLock] = []
    with open_executor(spec) as executor:
        try:
            if outer is not None:
                locks.append(take_run_dir(outer[0], outer[1], force))
            prepared = []
            for pre, opts, prefix in runs:
                locks.append(take_run_dir(opts.output, pre.cfg.name, force))
                prepared.append(prepare(pre, opts, prefix))
            executor.run([job for p in prepared for job in p.jobs])
            prepared = _later_passes(executor, prepared)
            results = [finish(p) for p in prepared]
            if after is not None:
                after(prepared, results)
        finally:
            for lock in reversed(locks):
                lock.release()
    for one in results:
        announce_summary(one)
    return results


def _later_passes(executor: Executor, prepared: list[PreparedRun]) -> list[PreparedRun]:
    """A sequential run's passes after the first (qeval/run/passes.py), every run's jobs of a pass
    given to the executor together; the runs as their last pass left them."""
    final = list(prepared)
    active = [i for i, p in enumerate(prepared) if p.horizon is not None]
    number = 1
    while active:
        number += 1
        going = []
        for i in active:
            nxt = _next_pass(final[i], number)
            if nxt is not None:
                final[i] = nxt
                going.append(i)
        jobs = [job for i in going for job in final[i].jobs]
        if jobs:
            executor.run(jobs)
        active = going
    return final


def _next_pass(p: PreparedRun, number: int) -> PreparedRun | None:
    """The run's next pass (its jobs written), or None where it is done: no cell is open below the
    cap among the setups that ran ok, the last horizon reached every cap, or the baseline failed."""
    assert p.sequential is not None and p.horizon is not None
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


def check(cfg: RunConfig, opts: RunOptions) -> Preflight:
    """The options applied to the config, and the whole run validated (no model loaded)."""
    if opts.limit:  # --limit overrides the config's, in the workers and the resume keys alike
        cfg = cfg.model_copy(update={"limit": opts.limit})
    if opts.executor:
        cfg = cfg.model_copy(update={"executor": cfg.executor.model_copy(update={"kind": opts.executor})})
    if opts.performance is not None:
        if not opts.performance and cfg.recommend_by in ("throughput", "latency"):
            raise UserError(f"--no-performance: recommend_by {cfg.recommend_by} needs the performance phase")
        cfg = cfg.model_copy(update={"performance": cfg.performance.model_copy(update={"enabled": opts.performance})})
    pre = preflight(cfg, opts.setups, opts.tasks)
    check_output(opts.output, pre.model_dir)
    return pre


def prepare(pre: Preflight, opts: RunOptions, prefix: str = "") -> PreparedRun:
    """The jobs still missing, baseline first, each with its job file written into RUN_DIR/jobs/
    (call it holding the run directory's lock). `prefix` makes job ids unique in a sweep."""
    started = now_iso()
    store = RunStore(opts.output)
    advice = advise_for_run(pre, store, opts.setups, opts.force)
    keys = {s.name: setup_keys(pre, s) for s in pre.cfg.setups}
    seq = sequential_plan(pre)  # None while the switch is off: keys and jobs as before it existed
    if seq is not None:
        keys = sequential_keys(pre, keys, seq)
    # the device's ceilings, once per run, before any setup (docs/performance.md)
    remote = cluster_address(pre.cfg.executor.address) if pre.cfg.executor.kind == "ray" else None
    ensure_ceilings(pre, store, backend_entry(pre.cfg.backend).worker_python(pre.cfg), remote)
    horizon = state = None
    if seq is not None:  # pass 1 of a sequential run (qeval/run/passes.py)
        horizon = first_horizon(seq.min_docs, seq.chunk_docs)
        state = PassState(pre, store, keys, seq)
        cap = max(cell_caps(seq).values(), default=0)
        undecided = len(state.open_cells(s.name for s in pre.setups))
        print(f"{prefix}{pass_line(1, min(horizon, cap), undecided)}", file=sys.stderr, flush=True)
    jobs = pass_jobs(pre, opts, store, keys, seq, prefix, horizon, state)
    return PreparedRun(pre, opts, store, keys, jobs, started, advice, seq, horizon, prefix)


def finish(prepared: PreparedRun) -> Results:
    """results.json from what the run directory holds under this run's keys, and the report."""
    pre, store = prepared.pre, prepared.store
    info = run_info(pre, prepared.opts.output) | {"started": prepared.started}
    assembled = assemble_results(pre, store, prepared.keys, info, results_blocks())
    if prepared.advice is not None:
        assembled = assembled.model_copy(update={"advice": result_block(prepared.advice)})
    atomic_write_bytes(store.results_path, (assembled.model_dump_json(indent=2) + "\n").encode())
    # the report is rendered from the file just written, as `qeval report` renders it: same bytes
    results = read_results(store.results_path)
    write_report(store.root, results, report_sections())
    if pre.cfg.recommend_by == "goodput":  # the scores are written first: the serving phase takes minutes
        results = serve_workload(pre, results, store.root, force=prepared.opts.force)
        atomic_write_bytes(store.results_path, (results.model_dump_json(indent=2) + "\n").encode())
        results = read_results(store.results_path)
        write_report(store.root, results, report_sections())
    return results
