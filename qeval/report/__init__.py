"""Reports, generated only from a run directory's stored results (never edited by hand):
report.md (markdown.py), report.html with plots (html.py, plots.py)."""

from __future__ import annotations

from pathlib import Path

from qeval.files.atomic import atomic_write_bytes
from qeval.report.markdown import print_summary, render_markdown, verdict_line
from qeval.results.schema import Results

__all__ = ["print_summary", "verdict_line", "write_report"]


def write_report(run_dir: Path, results: Results) -> tuple[Path, Path]:
    """Write report.md and report.html; the same results always give the same bytes."""
    from qeval.report.html import render_html

    md, html = run_dir / "report.md", run_dir / "report.html"
    atomic_write_bytes(md, render_markdown(results).encode())
    atomic_write_bytes(html, render_html(run_dir, results).encode())
    return md, html
