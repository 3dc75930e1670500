"""The report's sequential-gates section (results.json `sequential`, qeval/analysis/sequential_run.py):
per (setup, task) cell the verdict, the documents it took ("decided after 412 of 2,376 documents"),
the look it stopped at and the confidence sequence there; per run the documents scored against
what a fixed run scores, and per task how far the baseline scored ("baseline: 600 of 10,042
documents": as far as the furthest undecided setup needed); in report.html a trajectory plot per
gated task (each setup's sequence at every look, the gate's threshold drawn). Empty for a run without the switch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qeval.report.pyplot import subplots
from qeval.report.sections import HtmlTables, ReportSection
from qeval.report.tables import Escape, md_table
from qeval.results.schema import Results, SetupResult
from qeval.results.sequential import SequentialCell

TITLE = "Sequential gates"
HEADER = ["setup", "task", "verdict", "documents", "stopped at look", "sequence there", "threshold"]


def fewer_documents(results: Results, setup: SetupResult, task: str) -> str:
    """The text " (on 12 of 24 documents)" after a setup's score where a sequential run stopped the task
    before the baseline's documents: the two scores side by side are on different documents (the
    Δ beside them is paired, on the setup's); where the baseline has no score of the task (it
    failed), before the task's documents up to the cap (a setup stopped at a pass's horizon is not
    scored whole); "" elsewhere, and always in a run without the switch."""
    if results.sequential is None or setup.baseline:
        return ""
    base = next((s for s in results.setups if s.baseline), None)
    mine, theirs = setup.tasks.get(task), base.tasks.get(task) if base else None
    info, cap = results.tasks.get(task), results.sequential.max_docs
    of = theirs.n if theirs is not None else (min(info.n, cap or info.n) if info is not None else None)
    if mine is None or of is None or mine.n >= of:
        return ""
    return f" (on {mine.n:,} of {of:,} documents)"


def _ci(ci: tuple[float, float] | None) -> str:
    return "—" if ci is None else f"[{ci[0]:+.4f}, {ci[1]:+.4f}]"


def _documents(c: SequentialCell) -> str:
    what = "decided after" if c.stopped_at is not None else "not decided after"
    return f"{what} {c.documents:,} of {c.total:,}"


def rows(results: Results, esc: Escape) -> list[list[str]]:
    block = results.sequential
    if block is None:
        return []
    return [
        [
            esc(c.setup),
            esc(c.task),
            c.verdict,
            _documents(c),
            "—" if c.stopped_at is None else f"{c.stopped_at + 1} of {len(c.looks)}",
            _ci(c.ci),
            f"{c.threshold:+.4f}",
        ]
        for c in block.cells
    ]


def summary(results: Results) -> str:
    """The run's line: documents scored against a fixed run's."""
    b = results.sequential
    if b is None:
        return ""
    scored = f"Scored {b.documents:,} of the {b.total:,} documents a fixed run scores"
    if not b.cells:  # the baseline, or every other setup, failed: the setups stopped at a horizon, not a verdict
        short = ", so the documents not scored are no saving" if b.documents < b.total else ""
        return (
            f"{scored}, over every setup that ran ok and every task; no cell was tested (no setup was compared "
            f"with the baseline){short}."
        )
    # the compute saved, in documents: a document costs about the same in every setup of a task
    share = f" ({b.documents / b.total:.0%}: {1 - b.documents / b.total:.0%} of the scoring saved)" if b.total else ""
    return (
        f"{scored}{share}, over every setup that ran ok and every task; "
        f"each of {len(b.cells)} cells at level {b.cell_level:.4g} ({b.level:g} over the run, Bonferroni), "
        f"looked at every {b.chunk_docs:,} documents, no verdict before {b.min_docs:,}."
    )


def baseline_lines(results: Results, esc: Escape) -> list[str]:
    """Per sequential task, how far the baseline scored it ("baseline: 600 of 10,042 documents"):
    as far as the furthest undecided setup needed, not necessarily the cap."""
    b = results.sequential
    if b is None or not b.baseline:
        return []
    return [
        *(f"- {esc(t)}: baseline: {d.documents:,} of {d.total:,} documents" for t, d in b.baseline.items()),
        "",
    ]


LEGEND = (
    "The verdicts of these cells are the confidence sequence's (a betting confidence sequence, valid at every "
    'look at once: docs/statistics.md, "Sequential gates"), not the fixed-n interval in the gate table, '
    "which is shown for reading: after stopping on the data it is no 95% interval. The sequence is in the "
    "gate score's units: setup minus baseline for a max_drop gate (pass: wholly above the threshold, -max_drop); "
    "each end is a one-sided bound at the cell's level, since a gate can be wrong on one side only."
)


def fixed(results: Results, esc: Escape) -> list[str]:
    """The gated tasks of the run that were not decided sequentially, each with why (results.json
    `sequential.not_sequential`): their verdicts are the gate table's fixed-n ones."""
    b = results.sequential
    if b is None or not b.not_sequential:
        return []
    return [
        "Judged by the fixed-n interval at the end, not sequentially:",
        "",
        *(f"- {esc(task)}: {esc(why)}" for task, why in b.not_sequential.items()),
        "",
    ]


def markdown(results: Results, esc: Escape) -> list[str]:
    body = rows(results, esc)
    if results.sequential is None:
        return []
    return [
        f"## {TITLE}",
        "",
        summary(results),
        "",
        *baseline_lines(results, esc),
        *(md_table(HEADER, body) if body else ["No sequential cell."]),
        "",
        *([LEGEND, ""] if body else []),
        *fixed(results, esc),
    ]


def tables(results: Results) -> HtmlTables:
    body = rows(results, str)
    out: HtmlTables = {summary(results): (HEADER, body)} if body else {}
    if results.sequential is not None and results.sequential.baseline:
        out["How far the baseline scored each sequential task"] = (
            ["task", "baseline documents", "of"],
            [[t, f"{d.documents:,}", f"{d.total:,}"] for t, d in results.sequential.baseline.items()],
        )
    if results.sequential is not None and results.sequential.not_sequential:
        out["Judged by the fixed-n interval at the end, not sequentially"] = (
            ["task", "why"],
            [[t, why] for t, why in results.sequential.not_sequential.items()],
        )
    return out


def trajectory_figure(task: str) -> Callable[[Results], Any]:
    """One task's trajectory: each setup's sequence (shaded) at every look, and the threshold."""

    def draw(results: Results) -> Any:
        assert results.sequential is not None
        cells = [c for c in results.sequential.cells if c.task == task]
        fig, ax = subplots(figsize=(6, 3.2))
        for i, c in enumerate(cells):
            n = [k.n for k in c.looks]
            color = f"C{i % 10}"
            ax.fill_between(
                n,
                [k.ci[0] for k in c.looks],
                [k.ci[1] for k in c.looks],
                alpha=0.25,
                color=color,
                step="post",
                label=f"{c.setup}: {c.verdict} at {c.documents:,}",
            )
            if c.stopped_at is not None:
                ax.axvline(c.looks[c.stopped_at].n, color=color, lw=0.8, ls=":")
        if cells:
            ax.axhline(cells[0].threshold, color="k", lw=1, ls="--", label="gate threshold")
        ax.set_xlabel("documents paired")
        ax.set_ylabel("gate score (setup - baseline)")
        ax.legend(fontsize=7, loc="lower right")
        ax.grid(alpha=0.3)
        return fig

    return draw


def figures(results: Results) -> dict[str, Callable[[Results], Any]]:
    if results.sequential is None:
        return {}
    tasks = list(dict.fromkeys(c.task for c in results.sequential.cells))
    return {f"Sequential gate trajectory: {t}": trajectory_figure(t) for t in tasks}


SECTION = ReportSection(title=TITLE, anchor="sequential", markdown=markdown, tables=tables, figures=figures)
