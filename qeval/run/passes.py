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

from qeval.analysis.sequential_run import cell, task_order

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
    return MULTIPLIER * (-(-min_docs // chunk_docs) * chunk_docs)


def next_horizon(horizon: int) -> int:
    """The next pass's horizon."""
    return horizon * MULTIPLIER


def caps(plan: Mapping[str, Any]) -> dict[str, int]:
    """Each sequential task's documents up to the cap (`max_docs`, else the whole set)."""
    cap = plan["max_docs"]
    return {t: min(spec["n_docs"], cap or spec["n_docs"]) for t, spec in plan["tasks"].items()}


@dataclass(frozen=True)
class Stored:
    """One (setup, task) pair as the store holds it under this run's key: its documents and,
    for a cell, whether its sequence decided on them."""

    n: int
    decided: bool


class PassState:
    """What the store holds of a sequential run's tasks, read at the start of a pass: which pairs
    are stored under the run's keys, with how many documents, and which cells are decided."""

    def __init__(self, pre: Preflight, store: RunStore, keys: Mapping[str, SetupKeys], plan: Mapping[str, Any]) -> None:
        self.pre, self.store, self.keys, self.plan = pre, store, keys, plan
        self.baseline = pre.cfg.baseline.name
        self.caps = caps(plan)
        #: the sequential tasks this invocation scores (--tasks)
        self.tasks = [t for t in pre.run_tasks if t in plan["tasks"]]
        infos = {t.name: t for t in pre.tasks}
        self._orders = {t: task_order(dict(plan), infos[t])[0] for t in self.tasks}
        self.stored: dict[tuple[str, str], Stored] = {}
        base_records = {t: store.read_samples(self.baseline, t) for t in self.tasks if self._done(self.baseline, t)}
        for setup in pre.setups:
            for t in self.tasks:
                if not self._done(setup.name, t):
                    continue
                meta = store.read_meta(setup.name, t) or {}
                n = int(meta.get("n", 0))
                decided = False
                if setup.name != self.baseline and t in base_records:
                    traj = cell(dict(plan), t, self._orders[t], base_records[t], store.read_samples(setup.name, t))
                    decided = traj is not None and traj.stopped_at is not None
                self.stored[(setup.name, t)] = Stored(n, decided)

    def _done(self, setup: str, task: str) -> bool:
        return self.store.is_done(setup, task, self.keys[setup].task_key(task))

    def is_open(self, setup: str, task: str) -> bool:
        """A cell that may still need documents: not stored, or stored undecided below the cap."""
        got = self.stored.get((setup, task))
        return got is None or (not got.decided and got.n < self.caps[task])

    def open_cells(self, setups: Iterable[str]) -> dict[str, list[str]]:
        """Per setup (not the baseline) of `setups`, its open cells' tasks (setups with none left out)."""
        out = {s: [t for t in self.tasks if self.is_open(s, t)] for s in setups if s != self.baseline}
        return {s: ts for s, ts in out.items() if ts}

    def pending(self, setups: Iterable[str], horizon: int) -> dict[str, set[str]]:
        """Per setup of `setups`, the sequential tasks it scores in a pass to `horizon`: a setup's
        open cells stored short of the horizon (or not stored); the baseline's tasks stored short
        of what the setups' open cells need (the horizon, at most the cap), or not stored."""
        names = list(setups)
        opened = self.open_cells(names)
        needed = {t for ts in opened.values() for t in ts}
        out: dict[str, set[str]] = {}
        for s in names:
            tasks = set()
            for t in self.tasks:
                got = self.stored.get((s, t))
                reach = min(horizon, self.caps[t])
                if got is None:
                    tasks.add(t)
                elif s == self.baseline:
                    if t in needed and got.n < reach:
                        tasks.add(t)
                elif self.is_open(s, t) and got.n < reach:
                    tasks.add(t)
            out[s] = tasks
        return out


def pass_line(number: int, horizon: int, undecided: int) -> str:
    """The progress line a pass prints to stderr."""
    return (
        f"sequential pass {number}: horizon {horizon:,} documents; "
        f"{undecided} setup{'' if undecided == 1 else 's'} still undecided"
    )
