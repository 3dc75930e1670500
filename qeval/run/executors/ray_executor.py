"""The `ray` executor (docs/cluster.md): each job a Ray task in a fresh worker process
(`max_calls=1`: device memory is returned between setups), reserving the resources its setup
needs (qeval.run.executors.resources), on any node of the cluster.

    driver (this process)                          a node
    submit the jobs whose `after` are done  ─────► node.run_on_node: temporary run dir,
    as soon as one finishes: fetch it, check         the same worker process, its files
    every path, write its files atomically  ◄─────   returned as bytes
    (the driver alone writes the run directory)

Faults: a job lost with its worker process or node is retried by Ray up to
`executor.max_retries` times, then recorded as failed with the cause Ray reports; an
out-of-memory kill is a result (not retried), as on `local`; Ctrl-C cancels every job still
queued or running (their workers are killed) and propagates, so the run resumes on rerun.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import OutOfMemoryError, RayError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from qeval.config.executor import ExecutorSpec
from qeval.errors import UserError
from qeval.run.executors.address import check_address, cluster_address
from qeval.run.executors.node import forwarded_env, run_on_node
from qeval.run.executors.resources import unplaceable
from qeval.run.executors.worker_job import RefusedFile, WorkerJob
from qeval.version import __version__

#: seconds between checks of running jobs (Ctrl-C is handled within one of them)
POLL_S = 1.0


@ray.remote(max_calls=1)
def _job_task(payload: dict[str, Any]) -> dict[str, Any]:
    """A Ray task running one job on its node (a fresh process per task: max_calls=1)."""
    return run_on_node(payload)


@contextmanager
def connected(spec: ExecutorSpec) -> Iterator[RayExecutor]:
    """A RayExecutor for the `with` block. A cluster address is checked and joined now, before
    the run directory is written (one line if nothing answers, or `auto` finds no cluster); a
    local Ray is started only when there is a job to run (a fully stored run starts none)."""
    address = cluster_address(spec.address)
    executor = RayExecutor(spec, address)
    if address:
        check_address(address)
        executor._connect()
    try:
        yield executor
    finally:
        if ray.is_initialized():
            ray.shutdown()


def error_text(exc: BaseException) -> str:
    """A lost job's cause as Ray reports it, one line: the task's own exception where it
    raised one, else Ray's error (WorkerCrashedError, NodeDiedError, OutOfMemoryError…)."""
    cause = exc.cause if isinstance(exc, RayTaskError) and exc.cause is not None else exc
    lines = str(cause).strip().splitlines()
    text = f"{type(cause).__name__}: {lines[0] if lines else ''}".strip()
    return f"out of memory: {text}" if isinstance(exc, OutOfMemoryError) else text


@dataclass
class _Flight:
    job: WorkerJob
    group: PlacementGroup | None
    submitted: float


def _reap_on_death() -> None:
    """A reaper for the local Ray this process just started (qeval/run/executors/reaper.py): its
    processes are stopped within a second of this driver's death, kill -9 included."""
    import psutil

    here = psutil.Process()
    started = [f"{p.pid}:{p.create_time()}" for p in here.children(recursive=True)]
    if started:
        subprocess.Popen(
            [sys.executable, "-m", "qeval.run.executors.reaper", str(here.pid), *started],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


class RayExecutor:
    """Runs jobs as Ray tasks (see the module docstring)."""

    def __init__(self, spec: ExecutorSpec, address: str | None) -> None:
        self.spec, self.address = spec, address

    def _connect(self) -> None:
        if ray.is_initialized():
            return
        # Ray retries a task its memory monitor killed forever by default, whatever max_retries
        # says: an out-of-memory is the setup's result here, as on `local`
        os.environ.setdefault("RAY_task_oom_retries", "0")
        try:
            if self.address:
                ray.init(address=self.address, logging_level=logging.ERROR, log_to_driver=False)
            else:
                ray.init(address="local", logging_level=logging.ERROR, log_to_driver=False, include_dashboard=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            lines = str(exc).strip().splitlines()
            raise UserError(
                f"cannot join the Ray cluster at {self.address or 'a new local Ray'}: "
                f"{type(exc).__name__}: {lines[0] if lines else ''}"
            ) from None
        if not self.address:
            _reap_on_death()
        where = self.address or "a local Ray started for this run"
        print(
            f"qeval: ray executor on {where}: {ray.cluster_resources().get('CPU', 0):g} CPUs, "
            f"{ray.cluster_resources().get('GPU', 0):g} GPUs",
            file=sys.stderr,
        )

    def run(self, jobs: list[WorkerJob]) -> None:
        if not jobs:
            return
        ids = {j.id for j in jobs}
        assert all(a in ids for j in jobs for a in j.after), "a job waits for a job that is not in this run"
        self._connect()
        from ray.util.queue import Queue

        # the workers' per-task progress lines, sent back as they happen (a Ray task's own output
        # stays on its node: log_to_driver is off, it would bring Ray's noise with it)
        self._progress = Queue(actor_options={"num_cpus": 0})
        waiting: list[WorkerJob] = list(jobs)
        done: set[str] = set()
        flying: dict[ray.ObjectRef, _Flight] = {}
        try:
            while waiting or flying:
                self._submit_ready(waiting, done, flying)
                if not flying:  # nothing running: every waiting job waits for one that will never run
                    assert not waiting, f"jobs wait for nothing that runs: {[j.id for j in waiting]}"
                    continue
                ready, _ = ray.wait(list(flying), num_returns=1, timeout=POLL_S)
                self._print_progress()
                for ref in ready:  # fetched at once: an unfetched result lives only on its node
                    flight = flying.pop(ref)
                    self._finish(flight, ref)
                    done.add(flight.job.id)
                for ref, flight in list(flying.items()):
                    if self._placement_timed_out(flight):
                        ray.cancel(ref, force=True)
                        flying.pop(ref)
                        self._release(flight)
                        self._lost(
                            flight.job,
                            f"its placement group {flight.job.resources.bundle} was not granted "
                            f"within {self.spec.placement_timeout_s:g} s",
                        )
                        done.add(flight.job.id)
        except KeyboardInterrupt:
            # force: a task blocked in its worker process only stops when its process is killed
            for ref in flying:
                ray.cancel(ref, force=True)
            raise
        finally:
            for flight in flying.values():
                self._release(flight)
            self._print_progress()
            self._progress.shutdown()

    def _print_progress(self) -> None:
        """Print the progress lines the running jobs' nodes sent since the last call."""
        from ray.util.queue import Empty

        try:
            lines = self._progress.get_nowait_batch(self._progress.qsize())
        except (Empty, RayError):  # nothing new, or the queue is gone with a lost node
            return
        for job_id, line in lines:
            print(f"{job_id}: {line}", file=sys.stderr)

    def _submit_ready(self, waiting: list[WorkerJob], done: set[str], flying: dict[ray.ObjectRef, _Flight]) -> None:
        """Submit every waiting job whose `after` jobs are done, up to max_parallel running; a job
        no node can hold is failed here (which may make others ready: hence the loop)."""
        progressed = True
        while progressed:
            progressed = False
            for job in [j for j in waiting if all(a in done for a in j.after)]:
                if self.spec.max_parallel and len(flying) >= self.spec.max_parallel:
                    return
                waiting.remove(job)
                progressed = True
                problem = unplaceable(job.resources, ray.nodes())
                if problem:
                    self._lost(job, f"cannot be placed on this cluster: {problem}")
                    done.add(job.id)
                    continue
                ref, flight = self._submit(job)
                flying[ref] = flight

    def _submit(self, job: WorkerJob) -> tuple[ray.ObjectRef, _Flight]:
        res = job.resources
        options: dict[str, Any] = {
            "num_cpus": res.num_cpus,
            "num_gpus": res.num_gpus,
            "max_retries": self.spec.max_retries,
            "retry_exceptions": False,
        }
        group = None
        if res.bundle is not None:
            group = placement_group([res.bundle], strategy="STRICT_PACK")
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=group, placement_group_bundle_index=0
            )
        payload = {
            "setup": job.name,
            "job": job.job.model_dump(mode="json"),
            "inputs": job.inputs(),
            "qeval_version": __version__,
            "driver_host": socket.gethostname(),
            "env": forwarded_env(),
            "threads": res.threads,
            "gpus": res.num_gpus,
            "engine_gpus": res.engine_gpus,
            "job_id": job.id,
            "progress": self._progress,
        }
        ref = _job_task.options(**options).remote(payload)
        print(f"{job.id}: submitted ({res.describe()})", file=sys.stderr)
        return ref, _Flight(job, group, time.monotonic())

    def _finish(self, flight: _Flight, ref: ray.ObjectRef) -> None:
        job = flight.job
        try:
            out = ray.get(ref)
        except RayError as exc:  # retries exhausted, node died, out of memory, the task raised
            self._lost(job, error_text(exc))
            return
        finally:
            self._release(flight)
        if out["returncode"] in (-signal.SIGINT, 130):  # Ctrl-C reached a local Ray's workers too
            raise KeyboardInterrupt
        try:
            job.accept(out["files"])
        except RefusedFile as exc:
            self._lost(job, str(exc))
            return
        if not out["outcome_written"]:
            job.record_crash(out["returncode"])
            print(f"{job.id}: worker failed on {out['node']}; the end of its log:\n{out['log_tail']}", file=sys.stderr)
        stored = job.store.read_outcome(job.name)
        status = stored.status if stored else "failed"
        print(
            f"{job.id}: {status} on {out['node']} (Ray worker {out['pid']}) in {out['seconds']:.1f} s", file=sys.stderr
        )

    def _lost(self, job: WorkerJob, cause: str) -> None:
        job.record_failure(cause)
        print(f"{job.id}: failed: {cause}", file=sys.stderr)

    def _placement_timed_out(self, flight: _Flight) -> bool:
        if flight.group is None or time.monotonic() - flight.submitted < self.spec.placement_timeout_s:
            return False
        return not flight.group.wait(timeout_seconds=0)

    @staticmethod
    def _release(flight: _Flight) -> None:
        if flight.group is not None:
            remove_placement_group(flight.group)
            flight.group = None
