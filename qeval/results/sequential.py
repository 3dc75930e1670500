"""results.json's `sequential` block: a sequential run's cells (setup, task, gate), each with the
documents it scored, the look it stopped at, its confidence sequence at every look and its
verdict, and the run's documents scored against the full sets' total (docs/statistics.md,
"Sequential gates"; qeval/analysis/sequential_run.py)."""

from __future__ import annotations

from pydantic import Field

from qeval.results.base import ResultModel, Verdict


class SequentialLook(ResultModel):
    """One look at a cell: after `n` paired documents, the confidence sequence there."""

    n: int
    ci: tuple[float, float] = Field(
        description="the confidence sequence at this look (running intersection), in the "
        "gate score's units: for a max_drop gate, setup minus baseline; each end a one-sided "
        "(1 - cell_level) bound (the lower end decides a pass, the upper a fail)"
    )
    verdict: Verdict = Field(description="the cell's verdict at this look")


class SequentialCell(ResultModel):
    """One (setup, task, gate) cell of a sequential run."""

    setup: str
    task: str
    metric: str = Field(description="the metric compared (the task's primary metric, bounded in [0, 1])")
    threshold: float = Field(
        description="the gate as a threshold on the score's mean: -max_drop for a max_drop gate, "
        "0 for relative and min_recovery gates (the score is then o - k b)"
    )
    documents: int = Field(description="paired documents the setup scored")
    total: int = Field(description="the documents the task has up to the cap (what a fixed run scores)")
    stopped_at: int | None = Field(description="the look (0-based) the cell was decided at; null: not decided")
    ci: tuple[float, float] | None = Field(description="the sequence at the last look (at stopping, if decided)")
    verdict: Verdict = Field(description="the sequence's verdict: the one in `vs_baseline` for this cell")
    looks: list[SequentialLook] = Field(description="the trajectory: the sequence at every look")


class SequentialBaseline(ResultModel):
    """How far the baseline scored one sequential task (a group: its pooled documents): as far as its
    furthest undecided cell needed (the last pass's horizon, at most the cap: qeval/run/passes.py),
    not necessarily the cap."""

    documents: int = Field(description="documents the baseline scored (a prefix of the seeded order)")
    total: int = Field(description="the documents the task has up to the cap (what a fixed run scores)")


class SequentialRun(ResultModel):
    """The run's sequential figures."""

    method: str = Field(
        description="betting confidence sequence (Waudby-Smith & Ramdas 2023, hedged capital, predictable plug-in bets)"
    )
    level: float = Field(description="the chance of any wrong verdict in the run, over every cell and look")
    cell_level: float = Field(description="each cell's level: level / cells (Bonferroni)")
    min_docs: int = Field(description="no verdict before this many paired documents")
    chunk_docs: int = Field(description="documents a chunk: a look after each")
    max_docs: int | None = Field(description="the cap on each task's documents (null: the whole set)")
    seed: int = Field(description="the seed of the documents' order")
    cells: list[SequentialCell] = Field(description="every sequential (setup, task, gate) cell")
    documents: int = Field(description="documents scored over every setup that ran ok and every task")
    total: int = Field(description="documents a fixed run scores over the same setups and tasks (to the cap)")
    not_sequential: dict[str, str] = Field(
        default_factory=dict,
        description="the gated tasks and groups judged by "
        "the fixed-n interval at the end, not sequentially, each with why",
    )
    baseline: dict[str, SequentialBaseline] = Field(
        default_factory=dict,
        description="per sequential task (a group: pooled), the documents the baseline scored: as far as the furthest "
        "undecided setup needed (empty in results written before the baseline scored in passes)",
    )
