"""report.html: self-contained (inline SVG plots, inline CSS, no external requests), every
model output escaped by Jinja2's autoescaping, with a sign-off block for a reviewer."""

from __future__ import annotations

import functools
import html
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jinja2
import yaml

from qeval.records.store import RunStore
from qeval.report import performance as perf_views
from qeval.report import plots
from qeval.report.markdown import OWN_SECTIONS, budget_text, gate_header, gate_rows, partial_line, summary_rows
from qeval.report.sections import ReportSection
from qeval.results.schema import Results

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("qeval", "report/templates"),
    autoescape=jinja2.select_autoescape(["html", "j2"]),
    undefined=jinja2.StrictUndefined,
)
MAX_FLIPS = 5


def inline_svg(svg: str) -> str:
    """Namespace URIs and the generator comment are not needed inline: drop every URL."""
    svg = re.sub(r'\s+xmlns(:xlink)?="[^"]*"', "", svg)
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)  # RDF namespace URLs
    return re.sub(r"<!--.*?-->", "", svg, flags=re.S)


def flip_examples(run_dir: Path, results: Results) -> list[dict[str, Any]]:
    """Samples a setup got wrong that the baseline got right (and the reverse), from samples/."""
    store = RunStore(run_dir)
    base = results.baseline.name if results.baseline else None
    out: list[dict[str, Any]] = []
    for s in results.setups:
        for task, c in s.vs_baseline.items():
            if c.flips_to_wrong is None or base is None:
                continue
            b = {r.sample_id: r for r in store.read_samples(base, task)}
            flips = [
                (r, b[r.sample_id])
                for r in store.read_samples(s.name, task)
                if r.sample_id in b and r.correct != b[r.sample_id].correct
            ]
            for r, br in flips[:MAX_FLIPS]:
                out.append(
                    {
                        "setup": s.name,
                        "task": task,
                        "id": r.sample_id,
                        "prompt": r.prompt or "",
                        "target": r.target,
                        "baseline": br.prediction,
                        "prediction": r.prediction,
                        "direction": "right → wrong" if br.correct else "wrong → right",
                    }
                )
    return out


def _versions(results: Results) -> dict[str, str]:
    merged: dict[str, str] = {}
    for s in results.setups:
        merged |= s.library_versions
    return dict(sorted(merged.items()))


def _plot(make: Callable[[Results], str], results: Results) -> str:
    """An inline SVG; a plot that cannot be drawn is a line of text in its place, never a
    report that is not written after hours of scoring."""
    try:
        return inline_svg(make(results))
    except Exception as exc:  # noqa: BLE001 - the report must be written whatever the content
        print(f"qeval: warning: a plot could not be drawn ({type(exc).__name__}: {exc})", file=sys.stderr)
        return f"<p>(plot not drawn: {html.escape(type(exc).__name__)}: {html.escape(str(exc)[:200])})</p>"


def render_html(run_dir: Path, results: Results, sections: Sequence[ReportSection] = ()) -> str:
    """report.html (see the module docstring): the report's own tables and plots, then each
    section's (the task kinds')."""
    header, rows = summary_rows(results, esc=str)
    figures = {
        "Quality vs memory (Pareto front dashed)": _plot(plots.quality_vs_memory, results),
        "Per-task difference from the baseline, 95% CI (dotted: the gate's margin)": _plot(plots.task_deltas, results),
        "Memory ledger per setup (measured)": _plot(plots.memory_ledger, results),
    }
    perf = perf_views.html_context(results)
    if perf:
        figures["Quality x memory x throughput (filled: Pareto-optimal over all three)"] = _plot(
            plots.tradeoff, results
        )
    sections = (*OWN_SECTIONS, *sections)  # the report's own, then the run phases' and task kinds'
    for section in sections:
        for caption, make in section.figures(results).items():
            figures[caption] = _plot(functools.partial(plots.svg_of, make), results)
    return _ENV.get_template("report.html.j2").render(
        r=results,
        header=header,
        rows=rows,
        gate_header=gate_header(results),
        gate_rows=gate_rows(results, esc=str),
        figures=figures,
        flips=flip_examples(run_dir, results),
        budget=budget_text(results),
        partial=partial_line(results),
        versions=_versions(results),
        config_yaml=yaml.safe_dump(results.config.as_dict(), sort_keys=False),
        hardware=json.dumps(results.run.hardware.as_dict(), indent=1),
        perf=perf,
        sections=[(s.title, s.anchor, tables) for s in sections if (tables := s.tables(results))],
    )
