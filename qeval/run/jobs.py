"""The jobs of one pass of `qeval run` (qeval/run/runner.py): per setup, baseline first, the
tasks not stored under its key (and a sequential run's short of the pass's horizon), its
performance phase when not stored under its key, each with its job file written into
RUN_DIR/jobs/ for a worker process (qeval/run/worker.py) to read."""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import TYPE_CHECKING

from qeval.analysis.sequential_run import widen as widen_pending
from qeval.config.sequential import SequentialPlan
from qeval.config.setups import Setup
from qeval.files.atomic import atomic_write_json
from qeval.perf.phase import perf_key
from qeval.records.job import Job, PerformanceJob
from qeval.records.keys import SetupKeys
from qeval.records.preflight import Preflight
from qeval.records.spool import clear_scratch
from qeval.records.store import RunStore
from qeval.results.metrics import KL_OUTPUT_TYPES
from qeval.run.executors.resources import job_resources
from qeval.run.executors.worker_job import WorkerJob
from qeval.run.options import RunOptions

if TYPE_CHECKING:
    from qeval.run.passes import PassState


def pass_jobs(
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
    # the baseline, then the setups a parity control takes its KL against, then the rest
    partners = pre.cfg.kl_partners
    for setup in sorted(pre.setups, key=lambda s: (s.name != baseline, s.name not in partners)):
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
        jobs.append(one_job(pre, store, setup, pending, k, baseline, prefix, perf if perf_pending else None, job_seq))
    return [replace(j, after=_waits_for(j, jobs, seq is not None)) for j in jobs]


def _waits_for(job: WorkerJob, jobs: list[WorkerJob], sequential: bool) -> tuple[str, ...]:
    """The jobs of this pass `job` waits for: those of the setups whose top-k its pending tasks
    take their KL against (the baseline's, a parity control's partner's); in a sequential run every
    setup waits for the baseline's, whose records it tests its gates against as it goes."""
    ids = {j.job.setup: j.id for j in jobs}
    targets = {job.job.reference[t][0] for t in job.job.tasks if t in job.job.reference}
    if sequential:
        targets.add(job.job.baseline)
    return tuple(ids[t] for t in sorted(targets) if t in ids and t != job.job.setup)


def one_job(
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
    # (the baseline's: a parity control of another setup takes its KL against that setup's top-k instead)
    partner = pre.cfg.paired_with(spec)
    teacher = pre.cfg.generation_divergence is not None and partner == baseline
    ref = {
        t.name: (partner, t.name)
        for t in pre.tasks
        if (t.output_type in KL_OUTPUT_TYPES or (teacher and t.output_type == "generate_until")) and setup != baseline
    }
    job = Job(
        config=pre.cfg,
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
        performance=PerformanceJob(key=perf, shape=pre.shape) if perf else None,
        sequential=sequential,
    )
    worker = WorkerJob(f"{prefix}{setup}", pre.cfg, spec, store, job, keys, job_resources(pre.cfg, pre.device))
    atomic_write_json(worker.job_path, job.model_dump(mode="json"))
    return worker
