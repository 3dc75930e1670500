"""The first report: one table (setup, weights, KV bytes/token, each task's score and its
difference from the baseline), written to report.md and printed at the end of a run.
Generated from results.json alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from qeval.scoring import PRIMARY_METRIC
from qeval.store import atomic_write_bytes


def _mib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2**20:.2f} MiB"


def _metric_of(results: dict[str, Any], task: str) -> tuple[str, bool]:
    return PRIMARY_METRIC[results["tasks"][task]["output_type"]]


def _fmt(metric: str, value: float) -> str:
    return f"{100 * value:.1f}" if metric in ("acc", "exact_match") else f"{value:.4f}"


def _fmt_delta(metric: str, cmp: dict[str, Any] | None) -> str:
    if not cmp:
        return ""
    scale, unit = (100, " pts") if metric in ("acc", "exact_match") else (1, "")
    lo, hi = cmp["ci"]
    return f"{scale * cmp['delta']:+.{1 if scale == 100 else 4}f}{unit} [{scale * lo:+.1f}, {scale * hi:+.1f}]" \
        if scale == 100 else f"{cmp['delta']:+.4f} [{lo:+.4f}, {hi:+.4f}]"


def summary_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the summary table."""
    tasks = list(results["tasks"])
    header = ["setup", "status", "weights", "KV bytes/token"]
    for t in tasks:
        metric, higher = _metric_of(results, t)
        header += [f"{t} {metric}{'' if higher else ' (lower is better)'}", "Δ vs baseline [95% CI]"]
    rows = []
    for s in results["setups"]:
        mem = s["memory"]
        row = [s["name"] + (" (baseline)" if s["baseline"] else ""), s["status"] if s["status"] == "ok" else f"failed: {s['error']}",
               _mib(mem["weights_bytes"]["measured"]), str(mem["kv_bytes_per_token"]["measured"] or "—")]
        for t in tasks:
            metric, _ = _metric_of(results, t)
            value = s["tasks"].get(t, {}).get("metrics", {}).get(metric, {}).get("value")
            row += ["—" if value is None else _fmt(metric, value), _fmt_delta(metric, s["vs_baseline"].get(t))]
        rows.append(row)
    return header, rows


def render_markdown(results: dict[str, Any]) -> str:
    header, rows = summary_rows(results)
    run = results["run"]
    lines = [f"# qeval run: {run['name']}", "",
             f"Model `{results['config']['model']['path']}` (sha256 {run['model_sha256'][:12]}…), backend "
             f"{run['backend']} on {run['device']}, qeval {run['qeval_version']}.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    lines += ["", "Accuracies in percent; Δ is setup minus baseline with a paired-bootstrap 95% CI. "
              "Weights and KV bytes/token are measured on the loaded model (sources in results.json).", ""]
    notes = _notes(results)
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def _notes(results: dict[str, Any]) -> list[str]:
    notes = []
    for s in results["setups"]:
        for flag in s["flags"]:
            notes.append(f"**{s['name']}**: {flag}")
        kl = [(t, c["kl"], c["top1_agreement"]) for t, c in s["vs_baseline"].items() if c and c.get("kl") is not None]
        for t, k, top1 in kl:
            notes.append(f"{s['name']}: KL to baseline on {t} = {k:.5f} nats/token, top-1 agreement {100 * top1:.1f}%")
    return notes


def write_report(run_dir: Path, results: dict[str, Any]) -> Path:
    path = run_dir / "report.md"
    atomic_write_bytes(path, render_markdown(results).encode())
    return path


def print_summary(results: dict[str, Any], console: Console | None = None) -> None:
    """The same table, compact enough for a terminal: score and Δ share a cell."""
    table = Table(title=f"qeval: {results['run']['name']} (Δ vs baseline in brackets)")
    for h in ["setup", "weights", "KV B/tok"] + [f"{t} {_metric_of(results, t)[0]}" for t in results["tasks"]]:
        table.add_column(h, overflow="fold")
    for s in results["setups"]:
        mem = s["memory"]
        if s["status"] != "ok":
            table.add_row(s["name"], "failed", "", (s["error"] or "")[:60])
            continue
        cells = []
        for t in results["tasks"]:
            metric, _ = _metric_of(results, t)
            value = s["tasks"][t]["metrics"][metric]["value"]
            cmp = s["vs_baseline"].get(t)
            scale = 100 if metric in ("acc", "exact_match") else 1
            delta = f" ({scale * cmp['delta']:+.{1 if scale == 100 else 3}f})" if cmp else ""
            cells.append(_fmt(metric, value) + delta)
        table.add_row(s["name"] + (" *" if s["baseline"] else ""), _mib(mem["weights_bytes"]["measured"]),
                      str(mem["kv_bytes_per_token"]["measured"]), *cells)
    (console or Console()).print(table)
