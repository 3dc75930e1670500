"""The `sequential:` block: gates decided sequentially, scoring stopped when the verdict is known
(docs/statistics.md, "Sequential gates"; qeval/analysis/sequential.py). Off unless the config has
the block with `enabled: true`; while off it is out of the config hash and every resume key, so a
run that does not use it computes, stores and resumes as before the block existed."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from qeval.config.gates import Gate
from qeval.strict import Seed, Strict


def first_look(min_docs: int, chunk_docs: int) -> int:
    """The first look at which a cell may be decided: the first multiple of `chunk_docs` at or past
    `min_docs` (a look falls after each chunk)."""
    return -(-min_docs // chunk_docs) * chunk_docs


class SequentialSpec(Strict):
    """Each task's documents scored in a seeded random order shared by every setup, in chunks; after
    each chunk every undecided (setup, task, gate) cell is tested with an anytime-valid confidence
    sequence at `level` split over the run's cells; a setup whose cells are all decided stops."""

    enabled: bool = False
    level: float = Field(default=0.05, gt=0, lt=1, description="the chance of any wrong verdict in the run")
    #: no verdict before this many paired documents (at least 6: qeval/analysis/stats.py MIN_PAIRED_N)
    min_docs: int = Field(default=50, ge=6)
    #: the cap on each task's documents (its first max_docs in the seeded order; an lm-eval group's: on its
    #: pooled documents); None: the whole set
    max_docs: int | None = Field(default=None, gt=0)
    #: documents a chunk (a look after each): lm-eval tasks use it instead of lm_eval.chunk_docs
    chunk_docs: int = Field(default=100, gt=0)
    seed: Seed = 0

    @model_validator(mode="after")
    def _check(self) -> SequentialSpec:
        # settings without the switch would run a fixed run the user took for a sequential one
        if "enabled" not in self.model_fields_set and self.model_fields_set:
            raise ValueError("no `enabled:`; the block is off unless `enabled: true` (`enabled: false` keeps it off)")
        # a cap under the floor leaves no look at which any cell may decide: a run of such a block
        # scores every setup to the cap and reports every cell undecided, which no user means
        if self.max_docs is not None and self.max_docs < self.min_docs:
            raise ValueError(
                f"max_docs ({self.max_docs}) is under min_docs ({self.min_docs}): no cell could ever be decided"
            )
        # looks fall after each chunk: where the first one at or past the floor is at or past the cap,
        # every setup scores every task to the cap (a fixed run judged by the wider sequence)
        first = self.first_look()
        if self.max_docs is not None and first >= self.max_docs:
            raise ValueError(
                f"the first look that may decide is after {first:,} documents (min_docs {self.min_docs} "
                f"rounded up to a multiple of chunk_docs {self.chunk_docs}), at or past max_docs ({self.max_docs}): "
                "no setup could stop before the cap; lower chunk_docs or min_docs, or raise max_docs"
            )
        return self

    def first_look(self) -> int:
        """`first_look` for this block's floor and chunk."""
        return first_look(self.min_docs, self.chunk_docs)

    def settings(self) -> dict[str, Any]:
        """The settings a run's plan and results.json's `sequential` block carry as configured."""
        return self.model_dump(include={"level", "min_docs", "chunk_docs", "max_docs", "seed"})

    def order_part(self) -> str:
        """What changes the documents a setup scores and their prompts (the order, the chunks, the
        cap): a part of every task's resume key while on."""
        return f"seed={self.seed},chunk_docs={self.chunk_docs},max_docs={self.max_docs}"

    def stop_part(self, cells: int) -> str:
        """What changes where a setup that is not the baseline stops: the level over `cells` cells
        and the floor (a part of those setups' resume keys while on)."""
        return f"level={self.level!r},cells={cells},min_docs={self.min_docs}"


class CellPlan(BaseModel):
    """One sequential cell of a run's plan: a task, or an lm-eval group over its pooled documents."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gate: Gate
    #: the compared metric, bounded in [0, 1] (qeval/analysis/sequential.py `sequential_metric`)
    metric: str
    #: the cell's documents (a group's: its members' sum)
    n_docs: int
    higher_is_better: bool
    #: a group cell's members (lm-eval leaves), None for a task
    members: list[str] | None = None

    def units(self, name: str) -> list[str]:
        """The tasks the cell is scored as: a group's members, else the task itself."""
        return list(self.members or [name])


class SequentialPlan(BaseModel):
    """A sequential run's plan (qeval/analysis/sequential_run.py `plan`): what every worker's
    monitor and assembly decide the cells with. The runner makes it once; each job carries it, with
    the pass's horizon (qeval/run/passes.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: each cell's level: `level` over the run's cells (qeval/analysis/sequential.py `cell_level`)
    alpha: float
    level: float
    #: (setups other than the baseline) x cells
    cells: int
    min_docs: int
    chunk_docs: int
    max_docs: int | None
    seed: int
    #: per cell (a task, or a group), its gate, metric, size and members
    tasks: dict[str, CellPlan]
    #: every lm-eval group's members with their document counts (what its pooled order is drawn over)
    groups: dict[str, list[tuple[str, int]]] = {}
    #: the pass's document horizon (None: score each cell to its cap)
    horizon: int | None = None
    #: a cell stored at an earlier pass's horizon carries on from it (False under --force)
    carry: bool = True
    #: the pass's number (1: the first; a later one scores only extensions)
    number: int = 1

    def for_pass(self, horizon: int | None, carry: bool, number: int) -> SequentialPlan:
        """The plan a job of pass `number` carries: this one with the pass's horizon."""
        return self.model_copy(update={"horizon": horizon, "carry": carry, "number": number})

    def group_of(self) -> dict[str, str]:
        """lm-eval leaf -> the group whose pooled order it is scored in."""
        return {m: g for g, members in self.groups.items() for m, _ in members}

    def monitored(self) -> set[str]:
        """Every task a monitor watches: each cell's units (a group's members)."""
        return {u for name, c in self.tasks.items() for u in c.units(name)}
