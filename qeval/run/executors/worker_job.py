"""One worker job (a model's setup) as the runner prepared it, and the driver-side steps
every executor shares: starting the worker process, what a remote worker needs from the run
directory, accepting the files it sends back, and recording a job that ended without an
outcome of its own."""

from __future__ import annotations

import functools
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from qeval.files.atomic import atomic_write_bytes, atomic_write_json
from qeval.files.names import inside
from qeval.files.processes import die_with_parent
from qeval.records.job import Job, Outcome
from qeval.run.executors.resources import JobResources

if TYPE_CHECKING:
    from qeval.config import RunConfig
    from qeval.config.setups import Setup
    from qeval.records.keys import SetupKeys
    from qeval.records.store import RunStore

#: the files a worker writes for one task of its setup, in the order the driver writes them:
#: the samples and top-k first, the meta (which marks the (setup, task) pair done) last
TASK_FILES = (".jsonl", ".topk.npz", ".meta.json")


class RefusedFile(Exception):
    """A file a remote worker sent back that its job may not write."""


@dataclass(frozen=True)
class WorkerJob:
    """One setup of one run: its job file's content, where its results belong, what it needs."""

    #: unique among the jobs of one executor call: the setup, or `<model>/<setup>` in a sweep
    id: str
    cfg: RunConfig
    setup: Setup
    store: RunStore
    #: the job file's content (qeval.run.worker reads it); `run_dir` is the driver's run directory
    job: Job
    keys: SetupKeys
    resources: JobResources
    #: ids of the jobs that must finish first (the baseline, whose top-k is this job's KL reference)
    after: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.setup.name

    @property
    def job_path(self) -> Path:
        return inside(self.store.root, "jobs", f"{self.name}.json")

    def outcome_stamp(self) -> int | None:
        """The outcome file's mtime, to tell afterwards whether the worker wrote a new one."""
        path = self.store.setup_path(self.name)
        return path.stat().st_mtime_ns if path.is_file() else None

    def inputs(self) -> dict[str, bytes]:
        """What a worker on another machine reads from the run directory, by relative path:
        the setup's previous outcome (a partial rerun keeps its other tasks' timings) and the KL
        reference's top-k of each pending task scored with a KL (the baseline's, or a parity
        control's partner's), and in a sequential run the baseline's records of each pending
        sequential task or group cell's member (what the worker's monitor tests the setup's gates
        against after each chunk: without them it would never stop early), and the setup's own
        stored native and long-context cells (a later pass carries on from them:
        qeval/run/passes.py; an lm-eval task's saved state stays on the node it ran on, so there it
        scores again from its first document: the same records)."""
        wanted = [self.store.setup_path(self.name)]
        for task in self.job.tasks:
            ref = self.job.reference.get(task)
            if ref:
                wanted.append(self.store.topk_path(*ref))
            if (
                self.job.sequential is not None
                and self.name != self.job.baseline
                and task in self.job.sequential.monitored()
            ):
                wanted.append(self.store.samples_path(self.job.baseline, task))
            if (
                self.job.sequential is not None
                and task in self.job.sequential.tasks
                and self.job.task_kinds.get(task) in ("native", "long_context")
                and self.store.meta_path(self.name, task).is_file()
            ):  # a native cell stored at an earlier pass's horizon: what the next pass carries on from
                wanted += [self.store.samples_path(self.name, task), self.store.topk_path(self.name, task)]
                wanted.append(self.store.meta_path(self.name, task))
        return {p.relative_to(self.store.root).as_posix(): p.read_bytes() for p in wanted if p.is_file()}

    def allowed(self, rel: str) -> tuple[int, Path]:
        """Where a file a remote worker sent back goes, with its place in the write order;
        RefusedFile unless it is one this job writes: samples/<setup>/<pending task>.<kind>
        or setups/<setup>.json."""
        parts = PurePosixPath(rel).parts
        if parts == ("setups", f"{self.name}.json"):
            return len(TASK_FILES), self.store.setup_path(self.name)
        if len(parts) == 3 and parts[:2] == ("samples", self.name):
            for order, suffix in enumerate(TASK_FILES):
                task = parts[2].removesuffix(suffix)
                if parts[2].endswith(suffix) and task in self.job.tasks:
                    return order, inside(self.store.root, *parts)
        raise RefusedFile(f"refused a file the worker sent back: {rel[:200]!r} is not one setup {self.name} writes")

    def accept(self, files: dict[str, bytes]) -> None:
        """Write a remote worker's files into the run directory, atomically, each checked
        first (nothing is written when one is refused), the files that mark work done last."""
        placed = sorted((self.allowed(rel), data) for rel, data in files.items())
        for (order, path), _ in placed:  # as RunStore.write_task: an earlier meta never vouches for new records
            if order == 0:
                path.with_name(path.name.removesuffix(TASK_FILES[0]) + TASK_FILES[-1]).unlink(missing_ok=True)
        for (_, path), data in placed:
            atomic_write_bytes(path, data)

    def record_failure(self, error: str) -> None:
        """The setup's outcome when its worker could not write one: failed, with why."""
        atomic_write_json(
            self.store.setup_path(self.name),
            Outcome(
                name=self.name, status="failed", error=error, key=self.keys.key, key_parts=self.keys.parts
            ).model_dump(mode="json"),
        )

    def record_crash(self, returncode: int) -> None:
        """The worker process ended without writing its outcome: killed, segfault, OOM."""
        how = f"killed by signal {-returncode}" if returncode < 0 else f"exited with code {returncode}"
        error = f"worker process {how} before writing its result"
        if returncode in (-9, 137):
            error = (
                "worker killed by SIGKILL before writing its result (the kernel's out-of-memory killer does "
                "this; so does kill -9)"
            )
        if self.setup.memory_limit_mib:
            error = f"out of memory: {error}, under memory_limit_mib={self.setup.memory_limit_mib}"
        self.record_failure(error)


def run_worker_process(python: str, job_path: Path, env: dict[str, str], log: Path | None = None) -> int:
    """`python -m qeval.run.worker JOB.json`, dying with this process; its return code."""
    out = log.open("ab") if log is not None else None
    try:
        # QEVAL_WORKER: the engine's own processes know they serve a qeval worker (backends/vllm/plugin.py)
        proc = subprocess.run(
            [python, "-m", "qeval.run.worker", str(job_path)],
            env=env | {"QEVAL_WORKER": "1"},
            check=False,
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            preexec_fn=functools.partial(die_with_parent, os.getpid()),
        )
    finally:
        if out is not None:
            out.close()
    return proc.returncode


def worker_python(cfg: RunConfig, setup: str) -> str:
    """The interpreter the worker of `setup` runs in, on this machine: its backend's (the run's, or
    an engine-parity control's own)."""
    from qeval.backends import backend_entry

    served = cfg.for_setup(next(s for s in cfg.setups if s.name == setup))
    return backend_entry(served.backend).worker_python(served)
