"""One setup in its own process: load, score each pending task, measure, write, exit.

    python -m qeval.run.worker JOB.json

The runner starts one of these per setup, so memory is measured cleanly, device memory
is really returned between setups, and a crash or out-of-memory ends only this setup.
Every outcome, failures included, is written to RUN_DIR/setups/<setup>.json.
"""

from __future__ import annotations

import resource
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qeval.analysis.finite import NonFiniteScores, failure_reason, task_problem
from qeval.config import RunConfig
from qeval.config.setups import Setup
from qeval.files.atomic import atomic_write_json
from qeval.memory.heap import release_free_memory, set_mmap_threshold
from qeval.records.job import Job, Outcome, read_job
from qeval.records.spool import clear_scratch
from qeval.records.store import RunStore
from qeval.results.echo import Quantization
from qeval.run.progress import progress_bar

if TYPE_CHECKING:
    from qeval.backends.base import Backend
    from qeval.tasks.kinds import Scoring

_OOM_SIGNS = ("out of memory", "can't allocate memory", "cannot allocate memory", "failed to map")


def _limit_memory(mib: int) -> None:
    """Cap the address space at what is mapped now plus `mib`: allocations past it fail
    the way they would on a device that small."""
    import psutil

    vms = psutil.Process().memory_info().vms
    cap = vms + mib * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def run_job(job: Job) -> int:
    """Serve one setup as the runner's job file says; write its outcome; 0 if it is ok."""
    cfg = job.config
    setup = next(s for s in cfg.setups if s.name == job.setup)
    store = RunStore(Path(job.run_dir))
    previous = store.read_outcome(setup.name)
    current = previous if previous is not None and previous.key == job.key else None
    # a partial rerun (--tasks) keeps the timings of the tasks it did not touch
    outcome = Outcome(
        name=setup.name, timings=dict(current.timings) if current else {}, key=job.key, key_parts=job.key_parts
    )
    t0 = time.time()
    try:
        _serve(cfg, setup, store, job, outcome)
        outcome.status = "ok"
        if not job.tasks and current is not None and current.memory:
            # a rerun for the performance phase alone scored nothing: its peak is not the scoring peak
            outcome.memory = current.memory
        if outcome.performance is None and current is not None and current.performance:
            outcome.performance = current.performance  # current (the runner asked for none): kept
    except NonFiniteScores as exc:  # scored, but not numbers: its own reason, no traceback to read
        outcome.error = str(exc)
    except Exception as exc:  # noqa: BLE001 - any failure (MemoryError included) is this setup's result
        outcome.error = _failure(exc, setup)
        outcome.traceback = traceback.format_exc(limit=8)
    outcome.timings["total_s"] = round(time.time() - t0, 2)
    if current is not None and job.sequential is not None and job.sequential.number > 1:
        _after_a_pass(outcome, current, list(job.tasks))
    atomic_write_json(store.setup_path(setup.name), outcome.model_dump(mode="json"))
    return 0 if outcome.status == "ok" else 1


def _after_a_pass(outcome: Outcome, before: Outcome, tasks: list[str]) -> None:
    """A later pass of a sequential run (qeval/run/passes.py) scored only the extensions of some
    tasks: the setup's times are the passes' together (loading, the whole job, each task carried
    on), and its memory the first pass's, which scored every task (a pass's smaller peak is not
    the scoring peak), as a rerun for the performance phase alone keeps it."""
    # what this pass timed (the rest of `timings` is the earlier passes', carried over as it was)
    for key in ("load_s", "total_s", *(f"{t}_s" for t in tasks)):
        if key in outcome.timings and key in before.timings:
            outcome.timings[key] = round(outcome.timings[key] + before.timings[key], 2)
    if before.memory:
        outcome.memory = before.memory


def _serve(cfg: RunConfig, setup: Setup, store: RunStore, job: Job, outcome: Outcome) -> None:
    """Load, score each pending task (each stored as soon as it is done, by its kind), measure
    memory, then time the performance workload where the job asks for it."""
    # import the engine's stack first (creating the backend imports its module), so that a
    # memory cap bites on the model, not on imports
    from qeval.backends import backend_entry
    from qeval.model.stack import import_model_stack

    import_model_stack()

    timings = outcome.timings
    t0 = time.time()
    # before anything large is allocated: each pass's logits then come and go as their own
    # mappings instead of raising the arena's high-water (qeval/memory/heap.py)
    set_mmap_threshold()
    # the backend reads the dtype off its config: give it the job's resolved one
    # an A/A control's conditions (and an engine-parity control's backend) in place of the run's
    engine_cfg = cfg.for_engine(job.dtype).for_setup(setup)
    backend = backend_entry(engine_cfg.backend).create(engine_cfg, setup, job.device)
    if setup.memory_limit_mib:
        _limit_memory(setup.memory_limit_mib)
    try:
        with progress_bar(f"{setup.name}: loading model", total=None) as bar:
            backend.load()
            release_free_memory()  # what loading and quantizing freed: scoring starts from what the model holds
            bar.advance(1)
        timings["load_s"] = round(time.time() - t0, 2)
        non_finite = _score_tasks(backend, cfg, setup, store, job, timings)
        outcome.memory = backend.memory()
        if non_finite:  # after every task (the finite ones are stored), before timing a setup that scored nothing
            outcome.quantization = Quantization.model_validate(backend.quant_info)
            outcome.library_versions = backend.library_versions()
            raise NonFiniteScores(failure_reason(non_finite))
        if job.performance:  # after scoring and memory: its larger batches must not show in either
            _time(backend, cfg, setup, job, outcome)
        outcome.quantization = Quantization.model_validate(backend.quant_info)  # read last: engines log some of it late
        outcome.library_versions = backend.library_versions()
    finally:
        backend.close()


def _score_tasks(
    backend: Backend, cfg: RunConfig, setup: Setup, store: RunStore, job: Job, timings: dict[str, float]
) -> list[str]:
    """Each pending task scored by its kind and stored as soon as it is done; the problems of
    those whose scores are not finite (not stored: a rerun scores them again)."""
    from qeval.tasks.kinds import names_by_kind, task_kind

    non_finite: list[str] = []

    def store_result(name: str, result: Any, seconds: float, sha256: str) -> None:
        problem = task_problem(name, result.records, result.metrics, getattr(result, "kl_distribution", None))
        if problem is not None:
            non_finite.append(problem)
            return
        _store(store, setup, job, name, result, seconds, sha256, timings)

    scratch = store.scratch_dir(setup.name)
    # what a worker killed mid-task left there, but for a chunked scoring's saved state and its
    # spools: the task carries on from its last finished chunk (qeval/tasks/lm_eval/resume.py)
    clear_scratch(scratch, keep_states=True)
    ctx = _scoring(backend, cfg, setup, store, job, store_result, scratch)
    try:
        for kind, names in names_by_kind(job.task_kinds, list(job.tasks)).items():
            task_kind(kind).score(ctx, names)
    except BaseException:  # a task that failed or was interrupted: its saved chunks stay, to resume
        clear_scratch(scratch, keep_states=True)
        raise
    # every task stored: their spools were moved out, nothing is left to resume; but for a sequential
    # run's tasks stopped at a pass's horizon, whose saved states the next pass carries on from
    clear_scratch(scratch, keep_states=job.sequential is not None)
    return non_finite


def _scoring(
    backend: Backend,
    cfg: RunConfig,
    setup: Setup,
    store: RunStore,
    job: Job,
    store_result: Callable[[str, Any, float, str], None],
    scratch: Path,
) -> Scoring:
    """What the kinds' scoring gets in this worker (qeval/tasks/kinds.py `Scoring`)."""
    from qeval.tasks.kinds import Scoring

    store_fn: Any = store_result
    if cfg.generation_divergence is not None:  # the baseline's generations teacher-forced, before storing
        from qeval.tasks.generation.teacher import teacher_forcing

        store_fn = teacher_forcing(
            store_result,
            backend,
            cfg,
            setup.name == job.baseline,
            lambda task: _reference(store, job, task),
            lambda label, total: progress_bar(label, total=total),
        )
    return Scoring(
        backend=backend,
        cfg=cfg,
        setup=setup,
        key_parts=job.task_key_parts,
        progress=lambda label, total: progress_bar(label, total=total),
        reference=lambda task: _reference(store, job, task),
        store=store_fn,
        scratch=scratch,
        keeps_topk=cfg.keeps_topk(setup.name),
        open_reference=lambda task: store.open_topk(*ref) if (ref := job.reference.get(task)) else None,
        sequential=job.sequential,
        # a sequential setup tests its gates against the baseline's records, stored before it runs
        baseline_records=None if setup.name == job.baseline else lambda task: store.read_samples(job.baseline, task),
        # a sequential cell stored at an earlier pass's horizon carries on from it (not under --force)
        stored=lambda task: _stored(store, setup.name, job, task),
    )


def _time(backend: Backend, cfg: RunConfig, setup: Setup, job: Job, outcome: Outcome) -> None:
    """The performance phase (qeval/perf/phase.py), as the job's typed plan asks."""
    from qeval.perf.phase import run_phase

    assert job.performance is not None
    with progress_bar(f"{setup.name}: performance", total=None) as bar:
        outcome.performance = run_phase(backend, cfg, setup, job.device, job.dtype, outcome.memory, job.performance)
        bar.advance(1)
    outcome.timings["performance_s"] = outcome.performance.seconds or 0.0


def _stored(store: RunStore, setup: str, job: Job, task: str) -> tuple[list[Any], Any] | None:
    """This setup's records and top-k of a sequential task stored under the job's key for it, for
    a later pass to carry on from (qeval/run/passes.py); None under --force, or where there are none."""
    if job.sequential is None or not job.sequential.carry:
        return None
    if task not in job.tasks or not store.is_done(setup, task, job.tasks[task]):
        return None
    return store.read_samples(setup, task), store.read_topk(setup, task)


def _reference(store: RunStore, job: Job, task: str) -> Any:
    """The baseline's stored top-k for a perplexity task (KL reference), if this setup needs it."""
    ref = job.reference.get(task)
    return store.read_topk(*ref) if ref else None


def _store(
    store: RunStore,
    setup: Setup,
    job: Job,
    name: str,
    result: Any,
    seconds: float,
    sha256: str,
    timings: dict[str, float],
) -> None:
    """One task's records and metrics, under its key; the baseline (and a parity control's
    partner) keeps its top-k."""
    timings[f"{name}_s"] = seconds
    topk = result.topk if (job.config.keeps_topk(setup.name) and result.topk) else None
    extra = {"seconds": seconds, "task_sha256": sha256, "key_parts": job.task_key_parts[name]}
    if getattr(result, "kl_distribution", None):  # scored against the baseline's top-k: token-level KL and Δp
        extra["kl_distribution"] = result.kl_distribution
    lengths = [n for r in result.records if isinstance(n := r.generated_tokens, int)]
    if lengths and len(lengths) == len(result.records):  # a generation task on a backend that counts
        extra["generated_tokens"] = sum(lengths) / len(lengths)
    store.write_task(setup.name, name, job.tasks[name], result.records, result.metrics, extra, topk)


def _failure(exc: BaseException, setup: Setup) -> str:
    """One line for a failed setup; allocation failures named as out of memory."""
    if isinstance(exc, MemoryError):
        error = f"out of memory: {exc or 'MemoryError'}"
    else:
        msg = str(exc).strip().splitlines()
        oom = any(s in str(exc).lower() for s in _OOM_SIGNS) or (
            setup.memory_limit_mib is not None and isinstance(exc, (OSError, ImportError)) and "map" in str(exc)
        )
        error = ("out of memory: " if oom else "") + f"{type(exc).__name__}: {msg[0] if msg else ''}"
    if setup.memory_limit_mib:  # say so: odd errors are how allocation failures often surface
        error = f"under memory_limit_mib={setup.memory_limit_mib}: {error}"
    return error


def main() -> None:
    job = read_job(Path(sys.argv[1]))
    try:
        sys.exit(run_job(job))
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
