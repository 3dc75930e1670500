"""The serving report (RUN_DIR/serving.md, with its figures as SVG files beside it): per setup its
levels (goodput, throughput, latency percentiles, KV usage, preemptions, queueing), the tuner's
pick and cost, its `vllm serve` command, the recommendation; figures: throughput against p99
latency (the Pareto front), goodput per setup, KV usage across load levels. And SECTION, the run
report's section on results.json's `serving` block (report.md and report.html)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qeval.files.atomic import atomic_write_bytes
from qeval.report.plots import svg_of
from qeval.report.pyplot import subplots
from qeval.report.sections import HtmlTables, ReportSection
from qeval.report.tables import Escape, md_table
from qeval.results.schema import Results
from qeval.results.serving import ServingLevel, ServingResults, ServingSetup

FIGURES = ("serving-pareto.svg", "serving-goodput.svg", "serving-kv.svg")


def _p(results: ServingResults) -> str:
    return f"p{results.workload.slo.get('percentile', 99):g}"


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(throughput, latency) points no other point beats on both (more throughput, less latency)."""
    return sorted(p for p in points if not any(q != p and q[0] >= p[0] and q[1] <= p[1] for q in points))


def pareto_figure(results: ServingResults) -> Any:
    """Throughput (x) against the SLO's percentile of E2E latency (y), every level, per setup;
    each setup's Pareto front joined."""
    p = _p(results)
    fig, ax = subplots(figsize=(6, 3.6))
    for row in results.setups:
        pts = [(lv.throughput_rps, lv.percentiles_ms["e2e"][p]) for lv in row.levels]
        if not pts:
            continue
        line = ax.scatter(*zip(*pts, strict=True), label=row.setup, zorder=3)
        front = pareto_front(pts)
        ax.plot(*zip(*front, strict=True), color=line.get_facecolor()[0], alpha=0.6)
    ax.set_xlabel("throughput (completed requests/s)")
    ax.set_ylabel(f"{p} end-to-end latency (ms)")
    ax.set_title("every load level; lines: each setup's Pareto front", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def goodput_figure(results: ServingResults) -> Any:
    """Each setup's goodput at its pick (0 where no level met the SLO)."""
    fig, ax = subplots(figsize=(6, 2.6))
    names = [r.setup for r in results.setups]
    values = [r.pick.goodput_rps if r.pick else 0.0 for r in results.setups]
    ax.barh(names, values, color=["#4477aa" if r.pick else "#bbbbbb" for r in results.setups])
    for i, r in enumerate(results.setups):
        ax.annotate(
            f"{values[i]:.3f}/s" if r.pick else "SLO not met",
            (values[i], i),
            xytext=(4, -3),
            textcoords="offset points",
            fontsize=8,
        )
    ax.set_xlabel("goodput at the tuned flags (requests/s within the SLO)")
    ax.grid(alpha=0.3, axis="x")
    return fig


def kv_figure(results: ServingResults) -> Any:
    """Peak KV-cache usage (y) against the offered rate (x), one line per setup and max-num-seqs."""
    fig, ax = subplots(figsize=(6, 3.2))
    for row in results.setups:
        by: dict[int, list[ServingLevel]] = {}
        for lv in row.levels:
            by.setdefault(lv.max_num_seqs, []).append(lv)
        for mns, levels in by.items():
            pts = [(lv.rate, lv.kv_usage_peak * 100) for lv in levels if lv.kv_usage_peak is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=f"{row.setup}, max-num-seqs {mns}")
    ax.axhline(results.kv_usage_limit * 100, color="#cc6677", linestyle="--", linewidth=1)
    ax.set_xlabel("offered rate (requests/s)")
    ax.set_ylabel("peak KV-cache usage (%)")
    ax.set_title(f"dashed: the tuner's limit, {results.kv_usage_limit:.0%}", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def level_rows(results: ServingResults) -> list[dict[str, Any]]:
    """One row per setup and level: the table the report and `load_run(...).serving()` show."""
    p = _p(results)
    rows = []
    for r in results.setups:
        for lv in r.levels:
            rows.append(
                {
                    "setup": r.setup,
                    "max_num_seqs": lv.max_num_seqs,
                    "rate": lv.rate,
                    "goodput_rps": lv.goodput_rps,
                    "vllm_goodput_rps": lv.vllm_goodput_rps,
                    "throughput_rps": lv.throughput_rps,
                    "output_tokens_per_s": lv.output_tokens_per_s,
                    **{
                        f"{name}_{q}_ms": lv.percentiles_ms[name][q]
                        for name in ("ttft", "tpot", "itl", "e2e")
                        for q in sorted({"p50", "p90", "p99", p})
                    },
                    "kv_usage_peak": lv.kv_usage_peak,
                    "kv_usage_mean": lv.kv_usage_mean,
                    "preemptions": lv.preemptions,
                    "queue_time_mean_ms": lv.queue_time_mean_ms,
                    "meets_slo": lv.meets_slo,
                    "failed": lv.failed,
                }
            )
    return rows


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def markdown(results: ServingResults) -> str:
    """serving.md."""
    w, p = results.workload, _p(results)
    rec = results.recommendation
    lines = [
        f"# Serving the workload: {results.config}",
        "",
        f"Workload: {w.source}, {w.requests_per_level} requests per level, {w.arrivals}; "
        f"max-model-len {w.max_model_len} (p{w.percentile} of prompt + output, rounded up to "
        f"KV blocks), refusing {w.refused} of {w.trace_requests} requests of the trace; "
        f"prefix caching {'on' if w.prefix_caching else 'off'}. SLO: {w.slo}.",
        f"Load generator: {results.load_generator}. Machine: {results.machine}.",
        "",
    ]
    lines += [f"**Recommendation (by goodput):** {rec.setup or 'none'}", ""]
    for reason in rec.reasons.values():
        lines.append(f"- {reason}")
    lines += ["", "## Each setup's `vllm serve` command", ""]
    for r in results.setups:
        tuned = "tuned" if r.pick else "no level met the SLO: the first setting's flags"
        lines += [
            f"{r.setup} ({tuned}; search: {r.restarts} of at most {r.bound_restarts} engine starts, "
            f"{len(r.levels)} of at most {r.bound_levels} levels, {r.seconds or 0:.0f} s):",
            "",
            f"    {r.serve_command}",
            "",
        ]
        if r.status != "ok":
            lines += [f"failed: {r.error}", ""]
    lines += _levels_lines(results, p)
    lines += ["", "## Figures", ""] + [f"![{name}]({name})" for name in FIGURES]
    if results.notes:
        lines += ["", "Notes: " + "; ".join(results.notes) + "."]
    return "\n".join(lines) + "\n"


def _levels_lines(results: ServingResults, p: str) -> list[str]:
    """serving.md's table of every setup's measured levels (`p`: the SLO's percentile column)."""
    lines = [
        "## Levels",
        "",
        "Latencies in ms (np.percentile over the level's requests); goodput: requests "
        "within every per-request target per second; KV: vllm:kv_cache_usage_perc sampled while requests "
        "ran (peak / mean).",
        "",
        f"| setup | max-num-seqs | rate/s | goodput/s | req/s | TTFT p50 / {p} | TPOT p50 / {p} | "
        f"ITL {p} | E2E p50 / {p} | KV peak / mean | preempt | queue ms | SLO |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in results.setups:
        for lv in r.levels:
            pc = lv.percentiles_ms
            queue = f"{lv.queue_time_mean_ms:,.0f}" if lv.queue_time_mean_ms is not None else "n/a"
            lines.append(
                f"| {r.setup} | {lv.max_num_seqs} | {lv.rate:g} | {lv.goodput_rps:.3f} | {lv.throughput_rps:.3f} | "
                f"{pc['ttft']['p50']:,.0f} / {pc['ttft'][p]:,.0f} | {pc['tpot']['p50']:,.1f} / {pc['tpot'][p]:,.1f} | "
                f"{pc['itl'][p]:,.1f} | {pc['e2e']['p50']:,.0f} / {pc['e2e'][p]:,.0f} | "
                f"{_pct(lv.kv_usage_peak)} / {_pct(lv.kv_usage_mean)} | "
                f"{lv.preemptions if lv.preemptions is not None else 'n/a'} | {queue} | "
                f"{'met' if lv.meets_slo else 'broken: ' + '; '.join(lv.violations)} |"
            )
    return lines


def write_report(results: ServingResults, out: Path) -> Path:
    """serving.md and its three SVG figures in `out`, each written atomically."""
    for name, make in zip(FIGURES, (pareto_figure, goodput_figure, kv_figure), strict=True):
        atomic_write_bytes(out / name, svg_of(make, results).encode())
    path = out / "serving.md"
    atomic_write_bytes(path, markdown(results).encode())
    return path


def setup_rows(results: ServingResults) -> list[dict[str, Any]]:
    """One row per setup: the tuner's pick, its cost, the command line, the recommendation's reason."""
    reasons = results.recommendation.reasons
    return [
        {
            "setup": r.setup,
            "status": r.status,
            "recommended": r.setup == results.recommendation.setup,
            "goodput_rps": r.pick.goodput_rps if r.pick else None,
            "max_num_seqs": r.pick.max_num_seqs if r.pick else None,
            "rate": r.pick.rate if r.pick else None,
            "best_p99_ms": r.best_p99_ms or None,
            "max_model_len": r.max_model_len,
            "engine_starts": r.restarts,
            "levels": len(r.levels),
            "serve_command": r.serve_command,
            "reason": reasons.get(r.setup),
        }
        for r in results.setups
    ]


def workload_note(config: dict[str, Any]) -> str | None:
    """report.md's note on a run with a `workload:` block: where its goodput is (or is not) measured."""
    workload = config.get("workload")
    if not workload or config.get("recommend_by") == "goodput":  # served by the run: its own section says so
        return None
    return (
        "workload: this run measured no goodput: it is measured on `vllm serve` only, by `qeval run` under "
        "`recommend_by: goodput` or by `qeval goodput` on this config (RUN_DIR/serving.md); the hf backend has "
        "no server to load, and there the workload's lengths drive `qeval plan --workload` and, with "
        "`performance.from_workload`, the timed waves"
    )


# -- the run report's section (results.json `serving`, `qeval run` under recommend_by: goodput) --

SECTION_TITLE = "Serving the workload"
SECTION_HEADER = [
    "setup",
    "goodput/s",
    "at rate/s",
    "max-num-seqs",
    "TTFT pct",
    "TPOT pct",
    "KV peak",
    "levels",
    "`vllm serve` command",
]


def _pick_level(row: ServingSetup) -> ServingLevel | None:
    if row.pick is None:
        return None
    return next(
        (
            lv
            for lv in row.levels
            if lv.max_num_seqs == row.pick.max_num_seqs
            and lv.rate == row.pick.rate
            and lv.max_num_batched_tokens == row.pick.max_num_batched_tokens
        ),
        None,
    )


def section_rows(results: Results, esc: Escape) -> list[list[str]]:
    """One row per served setup: its tuned pick (or the failure / the best it reached) and command."""
    served = results.serving
    if served is None:
        return []
    p = _p(served)
    out = []
    for r in served.setups:
        lv = _pick_level(r)
        if r.status != "ok":
            cells = ["failed", "", "", "", "", "", f"{len(r.levels)}"]
        elif lv is None or r.pick is None:
            best = ", ".join(f"{k.removesuffix('_ms').upper()} {v:,.0f} ms" for k, v in r.best_p99_ms.items())
            cells = [f"SLO not met (best {p}: {best})", "", "", "", "", "", f"{len(r.levels)}"]
        else:
            cells = [
                f"{r.pick.goodput_rps:.3f}",
                f"{r.pick.rate:g}",
                str(r.pick.max_num_seqs),
                f"{lv.percentiles_ms['ttft'][p]:,.0f} ms",
                f"{lv.percentiles_ms['tpot'][p]:,.1f} ms",
                _pct(lv.kv_usage_peak),
                f"{len(r.levels)}",
            ]
        out.append([esc(r.setup), *cells, esc(r.serve_command)])
    return out


def section_markdown(results: Results, esc: Escape) -> list[str]:
    """report.md's section: the workload, the SLO, each setup's tuned row and the figures' files."""
    served = results.serving
    if served is None:
        return []
    w = served.workload
    lines = [
        f"## {SECTION_TITLE}",
        "",
        esc(
            f"Workload {w.source}: {w.requests_per_level} requests per level, {w.arrivals}; "
            f"max-model-len {w.max_model_len} (p{w.percentile} of prompt + output, rounded up to "
            f"KV blocks; refuses {w.refused} of {w.trace_requests} requests); SLO "
            f"{w.slo}; load generator {served.load_generator}; machine {served.machine}."
        ),
        "",
        *md_table([h.replace("pct", _p(served)) for h in SECTION_HEADER], section_rows(results, esc)),
        "",
        esc(
            f"Goodput: requests within every target per second at the tuned flags (the highest goodput within "
            f"the SLO, KV usage under {served.kv_usage_limit:.0%}); every level, and the figures "
            f"({', '.join(FIGURES)}), in serving.md."
        ),
        "",
    ]
    return lines


def section_tables(results: Results) -> HtmlTables:
    body = section_rows(results, str)
    if not body or results.serving is None:
        return {}
    header = [h.replace("pct", _p(results.serving)) for h in SECTION_HEADER]
    levels = level_rows(results.serving)
    keys = list(levels[0]) if levels else []
    return {
        "each setup at its tuned flags": (header, body),
        "every load level": (keys, [[_cell(row[k]) for k in keys] for row in levels]),
    }


def _cell(x: Any) -> str:
    return "" if x is None else f"{x:g}" if isinstance(x, float) else str(x)


def section_figures(results: Results) -> dict[str, Any]:
    served = results.serving
    if served is None or not any(r.levels for r in served.setups):
        return {}
    pareto = "Serving: throughput against p99 end-to-end latency, every level (lines: each setup's Pareto front)"
    return {
        pareto: lambda _r: pareto_figure(served),
        "Serving: goodput per setup at its tuned flags": lambda _r: goodput_figure(served),
        "Serving: peak KV-cache usage across load levels": lambda _r: kv_figure(served),
    }


SECTION = ReportSection(
    title=SECTION_TITLE, anchor="serving", markdown=section_markdown, tables=section_tables, figures=section_figures
)
