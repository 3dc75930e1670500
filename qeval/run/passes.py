"""A sequential run's passes (issue 42; docs/architecture.md, "Sequential runs"): the baseline scores
each sequential task only as far as the furthest undecided setup needs, not to the cap.

The runner runs a sequential run in passes, each with a document horizon (a multiple of
`chunk_docs`, so it falls at a look): pass 1's is `MULTIPLIER` times the first look at or past
`min_docs`, each later pass's `MULTIPLIER` times the one before (the last pass reaches the cap). In a
pass the baseline scores each sequential task up to the horizon, carrying on from what it stored in
the pass before (its chunked scoring's saved state: qeval/tasks/lm_eval/scoring.py `until`), then
every setup with an open cell carries on up to the horizon or until its cell is decided. After the
pass, the cells still open (undecided below the cap) say whether another pass runs and which tasks
it extends: the baseline extends only those, and a setup whose every cell is decided gets no job.

Nothing here enters a resume key: a (setup, task) pair stored at a horizon is stored under the
same key it would have at the cap, and what a pass still has to score is read from the store
(how many documents each pair holds, and whether its cell is decided on them). A rerun of a
finished run therefore finds nothing open and scores nothing; an interrupted run resumes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qeval.analysis.sequential_run import (
    capped_docs,
    cell,
    cell_caps,
    cell_members,
    cell_records,
    group_ids,
    not_sequential,
    task_order,
)
from qeval.config.sequential import SequentialPlan, first_look

if TYPE_CHECKING:
    from qeval.records.keys import SetupKeys
    from qeval.records.preflight import Preflight
    from qeval.records.store import RunStore

#: each pass's horizon is this many times the one before (pass 1's: times the first look at or past
#: the floor). Each pass starts a worker per setup still scoring (a model load), so the horizon
#: grows geometrically: about log4(cap / first horizon) passes at most, and the baseline scores at
#: most 4 times what the furthest cell needed.
MULTIPLIER = 4


def first_horizon(min_docs: int, chunk_docs: int) -> int:
    """Pass 1's horizon: `MULTIPLIER` times the first look at or past `min_docs` (a multiple of
    `chunk_docs`, since looks fall after each chunk)."""
    return MULTIPLIER * first_look(min_docs, chunk_docs)


def next_horizon(horizon: int) -> int:
    """The next pass's horizon."""
    return horizon * MULTIPLIER


@dataclass(frozen=True)
class Stored:
    """One (setup, cell) pair as the store holds it under this run's keys: its documents (a group's
    pooled over its members) and, for a setup other than the baseline, whether its sequence decided
    on them."""

    n: int
    decided: bool
    #: False where the setup's records outrun the baseline's (the baseline scored again to a shorter
    #: horizon, by an interrupted --force): no sequence until the baseline holds them all
    paired: bool = True


class PassState:
    """What the store holds of a sequential run's cells, read at the start of a pass: which pairs
    are stored under the run's keys (a group's: every member), with how many documents, and which
    cells are decided. A pass unit is a cell: a task, or an lm-eval group whose members are scored
    together and pause at the same look (their horizon counts the group's pooled documents)."""

    def __init__(self, pre: Preflight, store: RunStore, keys: Mapping[str, SetupKeys], plan: SequentialPlan) -> None:
        self.pre, self.store, self.keys, self.plan = pre, store, keys, plan
        self.baseline = pre.cfg.baseline.name
        self.caps = cell_caps(plan)
        run = set(pre.run_tasks)
        #: the cells this invocation scores (--tasks), each with the tasks its records are stored under
        self.members = {c: cell_members(plan, c) for c in plan.tasks}
        self.members = {c: ms for c, ms in self.members.items() if all(m in run for m in ms)}
        self.tasks = list(self.members)
        infos = {t.name: t for t in pre.tasks}
        self._orders = {
            c: group_ids(plan, c) if plan.tasks[c].members is not None else task_order(plan, infos[c])[0]
            for c in self.tasks
        }
        self.stored: dict[tuple[str, str], Stored] = {}
        base_records = {c: self._records(self.baseline, c) for c in self.tasks if self._done(self.baseline, c)}
        for setup in pre.setups:
            for c in self.tasks:
                if not self._done(setup.name, c):
                    continue
                n = sum(meta.n for m in self.members[c] if (meta := store.read_meta(setup.name, m)) is not None)
                decided, paired = False, True
                if setup.name != self.baseline and c in base_records:
                    traj = cell(plan, c, self._orders[c], base_records[c], self._records(setup.name, c))
                    decided, paired = traj is not None and traj.stopped_at is not None, traj is not None
                self.stored[(setup.name, c)] = Stored(n, decided, paired)
        # the baseline's tasks in no cell stored short of the cap: a cell at an earlier run's horizon
        # whose gate was since removed (same key: the baseline's holds the order, not the gate). A
        # task in no cell is scored to the cap, so it is carried on to it, never read as whole.
        in_cells = plan.monitored()
        # (only tasks that could be cells, on a metric in [0, 1]: the others are scored whole)
        ordered = {t.name: t.n_docs for t in pre.tasks if not_sequential(t.kind, False, t.compared_metric) is None}
        capped = capped_docs(plan, ordered)
        self.short = {
            t
            for t in self.pre.run_tasks
            if t in capped
            and t not in in_cells
            and store.is_done(self.baseline, t, keys[self.baseline].task_key(t))
            and _stored_n(store, self.baseline, t) < capped[t]
        }

    def _done(self, setup: str, cell_name: str) -> bool:
        """Whether every task of the cell is stored under the setup's key for it."""
        k = self.keys[setup]
        return all(self.store.is_done(setup, m, k.task_key(m)) for m in self.members[cell_name])

    def _records(self, setup: str, cell_name: str) -> list[Any]:
        """The cell's stored records (a group's pooled: ids `member/id`, as its order's)."""
        return cell_records(self.plan, cell_name, lambda t: self.store.read_samples(setup, t))

    def is_open(self, setup: str, cell_name: str) -> bool:
        """A cell that may still need documents: not stored, or stored undecided below the cap, or
        stored past the baseline's records (the baseline then extends to them, pass by pass)."""
        got = self.stored.get((setup, cell_name))
        return got is None or (not got.decided and (got.n < self.caps[cell_name] or not got.paired))

    def open_cells(self, setups: Iterable[str]) -> dict[str, list[str]]:
        """Per setup (not the baseline) of `setups`, its open cells (setups with none left out)."""
        out = {s: [c for c in self.tasks if self.is_open(s, c)] for s in setups if s != self.baseline}
        return {s: cs for s, cs in out.items() if cs}

    def pending(self, setups: Iterable[str], horizon: int) -> dict[str, set[str]]:
        """Per setup of `setups`, the tasks it scores in a pass to `horizon` (a group cell's: all its
        members): a setup's open cells stored short of the horizon (or not stored); the baseline's
        cells stored short of what the setups' open cells need (the horizon, at most the cap), or
        not stored, and any task of no cell it holds short of the cap (`short`)."""
        names = list(setups)
        opened = self.open_cells(names)
        needed = {c for cs in opened.values() for c in cs}
        out: dict[str, set[str]] = {}
        for s in names:
            tasks: set[str] = set()
            for c in self.tasks:
                got = self.stored.get((s, c))
                reach = min(horizon, self.caps[c])
                if (
                    got is None
                    or (s == self.baseline and c in needed and got.n < reach)
                    or (s != self.baseline and self.is_open(s, c) and got.n < reach)
                ):
                    tasks |= set(self.members[c])
            out[s] = tasks | (self.short if s == self.baseline else set())
        return out


def pass_line(number: int, horizon: int, undecided: int) -> str:
    """The progress line a pass prints to stderr."""
    return (
        f"sequential pass {number}: horizon {horizon:,} documents; "
        f"{undecided} setup{'' if undecided == 1 else 's'} still undecided"
    )


def _stored_n(store: RunStore, setup: str, task: str) -> int:
    """The documents a stored task holds (0 where none is stored)."""
    meta = store.read_meta(setup, task)
    return meta.n if meta is not None else 0
