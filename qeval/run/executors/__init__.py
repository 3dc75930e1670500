"""Executors: what runs a run's worker jobs (docs/cluster.md, docs/architecture.md §1).

The runner decides *what* runs (the jobs still missing under this run's keys, each model's
baseline before the setups that need its top-k as their KL reference) and writes every job
file; an executor decides *where*: `local` runs each job as a worker process on this
machine, one after another; `ray` runs each as a Ray task in a fresh process on any node of
a cluster and sends its files back, so that the driver alone writes the run directory.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from qeval.config.executor import ExecutorSpec
    from qeval.run.executors.worker_job import WorkerJob


class Executor(Protocol):
    """Runs worker jobs; every job ends with an outcome in its run directory (a failure
    included), except when the driver is interrupted (KeyboardInterrupt propagates)."""

    def run(self, jobs: list[WorkerJob]) -> None:
        """Run `jobs`, each only after the jobs its `after` names have finished."""
        ...


@contextmanager
def open_executor(spec: ExecutorSpec) -> Iterator[Executor]:
    """The executor `spec` names, connected (Ray: to the cluster) for the `with` block.
    A cluster that cannot be reached is a one-line UserError, before anything is written."""
    if spec.kind == "local":
        from qeval.run.executors.local import LocalExecutor

        yield LocalExecutor()
        return
    try:
        import ray  # noqa: F401
    except ImportError:
        from qeval.errors import UserError

        raise UserError(
            "executor kind ray needs Ray: pip install 'qeval[ray]' (ray 2.60.0, the version qeval's "
            "tests ran on), on the driver and on every node"
        ) from None
    from qeval.run.executors.ray_executor import connected

    with connected(spec) as executor:
        yield executor
