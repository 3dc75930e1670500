"""A report section: what a task kind (or the report itself) adds to report.md and report.html,
from results.json alone. The report renders the sections it is given in order, after its own
tables (qeval/tasks/kinds.py `report_sections()` collects the kinds')."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from qeval.report.tables import Escape
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
