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
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from qeval.analysis.assemble import assemble_results
from qeval.analysis.sequential_run import cell_caps
from qeval.analysis.sequential_run import plan as sequential_plan
from qeval.analysis.sequential_run import widen as widen_pending
from qeval.analysis.sequential_run import with_keys as sequential_keys
from qeval.backends import backend_entry
from qeval.config import RunConfig
from qeval.config.executor import ExecutorSpec
from qeval.config.sequential import SequentialPlan
from qeval.config.setups import Setup
from qeval.errors import UserError
from qeval.files.atomic import atomic_write_bytes, atomic_write_json
from qeval.perf.ceilings import ensure_ceilings
from qeval.perf.phase import perf_key
from qeval.records.job import Job, PerformanceJob
from qeval.records.keys import SetupKeys, setup_keys
from qeval.records.preflight import Preflight
from qeval.records.provenance import git_commit, now_iso
from qeval.records.spool import clear_scratch
from qeval.records.store import RunStore
from qeval.report.markdown import print_summary
from qeval.report.write import write_report
from qeval.results.advice import Advice
from qeval.results.metrics import KL_OUTPUT_TYPES
from qeval.results.schema import Results, read_results
from qeval.run.advice import advised_setup, ensure_advice, result_block, with_advised
from qeval.run.executors import Executor, open_executor
from qeval.run.executors.address import cluster_address
from qeval.run.executors.resources import job_resources
from qeval.run.executors.worker_job import WorkerJob
from qeval.run.passes import PassState, first_horizon, next_horizon, pass_line
from qeval.run.preflight import advised_names, preflight
from qeval.run.rundir import RunDirLock, take_run_dir
from qeval.run.serving import serve_workload
from qeval.tasks.kinds import report_sections, results_blocks
from qeval.version import __version__


@dataclass
class RunOptions:
    output: Path
    setups: list[str] | None = None
    tasks: list[str] | None = None
    limit: int | None = None
    force: bool = False
    #: `local` or `ray`: overrides the config's executor.kind (`qeval run --executor`)
    executor: str | None = None
    #: overrides the config's performance.enabled (`qeval run --performance/--no-performance`)
    performance: bool | None = None


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
        _announce(one)
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
    jobs = _jobs(pre, p.opts, store, p.keys, p.sequential, p.prefix, horizon, state, ran, number)
    return replace(p, jobs=jobs, horizon=horizon)


def _announce(results: Results) -> None:
    """The summary table; under recommend_by goodput each setup's tuned command, ready to paste."""
    print_summary(results)
    if results.serving is not None:
        for row in results.serving.setups:
            print(f"{row.setup}: {row.serve_command}")


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


def check_output(output: Path, model_dir: Path | None) -> None:
    """Refuse a run directory inside the model's folder, before anything is written: the model's
    checksum covers every file of that folder, so the run's own files would make each rerun see
    another model and recompute everything."""
    if model_dir is None:
        return
    out, model = output.resolve(), model_dir.resolve()
    if out == model or model in out.parents:
        raise UserError(
            f"--output {output}: inside the model folder {model_dir}: the run's files would change the "
            "model's checksum, and every rerun would recompute everything; write the run elsewhere"
        )


def prepare(pre: Preflight, opts: RunOptions, prefix: str = "") -> PreparedRun:
    """The jobs still missing, baseline first, each with its job file written into RUN_DIR/jobs/
    (call it holding the run directory's lock). `prefix` makes job ids unique in a sweep."""
    started = now_iso()
    store = RunStore(opts.output)
    advice = _advise(pre, opts, store)
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
    jobs = _jobs(pre, opts, store, keys, seq, prefix, horizon, state)
    return PreparedRun(pre, opts, store, keys, jobs, started, advice, seq, horizon, prefix)


def _jobs(
    pre: Preflight,
    opts: RunOptions,
    store: RunStore,
    keys: dict[str, SetupKeys],
    seq: SequentialPlan | None,
    prefix: str,
    horizon: int | None,
    state: PassState | None,
    later: list[str] | None = None,
    number: int = 1,
) -> list[WorkerJob]:
    """The jobs of one pass, baseline first, each with its job file written. Pass 1 (`later` None)
    is every run's: every task not stored under its key, and a sequential run's tasks short of the
    horizon; a later pass of a sequential run (`later`: the setups that ran ok) scores only its
    sequential tasks still short of the new horizon, and never forces. `number`: the pass's (its
    worker adds its times to the earlier passes': qeval/run/worker.py)."""
    baseline = pre.cfg.baseline.name
    first_pass = later is None
    force = opts.force and first_pass
    # a later pass: only the setups that ran ok (a failed one has no open cell to extend the baseline for)
    scoring = later if later is not None else [s.name for s in pre.setups]
    horizon_tasks = state.pending(scoring, horizon) if state is not None and horizon else {}
    jobs = []
    for setup in sorted(pre.setups, key=lambda s: s.name != baseline):
        if not first_pass and setup.name not in (later or []):
            continue
        k = keys[setup.name]
        extend = horizon_tasks.get(setup.name, set())
        pending = {
            t: k.task_key(t)
            for t in pre.run_tasks
            if t in extend or (first_pass and (force or not store.is_done(setup.name, t, k.task_key(t))))
        }
        if seq is not None and setup.name != baseline:  # a group cell's members are scored together
            pending = widen_pending(seq, pending, k.task_key)
        outcome = store.read_outcome(setup.name)
        perf = perf_key(k.parts, pre.cfg) if pre.cfg.performance.enabled and first_pass else None
        perf_stored = outcome.performance if outcome else None
        perf_pending = perf is not None and (
            force or perf_stored is None or perf_stored.key != perf or perf_stored.status != "ok"
        )
        if not first_pass and not pending:  # a later pass: every cell of this setup decided, or at the horizon
            continue
        if not pending and not perf_pending and outcome and outcome.status == "ok" and outcome.key == k.key:
            print(
                f"{prefix}{setup.name}: all {len(pre.run_tasks)} tasks stored, skipped (use --force to recompute)",
                file=sys.stderr,
            )
            continue
        if force:  # recompute everything: not even an interrupted task's saved chunks are taken up
            clear_scratch(store.scratch_dir(setup.name))
        # the pass's horizon, and whether a cell stored at an earlier one is carried on from (not under --force)
        job_seq = seq if seq is None else seq.for_pass(horizon, carry=not force, number=number)
        jobs.append(_job(pre, store, setup, pending, k, baseline, prefix, perf if perf_pending else None, job_seq))
    # a setup whose KL reference is the baseline's top-k waits for the baseline's job
    if jobs and jobs[0].name == baseline:
        first = jobs[0].id
        # (every setup of a sequential run: it tests its gates against the baseline's records as it goes)
        jobs = jobs[:1] + [
            replace(j, after=(first,)) if seq is not None or any(t in j.job.reference for t in j.job.tasks) else j
            for j in jobs[1:]
        ]
    return jobs


def _advise(pre: Preflight, opts: RunOptions, store: RunStore) -> Advice | None:
    """The config's advice (advise:), stored or computed now, with its setup added to the run
    (in place); None without the block. Under --setups that leaves the advised setup out, only
    stored advice is used (the advisor is not run for a setup this invocation does not run)."""
    if pre.cfg.advise is None:
        return None
    name = next(iter(advised_names(pre.cfg)))
    run_it = not opts.setups or name in opts.setups
    advice = ensure_advice(pre, store, opts.force, compute=run_it)
    if advice is not None:
        with_advised(pre, advised_setup(advice), run_it)
    return advice


def finish(prepared: PreparedRun) -> Results:
    """results.json from what the run directory holds under this run's keys, and the report."""
    pre, store = prepared.pre, prepared.store
    info = _run_info(pre, prepared.opts) | {"started": prepared.started}
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


def _job(
    pre: Preflight,
    store: RunStore,
    spec: Setup,
    tasks: dict[str, str],
    keys: SetupKeys,
    baseline: str,
    prefix: str,
    perf: str | None,
    sequential: SequentialPlan | None = None,
) -> WorkerJob:
    """One setup's job: its job file (what qeval.run.worker reads) written into RUN_DIR/jobs/."""
    setup = spec.name
    # generation tasks under generation_divergence: the baseline's top-k over its own generations
    teacher = pre.cfg.generation_divergence is not None
    ref = {
        t.name: (baseline, t.name)
        for t in pre.tasks
        if (t.output_type in KL_OUTPUT_TYPES or (teacher and t.output_type == "generate_until")) and setup != baseline
    }
    job = Job(
        config=pre.cfg.job_json(),
        dtype=pre.dtype,
        setup=setup,
        device=pre.device,
        run_dir=str(store.root),
        tasks=tasks,
        task_key_parts={t: keys.tasks[t] for t in tasks},
        task_kinds={t.name: t.kind for t in pre.tasks if t.name in tasks},
        reference=ref,
        baseline=baseline,
        key=keys.key,
        key_parts=keys.parts,
        # the performance phase, when its figures are not stored under this key yet
        performance=PerformanceJob(key=perf, shape=asdict(pre.shape) if pre.shape else None) if perf else None,
        sequential=sequential,
    )
    worker = WorkerJob(f"{prefix}{setup}", pre.cfg, spec, store, job, keys, job_resources(pre.cfg, pre.device))
    atomic_write_json(worker.job_path, job.model_dump(mode="json"))
    return worker


def _run_info(pre: Preflight, opts: RunOptions) -> dict[str, Any]:
    return {
        "name": pre.cfg.name,
        "config_hash": pre.config_hash(),  # model.dtype resolved, as it always was
        "qeval_version": __version__,
        "git_commit": git_commit(),
        "finished": now_iso(),
        "device": pre.device,
        "backend": pre.cfg.backend,
        "model_sha256": pre.model_sha256,
        "limit": pre.cfg.limit,
        "output": str(opts.output),
        "skipped_setups": pre.skipped,
        "dtype": pre.precision.dtype,
        "dtype_requested": pre.precision.requested,
        "dtype_reason": pre.precision.reason,
    }
