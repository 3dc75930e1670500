"""The report's long-context section: each setup's quality against context length
beside the KV cache one sequence of that length holds, and its loss by token position against
the baseline's; with two plots for report.html. From results.json alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qeval.report.plots import finish_panels, panel_row
from qeval.report.sections import ReportSection, section_tables
from qeval.report.tables import Escape, md_table
from qeval.results.long_context import PositionBucket
from qeval.results.metrics import describe
from qeval.results.schema import Results, SetupResult


def tokens_text(n: int) -> str:
    """8192 -> "8k", 512 -> "512"."""
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _mib(n: int | None) -> str:
    if n is None:
        return "—"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def _families(results: Results) -> list[str]:
    assert results.long_context is not None
    return list(results.long_context.families)


def length_rows(results: Results, esc: Escape) -> tuple[list[str], list[list[str]]]:
    """setup x length: KV cache of one sequence, then each family's score and Δ [95% CI]."""
    info = results.long_context
    assert info is not None
    header = ["setup", "length", "KV cache / sequence"]
    for fam in _families(results):
        task = next(iter(info.families[fam].values()))
        m = describe(results.tasks[task].compared_metric)
        header += [f"{esc(fam)} {m.name}", "Δ [95% CI]"]
    rows = []
    for s in results.setups:
        if s.long_context is None or s.status != "ok":
            continue
        for p in s.long_context.lengths:
            row = [
                esc(s.name) + (" (baseline)" if s.baseline else ""),
                tokens_text(p.length) + (" (deployment)" if p.length == info.deployment_length else ""),
                _mib(p.kv_bytes) + (" (predicted)" if p.kv_source == "predicted" else ""),
            ]
            for fam in _families(results):
                row += _score_cells(s, info.families[fam].get(str(p.length)), results)
            rows.append(row)
    return header, rows


def _score_cells(s: SetupResult, task: str | None, results: Results) -> list[str]:
    if task is None or task not in s.tasks:
        return ["", ""]
    m = describe(results.tasks[task].compared_metric)
    value = s.tasks[task].metrics.get(results.tasks[task].compared_metric)
    c = s.vs_baseline.get(task)
    delta = (
        ""
        if c is None
        else (
            f"{m.fmt_delta(c.delta)} [{m.fmt_delta(c.ci[0], unit=False)}, "
            f"{m.fmt_delta(c.ci[1], unit=False)}]" + (f" {c.verdict}" if c.verdict else "")
        )
    )
    return ["—" if value is None else m.fmt(value.value), delta]


def _bucket_cell(b: PositionBucket) -> str:
    if b.delta is None or b.ci is None:
        return f"{b.nll:.3f}"
    kl = "" if b.kl is None else f"; KL {b.kl:.4f}"
    return f"{b.delta:+.4f} [{b.ci[0]:+.4f}, {b.ci[1]:+.4f}]{kl}"


def bucket_rows(results: Results, esc: Escape) -> tuple[list[str], list[list[str]]]:
    """setup x length: per position bucket, the baseline's NLL per token, and for every other
    setup Δ NLL per token [95% CI] and the KL to the baseline."""
    info = results.long_context
    assert info is not None
    edges = info.bucket_edges
    spans = list(zip(edges[:-1], edges[1:], strict=True))
    header = ["setup", "length"] + [f"{tokens_text(a)}–{tokens_text(b)}" for a, b in spans]
    rows = []
    for s in results.setups:
        if s.long_context is None or s.status != "ok":
            continue
        for p in s.long_context.lengths:
            if not p.buckets:
                continue
            cells = {b.start: _bucket_cell(b) for b in p.buckets}
            rows.append(
                [esc(s.name) + (" (baseline)" if s.baseline else ""), tokens_text(p.length)]
                + [cells.get(a, "") for a, _ in spans]
            )
    return header, rows


def markdown_section(results: Results, esc: Escape) -> list[str]:
    """The long-context section of report.md; empty without long-context tasks."""
    info = results.long_context
    if info is None:
        return []
    lengths = ", ".join(tokens_text(n) for n in info.lengths)
    lines = [
        "## Long context",
        "",
        f"Tasks generated at {lengths} tokens (seed {info.seed}, {info.samples} documents per task and "
        f"length); the deployment length is {tokens_text(info.deployment_length)}: there each family's task "
        "is gated like any task, and at the other lengths only where a gate names the length. "
        f"{esc(info.source)}.",
        "",
        "### Quality against context length",
        "",
    ]
    lines += md_table(*length_rows(results, esc))
    lines += [
        "",
        "KV cache / sequence: the setup's KV bytes per token (measured, else marked predicted) times the "
        "length. Δ: setup minus baseline with its 95% CI and the gate's verdict where a gate applies.",
        "",
    ]
    header, rows = bucket_rows(results, esc)
    if rows:
        lines += ["### Loss by token position", ""] + md_table(header, rows)
        lines += [
            "",
            "Baseline: mean NLL per token (nats) of the tokens at those positions. Other setups: Δ NLL "
            f"per token against the baseline on the same tokens [{_bucket_ci_legend(results)} over "
            "documents]; KL(baseline || setup) per token (top-16 + tail, a lower bound).",
            "",
        ]
    return lines


def quality_vs_length_figure(results: Results) -> Any:
    """Each family's score against length, one line per setup (log2 length axis)."""
    info = results.long_context
    assert info is not None
    fams = _families(results)
    fig, axes = panel_row(len(fams))
    for ax, fam in zip(axes, fams, strict=True):
        first = next(iter(info.families[fam].values()))
        m = describe(results.tasks[first].compared_metric)
        for s in (x for x in results.setups if x.status == "ok"):
            pts = [
                (int(n), s.tasks[t].metrics[m.name].value * m.scale)
                for n, t in info.families[fam].items()
                if t in s.tasks and m.name in s.tasks[t].metrics
            ]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=s.name)
        ax.set_xscale("log", base=2)
        ax.set_xticks(info.lengths, [tokens_text(n) for n in info.lengths])
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel(f"{m.name}" + (" (%)" if m.proportion else f" ({m.unit})"))
        ax.set_title(fam)
        ax.grid(alpha=0.3)
    return finish_panels(fig, axes)


def bucket_deltas_figure(results: Results) -> Any:
    """At each length, Δ NLL per token against the baseline by position bucket (95% CI), one
    line per setup."""
    info = results.long_context
    assert info is not None
    fig, axes = panel_row(len(info.lengths), 3.6, sharey=True)
    for ax, length in zip(axes, info.lengths, strict=True):
        for s in (x for x in results.setups if x.status == "ok" and not x.baseline and x.long_context):
            assert s.long_context is not None
            point = next((p for p in s.long_context.lengths if p.length == length), None)
            bs = [b for b in point.buckets if b.delta is not None and b.ci is not None] if point else []
            if not bs:
                continue
            x = [(b.start + min(b.end, length)) / 2 for b in bs]
            y = [b.delta or 0.0 for b in bs]
            err = [[(b.delta or 0) - b.ci[0] for b in bs if b.ci], [b.ci[1] - (b.delta or 0) for b in bs if b.ci]]
            ax.errorbar(x, y, yerr=err, fmt="o-", capsize=3, label=s.name)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_title(f"{tokens_text(length)} tokens")
        ax.set_xlabel("token position (bucket centre)")
        ax.grid(alpha=0.3)
    return finish_panels(fig, axes, "Δ NLL per token vs baseline (nats)")


#: the section's tables for report.html (Jinja2 escapes there); empty without long context
html_tables = section_tables(
    lambda results: results.long_context,
    ("Quality against context length (KV cache of one sequence beside it)", length_rows),
    ("Loss by token position: baseline NLL per token; others Δ NLL [95% CI]; KL", bucket_rows),
)


def _bucket_ci_legend(results: Results) -> str:
    """How the buckets' intervals were computed (results written before ci_method: a bootstrap)."""
    t = any(
        b.ci_method == "t" for s in results.setups if s.long_context for p in s.long_context.lengths for b in p.buckets
    )
    return "95% t-interval" if t else "95% paired-bootstrap CI"


def _figures(results: Results) -> dict[str, Callable[[Results], Any]]:
    if results.long_context is None:
        return {}
    return {
        "Long context: quality against context length": quality_vs_length_figure,
        "Long context: Δ NLL per token by position, 95% CI": bucket_deltas_figure,
    }


SECTION = ReportSection(
    title="Long context", anchor="long-context", markdown=markdown_section, tables=html_tables, figures=_figures
)
