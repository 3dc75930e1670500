"""compare.md and compare.html, as the run report writes report.md and report.html: the same
table helper and escape (qeval/report/tables.py), Jinja2's autoescaping for every value in the
HTML, plots inline. compare.json holds the same content for pipelines."""

from __future__ import annotations

import dataclasses
import html
import json
import math
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

from qeval.compare.history import history_figure
from qeval.compare.pairing import SetupPair, TaskDelta
from qeval.errors import UserError
from qeval.report.html import inline_svg
from qeval.report.plots import svg_of
from qeval.report.tables import Escape, md_table, md_text
from qeval.results.metrics import describe

if TYPE_CHECKING:
    from qeval.compare.comparison import OtherRun, RunComparison

DELTA_HEADER = ["setup", "task", "metric", "reference", "this run", "Δ [95% CI]", "n", "method", "verdict"]
CHANGE_HEADER = ["what", "reference run", "this run"]


def delta_rows(pairs: list[SetupPair], esc: Escape) -> list[list[str]]:
    """One row per setup and task (a setup in one run only, or with nothing to compare: one row
    saying so); names escaped with `esc`."""
    rows = []
    for p in pairs:
        if not p.tasks:
            rows.append(
                [
                    esc(p.setup),
                    "",
                    "",
                    _status(p.status_a),
                    _status(p.status_b),
                    "",
                    "",
                    "",
                    esc(p.note or "no task scored in both runs"),
                ]
            )
        for t in p.tasks:
            m = describe(t.metric, t.higher_is_better)
            verdict = t.verdict or ""
            if t.problem:
                verdict = f"{verdict or 'not checked'}: {t.problem}"
            if t.unpaired_reason:
                verdict = f"{verdict}; unpaired: {t.unpaired_reason}".lstrip("; ")
            if p.note:
                verdict = f"{verdict}; {p.note}".lstrip("; ")
            shown = t.metric + ("" if t.higher_is_better else " (lower is better)")
            rows.append(
                [
                    esc(p.setup),
                    esc(t.task),
                    esc(shown),
                    "—" if t.value_a is None else m.fmt(t.value_a),
                    "—" if t.value_b is None else m.fmt(t.value_b),
                    _delta(t),
                    _n(t),
                    esc(t.method or "not compared"),
                    esc(verdict),
                ]
            )
    return rows


def _status(status: str | None) -> str:
    return "absent" if status is None else status


def _delta(t: TaskDelta) -> str:
    m = describe(t.metric, t.higher_is_better)
    if t.delta is None:
        return "—"
    if t.ci is None:
        return m.fmt_delta(t.delta)
    return f"{m.fmt_delta(t.delta)} [{m.fmt_delta(t.ci[0], unit=False)}, {m.fmt_delta(t.ci[1], unit=False)}]"


def _n(t: TaskDelta) -> str:
    if t.n_paired is None:
        return f"{t.n_a} / {t.n_b}"
    return f"{t.n_paired} paired" + ("" if t.n_paired == t.n_a == t.n_b else f" (of {t.n_a} / {t.n_b})")


def _legend(margin: float | None) -> str:
    gate = (
        ""
        if margin is None
        else f" Verdict with --fail-on-regression {margin:g} (in each metric's units: 0.02 is 2 points of accuracy): "
        "worse when the whole interval lies beyond the margin on the bad side, not worse when within it, "
        "inconclusive otherwise; unchecked when there is no evidence to decide (not scored here, records that "
        "are not what results.json reports, fewer than 6 documents), which fails the gate."
    )
    return (
        "Δ is this run minus the reference run. Paired: the documents both runs scored on the same data "
        "(fingerprint), with the statistics a setup gets against its baseline (Newcombe's paired interval "
        "for accuracies, a t-interval for bits per byte; docs/statistics.md). Unpaired: the runs scored "
        "different documents or prompts, so the interval is Newcombe's for independent proportions or "
        "Welch's, and is wider." + gate
    )


def render_markdown(c: RunComparison) -> str:
    """compare.md."""
    lines = ["# qeval compare", "", "Runs (the first is the reference each other run is compared with):", ""]
    lines += md_table(
        ["#", "run", "config", "config hash", "qeval", "finished"],
        [
            [
                str(i + 1),
                md_text(r.path),
                md_text(r.results.run.name),
                r.results.run.config_hash[:12],
                md_text(r.results.run.qeval_version),
                md_text(r.results.run.finished or "—"),
            ]
            for i, r in enumerate(c.runs)
        ],
    )
    lines += _gate_lines(c)
    for other in c.others:
        lines += _against_lines(c, other)
    lines += [
        "",
        "## History",
        "",
        "Each setup's compared metric per task, runs in the order they finished (accuracies in percent).",
        "",
    ]
    for task in c.history.metrics:
        header, rows = c.history.rows(task)
        lines += [
            f"### {md_text(task)}",
            "",
            *md_table([md_text(h) for h in header], [[md_text(x) for x in row] for row in rows]),
            "",
        ]
    return "\n".join(lines).rstrip() + "\n"


def _gate_lines(c: RunComparison) -> list[str]:
    """compare.md's regressions beyond the margin (under --fail-on-regression) and what could not be checked."""
    lines: list[str] = []
    regressions, unchecked = c.regressions(), c.unchecked()
    if c.margin is not None:
        lines += [
            "",
            f"**Regressions beyond {c.margin:g}:** "
            + ("; ".join(md_text(x) for x in regressions) if regressions else "none found")
            + ".",
        ]
    if unchecked:
        lines += [
            "",
            f"**Not checked ({len(unchecked)}{'; the gate fails' if c.margin is not None else ''}):** "
            + "; ".join(md_text(x) for x in unchecked)
            + ".",
        ]
    return lines


def _against_lines(c: RunComparison, other: OtherRun) -> list[str]:
    """compare.md's section of one run against the reference: the deltas and what changed."""
    lines = [
        "",
        f"## {md_text(other.run.path)} against {md_text(c.runs[0].path)}",
        "",
        *md_table(DELTA_HEADER, delta_rows(other.setups, md_text)),
        "",
        _legend(c.margin),
        "",
        "### What changed",
        "",
    ]
    if other.changes:
        lines += md_table(
            CHANGE_HEADER, [[md_text(ch.what), md_text(ch.a or "—"), md_text(ch.b or "—")] for ch in other.changes]
        )
    else:
        lines += [
            "Nothing the runs recorded differs (qeval, engine and library versions, checksums, device, "
            "config, task data)."
        ]
    return lines


_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>qeval compare</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 80em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
.regression { font-size: 1.1em; padding: 0.6em 1em; background: #fbeeee; border-left: 4px solid #bb2200; }
.ok { font-size: 1.1em; padding: 0.6em 1em; background: #eef6ee; border-left: 4px solid #228833; }
</style>
</head>
<body>
<h1>qeval compare</h1>
<table id="runs"><tr><th>#</th><th>run</th><th>config</th><th>config hash</th><th>qeval</th><th>finished</th></tr>
{% for r in runs %}<tr>{% for cell in r %}<td>{{ cell }}</td>{% endfor %}</tr>{% endfor %}</table>
{% if margin is not none %}{% if regressions %}
<p class="regression" id="regressions">Regressions beyond {{ margin }}: {{ regressions | join("; ") }}</p>
{% elif unchecked %}<p class="regression" id="regressions">No regression beyond {{ margin }} found, but not everything
the reference run holds could be checked: the gate fails.</p>
{% else %}<p class="ok" id="regressions">No regression beyond {{ margin }}.</p>{% endif %}{% endif %}
{% if unchecked %}<p class="regression" id="unchecked">Not checked: {{ unchecked | join("; ") }}</p>{% endif %}
{% for o in others %}
<h2>{{ o.title }}</h2>
<table class="deltas"><tr>{% for h in delta_header %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in o.rows %}<tr>{% for cell in row %}<td>{{ cell }}</td>{% endfor %}</tr>{% endfor %}</table>
<p>{{ legend }}</p>
<h3>What changed</h3>
{% if o.changes %}<table class="changes"><tr>{% for h in change_header %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in o.changes %}<tr>{% for cell in row %}<td><code>{{ cell }}</code></td>{% endfor %}</tr>{% endfor %}</table>
{% else %}<p>Nothing the runs recorded differs.</p>{% endif %}
{% endfor %}
<h2>History</h2>
<figure class="plot"><figcaption>Each setup's compared metric per task, runs in the order they finished</figcaption>
{{ plot | safe }}</figure>
<ol>{% for label in history_runs %}<li>{{ label }}</li>{% endfor %}</ol>
{% for task, header, rows in history %}<h3>{{ task }}</h3>
<table class="history"><tr>{% for h in header %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in rows %}<tr>{% for cell in row %}<td>{{ cell }}</td>{% endfor %}</tr>{% endfor %}</table>{% endfor %}
</body>
</html>
"""
# autoescape on for the one template: every value from results.json is escaped, and the SVG
# (drawn by matplotlib, whose text it escapes itself) is the only value marked safe
_ENV = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)


def _plot(make: Callable[[], str]) -> str:
    """The history plot; one that cannot be drawn is a line of text, never a missing report."""
    try:
        return inline_svg(make())
    except Exception as exc:  # noqa: BLE001 - the report must be written whatever the content
        print(f"qeval: warning: the history plot could not be drawn ({type(exc).__name__}: {exc})", file=sys.stderr)
        return f"<p>(plot not drawn: {html.escape(type(exc).__name__)}: {html.escape(str(exc)[:200])})</p>"


def render_html(c: RunComparison) -> str:
    """compare.html (self-contained: inline CSS and SVG)."""
    runs = [
        [
            str(i + 1),
            str(r.path),
            r.results.run.name,
            r.results.run.config_hash[:12],
            r.results.run.qeval_version,
            r.results.run.finished or "—",
        ]
        for i, r in enumerate(c.runs)
    ]
    others = [
        {
            "title": f"{o.run.path} against {c.runs[0].path}",
            "rows": delta_rows(o.setups, str),
            "changes": [[ch.what, ch.a or "—", ch.b or "—"] for ch in o.changes],
        }
        for o in c.others
    ]
    return _ENV.from_string(_TEMPLATE).render(
        runs=runs,
        margin=None if c.margin is None else f"{c.margin:g}",
        regressions=c.regressions(),
        unchecked=c.unchecked(),
        others=others,
        delta_header=DELTA_HEADER,
        change_header=CHANGE_HEADER,
        legend=_legend(c.margin),
        plot=_plot(lambda: svg_of(history_figure, c.history)),
        history_runs=c.history.runs,
        history=[(t, *c.history.rows(t)) for t in c.history.metrics],
    )


def comparison_json(c: RunComparison) -> dict[str, Any]:
    """compare.json: the runs, each later run's per-setup deltas and provenance changes, the
    history and the regressions."""
    return {
        "compare_version": 1,
        "margin": c.margin,
        "gate": c.gate(),
        "regressions": c.regressions(),
        "unchecked": c.unchecked(),
        "runs": [
            {
                "path": str(r.path),
                "name": r.results.run.name,
                "config_hash": r.results.run.config_hash,
                "finished": r.results.run.finished,
            }
            for r in c.runs
        ],
        "comparisons": [
            {
                "reference": str(c.runs[0].path),
                "run": str(o.run.path),
                "setups": [dataclasses.asdict(p) for p in o.setups],
                "changes": [dataclasses.asdict(ch) for ch in o.changes],
            }
            for o in c.others
        ],
        "history": dataclasses.asdict(c.history),
    }


def write_comparison(out: Path, c: RunComparison) -> tuple[Path, Path, Path]:
    """compare.md, compare.html and compare.json in `out` (fixed names: nothing from the runs
    becomes a path), as a set: all three rendered before anything is written, each written to
    a temporary file, and only then all three renamed into place, so the folder never holds
    files of two comparisons. A folder that cannot hold them is one UserError."""
    contents = [
        render_markdown(c).encode(),
        render_html(c).encode(),
        (json.dumps(_finite(comparison_json(c)), indent=2, allow_nan=False) + "\n").encode(),
    ]
    paths = out / "compare.md", out / "compare.html", out / "compare.json"
    _check_output(out, paths)
    temps: list[Path] = []
    try:
        for path, data in zip(paths, contents, strict=True):
            temps.append(_write_temp(path, data))
        for tmp, path in zip(temps, paths, strict=True):
            os.replace(tmp, path)
    except OSError as exc:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
        raise UserError(f"--output {out}: cannot write the comparison there ({exc.strerror or exc})") from None
    return paths


def _check_output(out: Path, paths: tuple[Path, ...]) -> None:
    """`out` is a folder qeval can create or write into, and none of the three names in it is
    a folder: one UserError otherwise, before anything is written."""
    if out.exists() and not out.is_dir():
        raise UserError(
            f"--output {out}: exists and is not a folder (give a folder for compare.md, compare.html and compare.json)"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--output {out}: cannot create it ({exc.strerror or exc})") from None
    taken = [p.name for p in paths if p.is_dir() and not p.is_symlink()]
    if taken:
        raise UserError(f"--output {out}: {', '.join(taken)} is a folder; refusing to replace it")


def _write_temp(path: Path, data: bytes) -> Path:
    """`data` in a new temporary file beside `path`, flushed to disk."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _finite(value: Any) -> Any:
    """compare.json's content with every non-finite number as null (JSON has none)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
