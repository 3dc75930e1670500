"""The report's multi-turn section: per setup, accuracy at each question turn with its paired
difference from the baseline [95% CI] and the gate's verdict, the filler tokens between fact and
question, and the answer tokens' KL where measured; a plot of accuracy against turn per setup for
report.html. From results.json alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qeval.report.plots import finish_panels
from qeval.report.pyplot import subplots
from qeval.report.sections import ReportSection, section_tables
from qeval.report.tables import Escape, md_table
from qeval.results.multi_turn import TurnPoint
from qeval.results.schema import Results


def _cell(p: TurnPoint) -> str:
    acc = "—" if p.accuracy is None else f"{100 * p.accuracy:.1f}%"
    if p.delta is None or p.ci is None:
        return acc
    out = f"{acc}, Δ {100 * p.delta:+.1f} [{100 * p.ci[0]:+.1f}, {100 * p.ci[1]:+.1f}]"
    out += f" {p.verdict}" if p.verdict else ""
    return out + (f"; KL {p.kl:.4f}" if p.kl is not None else "")


def turn_rows(results: Results, esc: Escape) -> tuple[list[str], list[list[str]]]:
    """setup x turn: accuracy, Δ [95% CI] verdict; KL on the answer tokens."""
    info = results.multi_turn
    assert info is not None
    first = next(iter(info.setups.values()), [])
    gaps = {p.turn: p.gap_tokens for p in first}
    header = ["setup"] + [f"turn {t} (~{gaps.get(t, 0):.0f} tokens after the facts)" for t in info.turns]
    rows = []
    for setup, points in info.setups.items():
        cells = {p.turn: _cell(p) for p in points}
        base = " (baseline)" if any(s.name == setup and s.baseline for s in results.setups) else ""
        rows.append([esc(setup) + base] + [cells.get(t, "") for t in info.turns])
    return header, rows


def legend(results: Results) -> str:
    info = results.multi_turn
    assert info is not None
    scored = sorted({p.documents for points in info.setups.values() for p in points})
    # under --limit fewer conversations are scored than generated: say how many were
    count = (
        f"{info.samples}"
        if scored in ([], [info.samples])
        else f"{'/'.join(map(str, scored))} of the {info.samples} generated"
    )
    return (
        f"{count} conversations per turn (seed {info.seed}, {info.facts} facts in turn 1, "
        f"{info.filler_words} words per filler answer). Accuracy: exact match of the number asked for; Δ: "
        "setup minus baseline in points, paired by conversation [95% Newcombe interval], with the gate's "
        "verdict where a gate applies; KL(baseline || setup) per token of the baseline's answer, teacher-forced "
        f"(with generation_divergence). {info.source}."
    )


def markdown_section(results: Results, esc: Escape) -> list[str]:
    if results.multi_turn is None:
        return []
    return ["## Multi-turn probes", "", *md_table(*turn_rows(results, esc)), "", legend(results), ""]


html_tables = section_tables(
    lambda results: results.multi_turn,
    ("Multi-turn probes: accuracy by question turn, Δ vs baseline [95% CI] verdict; KL", turn_rows),
)


def accuracy_by_turn_figure(results: Results) -> Any:
    """Accuracy against question turn, one line per setup."""
    info = results.multi_turn
    assert info is not None
    fig, ax = subplots(figsize=(4.5, 3.2))
    for setup, points in info.setups.items():
        pts = [(p.turn, 100 * p.accuracy) for p in points if p.accuracy is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=setup)
    ax.set_xticks(info.turns)
    ax.set_xlabel("question turn")
    ax.grid(alpha=0.3)
    return finish_panels(fig, [ax], "exact match (%)")


def _figures(results: Results) -> dict[str, Callable[[Results], Any]]:
    if results.multi_turn is None:
        return {}
    return {"Multi-turn probes: accuracy against question turn": accuracy_by_turn_figure}


SECTION = ReportSection(
    title="Multi-turn probes", anchor="multi-turn", markdown=markdown_section, tables=html_tables, figures=_figures
)
