"""The run-phase registry: each phase of `qeval run` is one `RunPhase` entry, loaded through the
plug-in loader the task kinds and backends use (qeval/plugins.py), and the runner is one loop over
them (qeval/run/runner.py). A phase declares:

    config_block  the run config's block that asks for it (`wanted` reads it)
    plan          the typed plan it carries on the worker's job (a field of records/job.py's
                  `Job`), or None where it runs on the driver
    keyed_by      what its stored outcome is keyed by (each input a content checksum or the
                  phase's own settings): the part it adds to the resume key
    store         where it stores its outcome under the run directory (through RunStore, under
                  the run directory's lock; `--force` reuses none of it)
    prepare       before the first pass, holding the run directory: its keys, its plan, what it
                  computes once per run
    schedule      the jobs of a pass, given what is stored (None: nothing more to run)
    results       its results.json block at assembly (as a task kind's)
    finish        after results.json and the report are written (a phase that takes minutes
                  and adds its block then)
    report        its report section

The phases qeval ships, in the order they run:

    advice       `advise:`        qeval/run/phases/advice.py
    scoring      the tasks        qeval/run/phases/scoring.py
    sequential   `sequential:`    qeval/run/phases/sequential.py
    performance  `performance:`   qeval/run/phases/performance.py
    serving      `workload:` with `recommend_by: goodput`   qeval/run/phases/serving.py

A phase outside qeval registers as a task kind does: the entry-point group `qeval.run_phases`, or
the `QEVAL_RUN_PHASES` environment variable (`module:attribute`, comma-separated).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING

from qeval.plugins import load_registry
from qeval.tasks.kinds import report_sections as kind_sections
from qeval.tasks.kinds import results_blocks as kind_blocks

if TYPE_CHECKING:
    from pydantic import BaseModel

    from qeval.config import RunConfig
    from qeval.config.sequential import SequentialPlan
    from qeval.records.keys import SetupKeys
    from qeval.records.preflight import Preflight
    from qeval.records.store import RunStore
    from qeval.report.sections import ReportSection
    from qeval.results.advice import Advice
    from qeval.results.schema import Results
    from qeval.run.executors.worker_job import WorkerJob
    from qeval.run.options import RunOptions

BUILT_IN = (
    "qeval.run.phases.advice:PHASE",
    "qeval.run.phases.scoring:PHASE",
    "qeval.run.phases.sequential:PHASE",
    "qeval.run.phases.performance:PHASE",
    "qeval.run.phases.serving:PHASE",
)
ENTRY_POINT_GROUP = "qeval.run_phases"
ENV_VAR = "QEVAL_RUN_PHASES"


@dataclass
class PreparedRun:
    """A checked run whose directory is taken: its keys, the worker jobs of its current pass, and
    what its phases prepared."""

    pre: Preflight
    opts: RunOptions
    store: RunStore
    started: str
    #: the job-id prefix (a sweep's model)
    prefix: str = ""
    keys: dict[str, SetupKeys] = field(default_factory=dict)
    #: the current pass's jobs
    jobs: list[WorkerJob] = field(default_factory=list)
    #: advice.json's content when the config has an `advise:` block (qeval/run/advice.py)
    advice: Advice | None = None
    #: a sequential run's plan (None: the switch is off) and its pass's horizon (qeval/run/passes.py)
    sequential: SequentialPlan | None = None
    horizon: int | None = None


def _always(cfg: RunConfig) -> bool:
    return True


@dataclass(frozen=True)
class RunPhase:
    """One phase of a run (see the module docstring); every hook is optional."""

    name: str
    config_block: str
    #: whether this config asks for the phase
    wanted: Callable[[RunConfig], bool] = _always
    plan: type[BaseModel] | None = None
    keyed_by: str = ""
    store: str = ""
    prepare: Callable[[PreparedRun], PreparedRun] | None = None
    #: (the run, the pass's number from 1) -> the run with that pass's jobs, or None
    schedule: Callable[[PreparedRun, int], PreparedRun | None] | None = None
    results: Callable[[Results, Preflight, RunStore], Results] | None = None
    #: (the run, its results as written) -> its results with the phase's block
    assembled: Callable[[PreparedRun, Results], Results] | None = None
    finish: Callable[[PreparedRun, Results], Results] | None = None
    report: ReportSection | None = None


@cache
def _registered(env: str) -> tuple[RunPhase, ...]:
    return tuple(load_registry(BUILT_IN, ENTRY_POINT_GROUP, env, "run phase", "PHASE", RunPhase).values())


def run_phases() -> tuple[RunPhase, ...]:
    """Every registered phase, in the order they run: qeval's own, then the installed and the
    environment's."""
    return _registered(os.environ.get(ENV_VAR, ""))


def active(cfg: RunConfig) -> list[RunPhase]:
    """The phases this config asks for, in order."""
    return [p for p in run_phases() if p.wanted(cfg)]


def report_sections() -> list[ReportSection]:
    """The report sections of the registered phases, then of the task kinds: what `qeval report`,
    the run and a sweep render after the report's own tables."""
    return [p.report for p in run_phases() if p.report is not None] + kind_sections()


def results_blocks(cfg: RunConfig) -> list[Callable[[Results, Preflight, RunStore], Results]]:
    """The results blocks of this config's phases, then of the task kinds, in order."""
    return [p.results for p in active(cfg) if p.results is not None] + kind_blocks()
