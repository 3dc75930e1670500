"""report.md and report.html written from a run's results: the one entry the run, the `report`
command and the sweep call."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from qeval.files.atomic import atomic_write_bytes
from qeval.report.html import render_html
from qeval.report.markdown import render_markdown
from qeval.report.sections import ReportSection
from qeval.results.schema import Results


def write_report(run_dir: Path, results: Results, sections: Sequence[ReportSection] = ()) -> tuple[Path, Path]:
    """Write report.md and report.html, with the task kinds' `sections` after the report's own
    (qeval/tasks/kinds.py `report_sections()`); the same results always give the same bytes."""
    md, html = run_dir / "report.md", run_dir / "report.html"
    atomic_write_bytes(md, render_markdown(results, sections).encode())
    atomic_write_bytes(html, render_html(run_dir, results, sections).encode())
    return md, html
