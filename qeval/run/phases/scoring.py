"""The scoring phase: every setup, baseline first, scores the tasks not stored under its key, in a
worker process per setup (qeval/run/worker.py), and measures its memory. Keyed per (setup, task)
by content (qeval/records/keys.py); stored as RUN_DIR/samples/<setup>/<task>.jsonl with its meta,
and the setup's outcome in RUN_DIR/setups/<setup>.json; assembled into results.json by
qeval/analysis/assemble.py."""

from __future__ import annotations

from dataclasses import replace

from qeval.records.job import Job
from qeval.records.keys import setup_keys
from qeval.run.jobs import pass_jobs
from qeval.run.passes import PassState
from qeval.run.phases import PreparedRun, RunPhase


def _prepare(p: PreparedRun) -> PreparedRun:
    return replace(p, keys={s.name: setup_keys(p.pre, s) for s in p.pre.cfg.setups})


def _schedule(p: PreparedRun, number: int) -> PreparedRun | None:
    """Pass 1: every task not stored under its key (a sequential run's up to the first horizon)."""
    if number != 1:
        return None
    state = PassState(p.pre, p.store, p.keys, p.sequential) if p.sequential is not None else None
    jobs = pass_jobs(p.pre, p.opts, p.store, p.keys, p.sequential, p.prefix, p.horizon, state)
    return replace(p, jobs=jobs)


PHASE = RunPhase(
    name="scoring",
    config_block="tasks",
    plan=Job,
    keyed_by="the model's and each checkpoint's checksums, each task's data fingerprint, the setup, "
    "the engine's settings",
    store="samples/<setup>/<task>.jsonl (+ .meta.json), setups/<setup>.json",
    prepare=_prepare,
    schedule=_schedule,
)
