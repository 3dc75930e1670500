"""The `local` executor: each job a worker process on this machine, one after another, writing
straight into the run directory (qeval's behaviour before executors existed)."""

from __future__ import annotations

import os
import signal

from qeval.run.executors.worker_job import WorkerJob, run_worker_process, worker_python


class LocalExecutor:
    """Runs jobs in the order given (the runner puts each baseline before the setups after it)."""

    def run(self, jobs: list[WorkerJob]) -> None:
        for job in jobs:
            run_locally(job)


def run_locally(job: WorkerJob) -> None:
    """One job in a fresh process; a crash is recorded, never raised; Ctrl-C is."""
    before = job.outcome_stamp()
    env = os.environ | {"TOKENIZERS_PARALLELISM": "false"}
    returncode = run_worker_process(worker_python(job.cfg, job.setup.name), job.job_path, env)
    if returncode in (-signal.SIGINT, 130):
        raise KeyboardInterrupt
    if job.outcome_stamp() in (None, before):  # died without writing: killed, segfault, OOM
        job.record_crash(returncode)
