"""A report section: what a task kind (or the report itself) adds to report.md and report.html,
from results.json alone. The report renders the sections it is given in order, after its own
tables (qeval/tasks/kinds.py `report_sections()` collects the kinds')."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from qeval.report.tables import Escape, md_table
from qeval.results.schema import Results

#: report.html's tables of a section: caption -> (header, rows), unescaped (Jinja2 escapes them)
HtmlTables = dict[str, tuple[list[str], list[list[str]]]]


def _none(results: Results) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class ReportSection:
    """One section (see the module docstring). Each callable returns nothing (an empty list or
    mapping) for results that hold nothing for the section."""

    #: the section's heading in report.html, and its anchor
    title: str
    anchor: str
    #: report.md's lines of the section, its `## ` heading included; `esc` makes text inert
    markdown: Callable[[Results, Escape], list[str]]
    #: report.html's tables
    tables: Callable[[Results], HtmlTables] = field(default=_none)
    #: report.html's plots: caption -> a function drawing a matplotlib figure from the results
    figures: Callable[[Results], dict[str, Callable[[Results], Any]]] = field(default=_none)


#: a section's table from the results: (header, rows), cells made inert by the escape
TableRows = Callable[[Results, Escape], tuple[list[str], list[list[str]]]]


def section_tables(
    block: Callable[[Results], object], first: tuple[str, TableRows], *more: tuple[str, TableRows]
) -> Callable[[Results], HtmlTables]:
    """A section's `tables`: nothing where its results block (`block`) is None; else by caption
    the first table always and each further one where it has rows (Jinja2 escapes the cells)."""

    def tables(results: Results) -> HtmlTables:
        if block(results) is None:
            return {}
        out: HtmlTables = {first[0]: first[1](results, str)}
        for caption, table in more:
            header, rows = table(results, str)
            if rows:
                out[caption] = (header, rows)
        return out

    return tables


def table_section(
    title: str,
    anchor: str,
    caption: str,
    header: list[str],
    rows: Callable[[Results, Escape], list[list[str]]],
    legend: str,
) -> ReportSection:
    """A section of one table: `## title`, the table and its legend in report.md, the table under
    `caption` in report.html; nothing where `rows` gives none."""

    def markdown(results: Results, esc: Escape) -> list[str]:
        body = rows(results, esc)
        return [f"## {title}", "", *md_table(header, body), "", legend, ""] if body else []

    def tables(results: Results) -> HtmlTables:
        body = rows(results, str)
        return {caption: (header, body)} if body else {}

    return ReportSection(title=title, anchor=anchor, markdown=markdown, tables=tables)
