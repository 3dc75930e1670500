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

Each step but preflight, take and report is a run phase (qeval/run/phases/): the runner prepares
the phases the config asks for, then runs pass after pass while a phase schedules jobs, then
assembles with the phases' results blocks and lets the phases finish.
assemble  results.json from the stored results whose keys match this run (others dropped, listed)
report    report.md, report.html and the summary table
serve     `recommend_by: goodput` only: every setup that scored served on the workload with
          `vllm serve` and tuned (qeval/run/serving.py), on this machine; results.json gets
          its `serving` block and the goodput recommendation, the report its section
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from qeval.analysis.assemble import assemble_results
from qeval.config import RunConfig
from qeval.config.executor import ExecutorSpec
from qeval.errors import UserError
from qeval.files.atomic import atomic_write_bytes
from qeval.records.preflight import Preflight
from qeval.records.provenance import now_iso, run_info
from qeval.records.store import RunStore
from qeval.report.write import write_report
from qeval.results.schema import Results, read_results
from qeval.run.executors import Executor, open_executor
from qeval.run.exits import announce_summary
from qeval.run.options import RunOptions
from qeval.run.phases import PreparedRun, active, report_sections, results_blocks
from qeval.run.preflight import preflight
from qeval.run.rundir import RunDirLock, check_output, take_run_dir

__all__ = ["PreparedRun", "check", "execute", "finish", "prepare", "run"]


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
    prepares its phases; each pass's jobs of all of them go to one executor together; then each
    run is finished, and `after` runs while the directories are still held (a sweep's summary).
    Each run's summary is printed at the end, in order."""
    locks: list[RunDirLock] = []
    with open_executor(spec) as executor:
        try:
            if outer is not None:
                locks.append(take_run_dir(outer[0], outer[1], force))
            prepared = []
            for pre, opts, prefix in runs:
                locks.append(take_run_dir(opts.output, pre.cfg.name, force))
                prepared.append(prepare(pre, opts, prefix))
            prepared = _passes(executor, prepared)
            results = [finish(p) for p in prepared]
            if after is not None:
                after(prepared, results)
        finally:
            for lock in reversed(locks):
                lock.release()
    for one in results:
        announce_summary(one)
    return results


def _schedule(p: PreparedRun, number: int) -> PreparedRun | None:
    """The run with pass `number`'s jobs from the first of its phases that schedules one, or None."""
    for phase in active(p.pre.cfg):
        if phase.schedule is not None and (nxt := phase.schedule(p, number)) is not None:
            return nxt
    return None


def _passes(executor: Executor, prepared: list[PreparedRun]) -> list[PreparedRun]:
    """Pass after pass, every run's jobs of a pass given to the executor together, while a phase
    of some run schedules another (a sequential run's: qeval/run/passes.py); the runs as their
    last pass left them."""
    final = list(prepared)
    going = list(range(len(final)))
    number = 1
    while going:
        executor.run([job for i in going for job in final[i].jobs])
        number += 1
        still = []
        for i in going:
            nxt = _schedule(final[i], number)
            if nxt is not None:
                final[i] = nxt
                still.append(i)
        going = still
    return final


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
    """Each phase the config asks for prepared, in order (the advisor's setup joins, the keys, a
    sequential plan, the device's ceilings), and pass 1's jobs, baseline first, each with its job
    file written into RUN_DIR/jobs/ (call it holding the run directory's lock). `prefix` makes job
    ids unique in a sweep."""
    p = PreparedRun(pre, opts, RunStore(opts.output), now_iso(), prefix)
    for phase in active(pre.cfg):
        if phase.prepare is not None:
            p = phase.prepare(p)
    return _schedule(p, 1) or p


def finish(prepared: PreparedRun) -> Results:
    """results.json from what the run directory holds under this run's keys, and the report; then
    each phase that finishes after them (the serving phase takes minutes: the scores are written
    first), and both written again."""
    pre, store = prepared.pre, prepared.store
    info = run_info(pre, prepared.opts.output) | {"started": prepared.started}
    results = assemble_results(pre, store, prepared.keys, info, results_blocks(pre.cfg))
    for phase in active(pre.cfg):
        if phase.assembled is not None:
            results = phase.assembled(prepared, results)
    results = _write(store, results)
    for phase in active(pre.cfg):
        if phase.finish is not None:
            results = _write(store, phase.finish(prepared, results))
    return results


def _write(store: RunStore, results: Results) -> Results:
    """results.json written, and the report rendered from the file just written, as `qeval report`
    renders it: the same bytes."""
    atomic_write_bytes(store.results_path, (results.model_dump_json(indent=2) + "\n").encode())
    written = read_results(store.results_path)
    write_report(store.root, written, report_sections())
    return written
