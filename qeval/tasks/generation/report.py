"""The report's divergence-along-the-generation section: per generation task and setup, the KL,
top-1 agreement and Δ NLL of the baseline's generated tokens by generated position, and the
accuracy by the baseline's answer length; a plot of KL against generated position per setup for
report.html. From results.json alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qeval.report.plots import finish_panels, panel_row
from qeval.report.sections import ReportSection, section_tables
from qeval.report.tables import Escape, md_table
from qeval.results.generation import AnswerLengthBucket, GeneratedPositionBucket
from qeval.results.schema import Results


def _span(start: int, end: int | None) -> str:
    return f"{start}–{end}" if end is not None else f"{start}+"


def _position_cell(b: GeneratedPositionBucket) -> str:
    if b.kl is None or b.top1_agreement is None:
        return f"NLL {b.nll:.3f} ({b.documents} docs)"
    delta = "" if b.delta is None or b.ci is None else f"; Δ NLL {b.delta:+.3f} [{b.ci[0]:+.3f}, {b.ci[1]:+.3f}]"
    gate = f" {b.verdict} (≤ {b.max_drop:g})" if b.verdict and b.max_drop is not None else ""
    return f"KL {b.kl:.4f}; top-1 {100 * b.top1_agreement:.1f}%{delta}{gate} ({b.documents})"


def _length_cell(b: AnswerLengthBucket) -> str:
    if b.delta is None or b.ci is None:
        return f"{100 * b.accuracy:.1f}% ({b.documents})"
    return (
        f"{100 * b.accuracy:.1f}%, Δ {100 * b.delta:+.1f} [{100 * b.ci[0]:+.1f}, {100 * b.ci[1]:+.1f}] ({b.documents})"
    )


def position_rows(results: Results, esc: Escape) -> tuple[list[str], list[list[str]]]:
    """setup x task: one cell per generated-position bucket."""
    info = results.generation_divergence
    assert info is not None
    edges = info.position_buckets
    spans = [(a, edges[i + 1] if i + 1 < len(edges) else None) for i, a in enumerate(edges)]
    header = ["setup", "task"] + [_span(a, b) for a, b in spans]
    rows = []
    for setup, tasks in info.setups.items():
        base = " (baseline)" if any(s.name == setup and s.baseline for s in results.setups) else ""
        for task, t in tasks.items():
            cells = {b.start: _position_cell(b) for b in t.positions}
            if cells:
                rows.append([esc(setup) + base, esc(task)] + [cells.get(a, "") for a, _ in spans])
    return header, rows


def length_rows(results: Results, esc: Escape) -> tuple[list[str], list[list[str]]]:
    """setup x task: one cell per answer-length bucket."""
    info = results.generation_divergence
    assert info is not None
    edges = info.length_buckets
    spans = [(a, edges[i + 1] if i + 1 < len(edges) else None) for i, a in enumerate(edges)]
    header = ["setup", "task"] + [_span(a, b) + " tokens" for a, b in spans]
    rows = []
    for setup, tasks in info.setups.items():
        for task, t in tasks.items():
            cells = {b.start: _length_cell(b) for b in t.answer_lengths}
            if cells:
                rows.append([esc(setup), esc(task)] + [cells.get(a, "") for a, _ in spans])
    return header, rows


LEGEND_POSITIONS = (
    "The baseline's own generation of each document teacher-forced through each setup (one forward "
    "pass over prompt + generation; under a quantized KV cache every token reads quantized K/V). "
    "Per bucket of generated positions: KL(baseline || setup) per token (top-16 + tail, a lower "
    "bound), the share of tokens whose top-1 is the baseline's, Δ NLL of the baseline's tokens "
    "[95% paired t-interval over documents] with a position gate's verdict where one applies, and "
    "(documents). Baseline: its own NLL."
)
LEGEND_LENGTHS = (
    "Documents bucketed by the length of the baseline's answer in tokens: accuracy, Δ against the "
    "baseline in points [95% paired interval: Newcombe's], and (documents)."
)


def markdown_section(results: Results, esc: Escape) -> list[str]:
    """The section of report.md; empty without the block."""
    if results.generation_divergence is None:
        return []
    lines = ["## Divergence along the generation", "", "### By generated position", ""]
    lines += md_table(*position_rows(results, esc)) + ["", LEGEND_POSITIONS, ""]
    header, rows = length_rows(results, esc)
    if rows:
        lines += ["### Accuracy by answer length", ""] + md_table(header, rows) + ["", LEGEND_LENGTHS, ""]
    return lines


html_tables = section_tables(
    lambda results: results.generation_divergence,
    ("Divergence by generated position (KL, top-1, Δ NLL [95% CI])", position_rows),
    ("Accuracy by answer length (baseline's tokens)", length_rows),
)


def kl_by_position_figure(results: Results) -> Any:
    """KL to the baseline against generated position (bucket start), one line per setup, one
    panel per task."""
    info = results.generation_divergence
    assert info is not None
    fig, axes = panel_row(len(info.tasks))
    for ax, task in zip(axes, info.tasks, strict=True):
        for setup, tasks in info.setups.items():
            bs = [b for b in tasks.get(task, _EMPTY).positions if b.kl is not None]
            if bs:
                ax.plot([b.start for b in bs], [b.kl for b in bs], "o-", label=setup)
        ax.set_xlabel("generated position (bucket start)")
        ax.set_title(task)
        ax.grid(alpha=0.3)
    return finish_panels(fig, axes, "KL(baseline || setup) per token")


class _Empty:
    positions: list[GeneratedPositionBucket] = []


_EMPTY: Any = _Empty()


def _figures(results: Results) -> dict[str, Callable[[Results], Any]]:
    if results.generation_divergence is None:
        return {}
    return {"Divergence along the generation: KL against generated position": kl_by_position_figure}


SECTION = ReportSection(
    title="Divergence along the generation",
    anchor="generation-divergence",
    markdown=markdown_section,
    tables=html_tables,
    figures=_figures,
)
