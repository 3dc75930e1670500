"""report.md and the end-of-run table: the recommendation, the summary table (setup,
weights, KV bytes/token, each task's score and its difference from the baseline), the
gate table and the notes. Generated from results.json alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from qeval.scoring import PRIMARY_METRIC


# `*` and `_` are left alone: at worst they italicise, and names such as compare_mc stay readable
_MD_SPECIAL = str.maketrans({c: f"\\{c}" for c in "\\`[]|"} | {"<": "&lt;", ">": "&gt;", "&": "&amp;",
                                                              "\n": " ", "\r": " "})


def md_text(value: object) -> str:
    """Text from the results (names, errors, paths, reasons) made inert in markdown: no table
    cell is split by a `|`, no HTML or link passes through, no line is broken. (The HTML
    report passes `esc=str`: Jinja2 autoescapes there.)"""
    return str(value).translate(_MD_SPECIAL)


def _code(value: object) -> str:
    """Text inside a `code span`: only a backtick or a line break can escape it."""
    return str(value).replace("`", "'").replace("\n", " ").replace("\r", " ")


def _mib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2**20:.2f} MiB"


def _weights(fig: dict[str, Any], mark: str = " (predicted)") -> str:
    """Measured weights, else the prediction, marked as one (vLLM's CPU build logs no weight size)."""
    if fig["measured"] is None and fig.get("predicted") is not None:
        return _mib(fig["predicted"]) + mark
    return _mib(fig["measured"])


def _metric_of(results: dict[str, Any], task: str) -> tuple[str, bool]:
    return PRIMARY_METRIC[results["tasks"][task]["output_type"]]


def _fmt(metric: str, value: float) -> str:
    return f"{100 * value:.1f}" if metric in ("acc", "exact_match") else f"{value:.4f}"


def _fmt_delta(metric: str, cmp: dict[str, Any] | None) -> str:
    if not cmp:
        return ""
    lo, hi = cmp["ci"]
    if metric in ("acc", "exact_match"):  # points, one decimal
        return f"{100 * cmp['delta']:+.1f} pts [{100 * lo:+.1f}, {100 * hi:+.1f}]"
    return f"{cmp['delta']:+.4f} [{lo:+.4f}, {hi:+.4f}]"


def summary_rows(results: dict[str, Any], esc: Callable[[object], str] = md_text) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the summary table; `esc` makes names and errors safe for the format."""
    tasks = list(results["tasks"])
    header = ["setup", "status", "weights", "KV bytes/token"]
    for t in tasks:
        metric, higher = _metric_of(results, t)
        header += [f"{esc(t)} {metric}{'' if higher else ' (lower is better)'}", "Δ vs baseline [95% CI]"]
    rows = []
    for s in results["setups"]:
        mem = s["memory"]
        row = [esc(s["name"]) + (" (baseline)" if s["baseline"] else ""),
               s["status"] if s["status"] == "ok" else f"failed: {esc(s['error'])}",
               _weights(mem["weights_bytes"]), str(mem["kv_bytes_per_token"]["measured"] or "—")]
        for t in tasks:
            metric, _ = _metric_of(results, t)
            value = s["tasks"].get(t, {}).get("metrics", {}).get(metric, {}).get("value")
            row += ["—" if value is None else _fmt(metric, value), _fmt_delta(metric, s["vs_baseline"].get(t))]
        rows.append(row)
    return header, rows


def render_markdown(results: dict[str, Any]) -> str:
    header, rows = summary_rows(results)
    run = results["run"]
    lines = [f"# qeval run: {md_text(run['name'])}", "",
             f"Model `{_code(results['config']['model']['path'])}` (sha256 {run['model_sha256'][:12]}…), backend "
             f"{run['backend']} on {run['device']}, qeval {run['qeval_version']}.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += ["", "Accuracies in percent; Δ is setup minus baseline with a paired-bootstrap 95% CI. "
              "Weights and KV bytes/token are measured on the loaded model, or marked predicted where the "
              "backend reports no figure (sources in results.json).", ""]
    lines += _recommendation(results) + _gate_table(results)
    notes = _notes(results)
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def _recommendation(results: dict[str, Any]) -> list[str]:
    rec = results["recommendation"]
    head = f"**Recommended: {md_text(rec['setup'])}**" if rec["setup"] else "**No setup passes every gate and fits the budget.**"
    if rec.get("blocked"):
        head = f"**No recommendation: {md_text(rec['blocked'])}.**"
    b = results["config"]["budget"]
    lines = ["## Recommendation", "", head, "",
             f"Budget: {b['gpu_memory_gib']:g} GiB x {b['utilization']:g} utilization, {b['context_len']}-token sequences.", ""]
    lines += [f"- {md_text(reason)}" for reason in rec["reasons"].values()]
    return lines + [""]


def gate_rows(results: dict[str, Any], esc: Callable[[object], str] = md_text) -> list[list[str]]:
    """setup, task, delta, 95% CI, p (raw / BH-adjusted), flips, KL, verdict."""
    rows = []
    for s in results["setups"]:
        for task, c in s["vs_baseline"].items():
            if not c:
                continue
            scale = 100 if c["metric"] in ("acc", "exact_match") else 1
            digits = 1 if scale == 100 else 4
            flips = "" if c["flips_to_wrong"] is None else f"{c['flips_to_wrong']} / {c['flips_to_right']}"
            p = "" if c["p_value"] is None else f"{c['p_value']:.3g} / {c.get('p_adjusted', c['p_value']):.3g}"
            kl = "" if c.get("kl") is None else f"{c['kl']:.5f} ({100 * c['top1_agreement']:.1f}%)"
            rows.append([esc(s["name"]), esc(task), f"{scale * c['delta']:+.{digits}f}",
                         f"[{scale * c['ci'][0]:+.{digits}f}, {scale * c['ci'][1]:+.{digits}f}]", p, flips, kl,
                         c.get("verdict") or "no gate"])
    return rows


GATE_HEADER = ["setup", "task", "Δ", "95% CI", "p (raw / BH)", "flips right→wrong / wrong→right",
               "KL (top-1 agreement)", "verdict"]


def _gate_table(results: dict[str, Any]) -> list[str]:
    rows = gate_rows(results)
    if not rows:
        return []
    lines = ["## Gates", "", "| " + " | ".join(GATE_HEADER) + " |", "|" + "---|" * len(GATE_HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines + ["", "Δ in points for accuracies, in bits per byte for perplexity (lower is better there).", ""]


def _notes(results: dict[str, Any]) -> list[str]:
    notes = []
    for s in results["setups"]:
        for flag in s["flags"]:
            notes.append(f"**{md_text(s['name'])}**: {md_text(flag)}")
        kl = [(t, c["kl"], c["top1_agreement"]) for t, c in s["vs_baseline"].items() if c and c.get("kl") is not None]
        for t, k, top1 in kl:
            notes.append(f"{md_text(s['name'])}: KL to baseline on {md_text(t)} = {k:.5f} nats/token, "
                         f"top-1 agreement {100 * top1:.1f}%")
        engine = s["memory"].get("engine")
        if engine:
            parts = [f"{s['name']}: the vLLM engine reported a KV pool of {engine['kv_cache_tokens']:,} tokens"]
            if engine["max_concurrency"] is not None:
                parts[0] += f", {engine['max_concurrency']:g} sequences of {engine['max_concurrency_context']} tokens"
            parts.append(f"pool sized as {engine['pool']}")
            kernels = s.get("quantization", {}).get("engine_kernels")
            if kernels:
                parts.append("kernels: " + ", ".join(f"{k}: {v}" for k, v in kernels.items()))
            notes.append(md_text("; ".join(parts)))
    for d in results.get("dropped", []):
        what = f"{d['setup']}/{d['task']}" if d.get("task") else f"setup {d['setup']}"
        notes.append(f"not compared: {md_text(what)} is stored under another run's key ({md_text(d['reason'])}); "
                     "rerun it to include it")
    for name, why in results["run"].get("skipped_setups", {}).items():
        notes.append(f"optional setup {md_text(name)} skipped: {md_text(why)}")
    return notes


def print_summary(results: dict[str, Any], console: Console | None = None) -> None:
    """The same table, compact enough for a terminal: score and Δ share a cell."""
    table = Table(title=f"qeval: {results['run']['name']} (Δ vs baseline in brackets)")
    for h in ["setup", "weights", "KV B/tok"] + [f"{t} {_metric_of(results, t)[0]}" for t in results["tasks"]]:
        table.add_column(h, overflow="fold", no_wrap=h == "weights")
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
        table.add_row(s["name"] + (" *" if s["baseline"] else ""), _weights(mem["weights_bytes"], " (p)"),
                      str(mem["kv_bytes_per_token"]["measured"]), *cells)
    (console or Console()).print(table)
    if any(s["memory"]["weights_bytes"]["measured"] is None for s in results["setups"] if s["status"] == "ok"):
        (console or Console()).print("(p): predicted; this backend reports no weight size (see report.md)")
