"""The task-kind registry: each kind of task is one folder that provides one `TaskKind` entry,
and preflight, the worker, assembly and the report loop over the registry (no per-kind
branches anywhere else). The kinds qeval ships:

    native        qeval's own task YAMLs in `tasks_dir`        qeval/tasks/native/kind.py
    lm_eval       lm-evaluation-harness tasks, groups, suites  qeval/tasks/lm_eval/kind.py
    long_context  generated long-context tasks at a list of    qeval/tasks/long_context/kind.py
                  lengths, with their results block and report section
    multi_turn    generated conversations under the model's     qeval/tasks/multi_turn/kind.py
                  chat template, a question at each turn depth (`kinds: {multi_turn: ...}`)
    generation    no tasks of its own: the divergence along     qeval/tasks/generation/kind.py
                  the generation of every generation task (`generation_divergence:`), its gates
                  at a position, results block and report section

A kind outside qeval registers without changing qeval: through the entry-point group
`qeval.task_kinds` (an installed package), or the `QEVAL_TASK_KINDS` environment variable
(`module:attribute`, comma-separated; the worker processes inherit it). Its config piece lives
under `kinds: {<name>: ...}` in the run config, validated against the entry's `spec`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from qeval.errors import UserError
from qeval.plugins import load_registry
from qeval.tasks.scoring import TaskResult, n_requests, score_task

if TYPE_CHECKING:
    import numpy as np
    from pydantic import BaseModel

    from qeval.backends.base import Backend, Progress
    from qeval.config import RunConfig
    from qeval.config.sequential import SequentialPlan
    from qeval.config.setups import Setup
    from qeval.records.preflight import Preflight
    from qeval.records.spool import TopkReader
    from qeval.records.store import RunStore
    from qeval.report.sections import ReportSection
    from qeval.results.samples import SampleRecord
    from qeval.results.schema import Results
    from qeval.tasks.native import Task

#: the kinds qeval ships, in the order their tasks appear in results.json: `module:attribute`
BUILT_IN = (
    "qeval.tasks.native.kind:KIND",
    "qeval.tasks.lm_eval.kind:KIND",
    "qeval.tasks.long_context.kind:KIND",
    "qeval.tasks.multi_turn.kind:KIND",
    "qeval.tasks.generation.kind:KIND",
)
ENTRY_POINT_GROUP = "qeval.task_kinds"
ENV_VAR = "QEVAL_TASK_KINDS"


@dataclass(frozen=True)
class Scoring:
    """What a kind's scoring gets in the worker: the loaded backend, the run, and the worker's
    own services (progress bars, the baseline's KL reference, storing one task's result)."""

    backend: Backend
    cfg: RunConfig
    setup: Setup
    #: task -> the resume-key parts preflight computed (a kind that regenerates its documents
    #: checks them against the `task` fingerprint here)
    key_parts: dict[str, dict[str, str]]
    #: a progress bar: (label, total or None) -> a context manager whose value has `.advance(n)`
    progress: Callable[[str, int | None], AbstractContextManager[Any]]
    #: the baseline's stored top-k of a perplexity or log-likelihood task (the KL reference), or None
    reference: Callable[[str], Any]
    #: store one task's result: (task, result, seconds, sha256 of its data)
    store: Callable[[str, TaskResult, float, str], None]
    #: a folder in the run directory for a task's records and top-k on their way to the store
    #: (qeval/records/spool.py: a kind that scores in chunks keeps them there, not in memory)
    scratch: Path | None = None
    #: whether this setup keeps its tasks' top-k (the baseline's: the others' KL reference)
    keeps_topk: bool = True
    #: the baseline's stored top-k of a task opened to read request by request (TopkReader), or
    #: None: what a kind that scores in chunks reads instead of `reference`'s whole arrays
    open_reference: Callable[[str], TopkReader | None] = field(default=lambda _task: None)
    #: a sequential run's plan (qeval/analysis/sequential_run.py `plan`), or None: the switch is off
    sequential: SequentialPlan | None = None
    #: the baseline's stored records of a task (a sequential setup's gates are tested against
    #: them after each chunk); None for the baseline itself
    baseline_records: Callable[[str], list[SampleRecord]] | None = None
    #: this setup's own records and top-k of a task stored under the job's key for it, or None: what
    #: a sequential cell stored at an earlier pass's horizon carries on from (qeval/tasks/sequential.py)
    stored: Callable[[str], tuple[list[SampleRecord], dict[str, np.ndarray] | None] | None] = field(
        default=lambda _task: None
    )


@dataclass(frozen=True)
class TaskKind:
    """One kind of task (see the module docstring). `expand` and `score` are required; the
    rest is optional."""

    #: the kind's name, as each of its tasks' `kind` (results.json `tasks.<name>.kind`) says
    name: str
    #: preflight: append this kind's tasks to `pre.tasks` (and its groups, suites, resolved
    #: gates), given the model's config.json; do nothing when the config asks for none
    expand: Callable[[Preflight, dict[str, Any]], None]
    #: the worker: score these pending tasks of this kind, storing each through `ctx.store`
    score: Callable[[Scoring, list[str]], None]
    #: assembly: add this kind's own block to results.json (after the comparison)
    results: Callable[[Results, Preflight, RunStore], Results] | None = None
    #: the report: this kind's section of report.md and report.html
    report: ReportSection | None = None
    #: a task's fingerprint from this machine's copy of its data, for a kind that reads files
    #: (a cluster node checks its copy against the driver's before scoring)
    fingerprint: Callable[[RunConfig, str], str] | None = None
    #: the config piece of a kind outside qeval: `kinds: {<name>: ...}`, validated with it
    spec: type[BaseModel] | None = None


@cache
def _registered(env: str) -> tuple[TaskKind, ...]:
    return tuple(load_registry(BUILT_IN, ENTRY_POINT_GROUP, env, "task kind", "KIND", TaskKind).values())


def task_kinds() -> tuple[TaskKind, ...]:
    """Every registered kind: qeval's own, then the installed and the environment's."""
    return _registered(os.environ.get(ENV_VAR, ""))


def task_kind(name: str) -> TaskKind:
    """The kind named `name`; one line naming the registered ones if there is none."""
    for entry in task_kinds():
        if entry.name == name:
            return entry
    raise UserError(f"no task kind {name!r} (registered: {', '.join(k.name for k in task_kinds())})")


def plugin_spec(cfg: RunConfig, name: str) -> Any:
    """A plugin kind's config piece (`kinds: {<name>: ...}`) validated with its `spec`, or None
    when the config has none for it."""
    raw = cfg.kinds.get(name)
    entry = task_kind(name)
    if raw is None or entry.spec is None:
        return raw
    from pydantic import ValidationError

    try:
        return entry.spec.model_validate(raw)
    except ValidationError as exc:
        from qeval.config import first_error

        raise UserError(f"kinds.{name}.{first_error(exc)}") from None


def check_plugin_pieces(cfg: RunConfig) -> None:
    """Every `kinds:` entry of the config names a registered kind, and its piece is valid."""
    for name in cfg.kinds:
        if name in {k.name for k in task_kinds() if k.spec is None}:
            raise UserError(f"kinds.{name}: the {name} kind has its own config key, not one under `kinds:`")
        plugin_spec(cfg, name)


def report_sections() -> list[ReportSection]:
    """The report sections the registered kinds provide, in registry order."""
    return [k.report for k in task_kinds() if k.report is not None]


def results_blocks() -> list[Callable[[Results, Preflight, RunStore], Results]]:
    """The results blocks the registered kinds add at assembly, in registry order."""
    return [k.results for k in task_kinds() if k.results is not None]


T = TypeVar("T")


def scored_tasks(pre: Preflight, results: Results, cls: type[T]) -> list[T]:
    """The run's tasks of class `cls` that results.json holds: what a kind's results block reads."""
    return [t for t in pre.tasks if isinstance(t, cls) and t.name in results.tasks]


def check_generation_room(cfg: RunConfig, name: str, output_type: str, max_gen_toks: int) -> None:
    """A generation task must leave room for a prompt inside the model's context."""
    if output_type == "generate_until" and max_gen_toks >= cfg.model.max_context:
        raise UserError(
            f"task {name}: max_gen_toks {max_gen_toks} leaves no room for the prompt in "
            f"model.max_context {cfg.model.max_context} (lm-eval tasks: set max_gen_toks in lm_eval.tasks)"
        )


def score_each(
    ctx: Scoring, tasks: Iterable[Task], scorer: Callable[[Scoring, Task, Progress], TaskResult] | None = None
) -> None:
    """Score qeval-form tasks (native.Task and its kin) one by one, each stored when done: the
    scoring most kinds need. `scorer` replaces `score_task` for a kind that scores some tasks its
    own way (the native kind's sequential cells: qeval/tasks/sequential.py)."""
    import time

    for task in tasks:
        t0 = time.time()
        with ctx.progress(f"{ctx.setup.name}: {task.name}", n_requests(task)) as bar:
            advance: Progress = bar.advance
            if scorer is not None:
                result = scorer(ctx, task, advance)
            else:
                result = score_task(ctx.backend, task, advance, ctx.reference(task.name))
        ctx.store(task.name, result, round(time.time() - t0, 2), task.sha256)


def names_by_kind(kinds: dict[str, str], names: Sequence[str]) -> dict[str, list[str]]:
    """The pending tasks `names` grouped by kind (task -> kind as preflight recorded it), in
    registry order; a kind no longer registered is one line."""
    out: dict[str, list[str]] = {k.name: [] for k in task_kinds()}
    for n in names:
        kind = kinds.get(n, "")
        if kind not in out:
            raise UserError(f"task {n}: its kind {kind!r} is not registered in this process")
        out[kind].append(n)
    return {k: v for k, v in out.items() if v}
