"""Reports, generated only from a run directory's stored results (never edited by hand):
report.md (markdown.py), report.html with plots (html.py, plots.py). Each task kind may add
its own section (sections.py); the one table helper and escape are in tables.py."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from qeval.files.atomic import atomic_write_bytes
from qeval.report.markdown import print_summary, render_markdown, verdict_line
from qeval.report.sections import ReportSection
from qeval.results.schema import Results

__all__ = ["print_summary", "verdict_line", "write_report"]


def write_report(run_dir: Path, results: Results, sections: Sequence[ReportSection] = ()) -> tuple[Path, Path]:
    """Write report.md and report.html, with the task kinds' `sections` after the report's own
    (qeval/tasks/kinds.py `report_sections()`); the same results always give the same bytes."""
    from qeval.report.html import render_html

    md, html = run_dir / "report.md", run_dir / "report.html"
    atomic_write_bytes(md, render_markdown(results, sections).encode())
    atomic_write_bytes(html, render_html(run_dir, results, sections).encode())
    return md, html
