"""report.md and the end-of-run table: the recommendation, the summary table (setup,
weights, KV bytes/token, each task's score and its difference from the baseline), the
gate table, the performance section (qeval/report/performance.py) and the notes. Generated from
results.json alone (qeval.results.schema)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from qeval.config.setups import TURBOQUANT
from qeval.memory.capacity import whole_sequences
from qeval.report import divergence, floor, generated, provenance, sequence, sequential_gates, serving
from qeval.report import performance as perf_views
from qeval.report.floor import parity_cell, parity_controls
from qeval.report.sections import ReportSection
from qeval.report.tables import Escape, code_text, flips_cell, kl_cell, md_table, md_text
from qeval.results.metrics import Metric, describe
from qeval.results.schema import Comparison, Figure, Results, SetupResult


def _mib(n: int | float | None) -> str:
    return "—" if n is None else f"{n / 2**20:.2f} MiB"


def weights_text(fig: Figure, mark: str = " (predicted)") -> str:
    """Measured weights, else the prediction, marked as one (vLLM's CPU build logs no weight size)."""
    if fig.measured is None and fig.predicted is not None:
        return _mib(fig.predicted) + mark
    return _mib(fig.measured)


def kv_text(fig: Figure, mark: str = " (p)") -> str:
    """Measured KV bytes per token, else the prediction, marked as one; "n/a" where neither
    exists (an attached server reports none, and no config.json predicted it)."""
    if fig.measured is not None:
        return str(fig.measured)
    return f"{fig.predicted}{mark}" if fig.predicted is not None else "n/a"


def task_metric(results: Results, task: str) -> Metric:
    """The descriptor of the metric `task` is compared on."""
    info = results.tasks[task]
    return describe(info.compared_metric, info.higher_is_better)


def top_level(results: Results) -> list[str]:
    """The config's own tasks and lm-eval groups (a group's members are reported apart)."""
    return [t for t, info in results.tasks.items() if info.entry in (None, t)]


def _delta_cell(m: Metric, cmp: Comparison | None) -> str:
    if cmp is None:
        return ""
    lo, hi = cmp.ci
    cell = f"{m.fmt_delta(cmp.delta)} [{m.fmt_delta(lo, unit=False)}, {m.fmt_delta(hi, unit=False)}]"
    return cell + (f", {100 * cmp.recovery:.1f}%" if cmp.recovery is not None else "")


def summary_rows(results: Results, esc: Escape = md_text) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the summary table; `esc` makes names and errors safe for the format."""
    header = ["setup", "status", "weights", "KV bytes/token"]
    for t in top_level(results):
        m = task_metric(results, t)
        header += [f"{esc(t)} {m.name}{'' if m.higher_is_better else ' (lower is better)'}", "Δ vs baseline [95% CI]"]
    rows = []
    for s in results.setups:
        row = [
            esc(s.name) + (" (baseline)" if s.baseline else ""),
            s.status if s.status == "ok" else f"failed: {esc(s.error)}",
            weights_text(s.memory.weights_bytes),
            str(s.memory.kv_bytes_per_token.measured or "—"),
        ]
        for t in top_level(results):
            m = task_metric(results, t)
            value = _value(s, t, results.tasks[t].compared_metric)
            shown = "—" if value is None else m.fmt(value) + sequential_gates.fewer_documents(results, s, t)
            row += [shown, _delta_cell(m, s.vs_baseline.get(t))]
        rows.append(row)
    return header, rows


def _value(s: SetupResult, task: str, metric: str) -> float | None:
    score = s.tasks.get(task)
    value = score.metrics.get(metric) if score else None
    return value.value if value else None


#: the report's own sections, before the run phases' and the task kinds' (qeval/run/phases/)
OWN_SECTIONS = (
    floor.SECTION,
    floor.PARITY,
    provenance.SECTION,
    sequence.SECTION,
    divergence.SECTION,
    generated.SECTION,
)


def render_markdown(results: Results, sections: Sequence[ReportSection] = ()) -> str:
    """report.md: the report's own tables, then each section's (the task kinds')."""
    header, rows = summary_rows(results)
    run = results.run
    lines = [
        f"# qeval run: {md_text(run.name)}",
        "",
        f"Model `{code_text(results.config.model.path)}` (sha256 {run.model_sha256[:12]}…), backend "
        f"{run.backend} on {run.device}{_precision_text(results)}, qeval {run.qeval_version}.",
        "",
        *md_table(header, rows),
    ]
    recovery = "; the last figure is recovery, the setup's score as a share of the baseline's"
    lines += [
        "",
        f"Accuracies in percent; Δ is setup minus baseline with {_ci_legend(results)}"
        + (recovery if _any_recovery(results) else "")
        + ". Weights and KV bytes/token are measured on the "
        "loaded model, or marked predicted where the backend reports no figure (sources in results.json).",
        "",
    ]
    lines += _recommendation(results) + _suite_table(results) + _gate_table(results) + _members_table(results)
    lines += perf_views.markdown_lines(results, md_text)  # nothing for results without a performance phase
    for section in (*OWN_SECTIONS, *sections):  # the report's own, then the run phases' and task kinds'
        lines += section.markdown(results, md_text)
    notes = _notes(results)
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def _precision_text(results: Results) -> str:
    """The precision every setup computes in (the baseline's, plainly), where the run recorded it."""
    run = results.run
    if run.dtype is None:
        return ""
    return f", computing in {run.dtype} ({md_text(run.dtype_reason or run.dtype_requested)})"


def verdict_line(results: Results) -> str:
    """The answer in one line, as report.md's recommendation has it: what to deploy and why."""
    rec = results.recommendation
    if rec.blocked:
        return f"No recommendation: {rec.blocked}."
    if rec.setup is None:
        return "No setup passes every gate and fits the budget: " + "; ".join(rec.reasons.values())
    reason = rec.reasons.get(rec.setup, "").removeprefix(f"{rec.setup}: recommended")
    return f"Recommended: {rec.setup}{reason}".rstrip()


def _any_recovery(results: Results) -> bool:
    return any(c.recovery is not None for s in results.setups for c in s.vs_baseline.values())


def _suite_table(results: Results) -> list[str]:
    """Each setup's suite averages and recovery, as model cards report it."""
    rows = [
        [
            md_text(s.name),
            md_text(suite),
            f"{100 * sc.score:.1f}",
            f"{100 * sc.baseline:.1f}",
            "—" if sc.recovery is None else f"{100 * sc.recovery:.1f}%",
            "" if sc.ci is None else f"[{100 * sc.ci[0]:.1f}%, {100 * sc.ci[1]:.1f}%]",
            sc.verdict or "no gate",
        ]
        for s in results.setups
        for suite, sc in s.suites.items()
    ]
    if not rows:
        return []
    header = ["setup", "suite", "average", "baseline average", "recovery", "95% CI", "verdict"]
    lines = ["## Suites", "", *md_table(header, rows)]
    names = "; ".join(f"{md_text(k)}: {', '.join(md_text(t) for t in v)}" for k, v in results.suites.items())
    return lines + [
        "",
        f"Averages of the suites' task scores in percent ({names}); recovery is the setup's average "
        "as a share of the baseline's, its interval combined from the tasks' own intervals.",
        "",
    ]


def _members_table(results: Results) -> list[str]:
    """lm-eval group members: each task's score and difference (not gated unless named)."""
    rows = []
    for group, members in results.groups.items():
        for t in members:
            if t not in results.tasks:
                continue
            m = task_metric(results, t)
            for s in results.setups:
                value = _value(s, t, results.tasks[t].compared_metric)
                rows.append(
                    [
                        md_text(group),
                        md_text(t),
                        md_text(s.name),
                        "—" if value is None else m.fmt(value),
                        _delta_cell(m, s.vs_baseline.get(t)),
                    ]
                )
    if not rows:
        return []
    header = ["group", "task", "setup", "score", "Δ vs baseline [95% CI]"]
    return ["## lm-eval group members", "", *md_table(header, rows), ""]


def _ci_legend(results: Results) -> str:
    """How the intervals in this results file were computed (runs before ci_method was recorded
    used a paired bootstrap throughout)."""
    methods = {c.ci_method for s in results.setups for c in s.vs_baseline.values()}
    sampled = ", clustered by document over the repeats of sampled tasks" if "t_clustered" in methods else ""
    if "t" in methods or "t_clustered" in methods:
        return (
            "a 95% CI (Newcombe's paired score interval for accuracies, a t-interval on the paired differences "
            f"for bits per byte and other scores{sampled})"
        )
    if "newcombe" in methods:
        return "a 95% CI (Newcombe's paired score interval for accuracies, a paired bootstrap for bits per byte)"
    return "a paired-bootstrap 95% CI"


def budget_text(results: Results) -> str:
    """The budget as configured; overhead and margin only where the run recorded them (a
    results.json from before they existed was sized without them)."""
    b = results.config.budget
    text = f"{b.gpu_memory_gib:g} GiB x {b.utilization:g} utilization"
    if b.overhead_gib is not None:
        text += f" - {b.overhead_gib:g} GiB runtime overhead, {b.margin or 0:.0%} fragmentation margin"
    return f"{text}, {b.context_len}-token sequences"


def _recommendation(results: Results) -> list[str]:
    rec = results.recommendation
    head = "**No setup passes every gate and fits the budget.**"
    if rec.setup:
        head = f"**Recommended: {md_text(rec.setup)}**"
    if rec.blocked:
        head = f"**No recommendation: {md_text(rec.blocked)}.**"
    lines = ["## Recommendation", "", head, ""]
    partial = partial_line(results)
    if partial:  # absent from results written before partial_tasks, and from whole-config runs
        lines += [f"**{md_text(partial)}**", ""]
    lines += [f"Budget: {budget_text(results)}.", ""]
    lines += [f"- {md_text(reason)}" for reason in rec.reasons.values()]
    return lines + [""]


def partial_line(results: Results) -> str | None:
    """The warning that a run scored only part of its config (--tasks), or None."""
    partial = results.run.partial_tasks
    if not partial:
        return None
    return (
        "This run scored part of the config; the recommendation is judged on that part only. Not scored: "
        + "; ".join(f"{t}: {why}" for t, why in partial.items())
        + "."
    )


def gate_rows(results: Results, esc: Escape = md_text) -> list[list[str]]:
    """setup, task, delta, 95% CI, p (raw / BH-adjusted), flips, KL, verdict: the config's own
    tasks and groups, and any group member a gate names."""
    rows = []
    shown = set(top_level(results))
    floors, parity = has_floor(results), parity_controls(results)
    for s in results.setups:
        for task, c in s.vs_baseline.items():
            if task not in shown and c.verdict is None:
                continue
            m = describe(c.metric, c.higher_is_better)
            adjusted = c.p_adjusted if c.p_adjusted is not None else c.p_value
            p = "" if c.p_value is None else f"{c.p_value:.3g} / {adjusted:.3g}"
            delta = m.fmt_delta(c.delta, unit=False)
            ci = f"[{m.fmt_delta(c.ci[0], unit=False)}, {m.fmt_delta(c.ci[1], unit=False)}]"
            floor = [floor_cell(c, esc)] if floors else []
            floor += [parity_cell(parity, results, s, task, esc)] if parity else []
            # a figure from emulated arithmetic says so where it is read (results.json: quantization.emulated)
            emulated = " and ".join(s.quantization.emulated_parts())  # activations, KV cache, or both
            name = esc(s.name) + (f" ({emulated} emulated)" if emulated else "")
            rows.append([name, esc(task), delta, ci, p, flips_cell(c), kl_cell(c), *floor, c.verdict or "no gate"])
    return rows


GATE_HEADER = [
    "setup",
    "task",
    "Δ",
    "95% CI",
    "p (raw / BH)",
    "flips right→wrong / wrong→right",
    "KL (top-1 agreement)",
    "verdict",
]


def gate_header(results: Results) -> list[str]:
    """The gate table's columns: with the noise floor's and the engines' difference beside the
    verdict where the run has such controls."""
    extra = ["noise floor: Δ, flips, KL (control)"] if has_floor(results) else []
    extra += ["engine parity: Δ, flips (control)"] if parity_controls(results) else []
    return [*GATE_HEADER[:-1], *extra, GATE_HEADER[-1]]


def has_floor(results: Results) -> bool:
    """Whether any comparison of the run was read against an A/A control (analysis/floor.py)."""
    return any(c.floor is not None for s in results.setups for c in s.vs_baseline.values())


def floor_cell(c: Comparison, esc: Escape = md_text) -> str:
    """ "-0.5, 3 / 2, 0.00120 (bf16-b1): within": the floor on the row's task, and whether the
    setup's change is within it."""
    f = c.floor
    if f is None:
        return ""
    m = describe(c.metric, c.higher_is_better)
    figures = [m.fmt_delta(f.delta, unit=False), flips_cell(f), kl_cell(f, top1=False)]
    mark = "within" if c.within_floor else "beyond"
    return f"{', '.join(x for x in figures if x)} ({esc(f.setup)}): {mark}"


def _gate_table(results: Results) -> list[str]:
    rows = gate_rows(results)
    if not rows:
        return []
    lines = ["## Gates", "", *md_table(gate_header(results), rows)]
    return lines + ["", "Δ in points for accuracies, in bits per byte for perplexity (lower is better there).", ""]


#: the KV caches vLLM serves in formats of its own (the hf backend's int caches are other quantizers)
VLLM_KV_FORMATS = ("fp8", "fp8_e5m2", "fp8_per_token_head", "nvfp4", *TURBOQUANT)


def placement_notes(s: SetupResult) -> list[str]:
    """Where the setup's formats would not run natively on vLLM by GPU class (the vllm backend's
    placement capability, docs/backends.md "Hardware placement"): the caveat beside its quality
    figure, which is the format's own (or its emulation's), not what a fallback serves."""
    from qeval.backends import backend_entry
    from qeval.config.setups import CHECKPOINT_WEIGHTS, Setup

    place = backend_entry("vllm").placement_lines
    spec = s.spec
    # formats vLLM serves as such: checkpoints, FP8 weights, its own KV dtypes (not the hf-side quantizers)
    served = spec.weights == "fp8" or spec.method in CHECKPOINT_WEIGHTS or spec.kv_cache in VLLM_KV_FORMATS
    if place is None or spec.control is not None or not served:
        return []
    try:
        fields = {k: v for k, v in s.spec.model_dump().items() if k in Setup.model_fields and v is not None}
        setup = Setup.model_validate(fields | {"keep": tuple(s.spec.keep), "kv_keep": tuple(s.spec.kv_keep)})
    except ValueError:  # a results.json written by another version, whose setup this one cannot read
        return []
    gpu = [line.strip() for line in place([setup]) if line.startswith("  ") and " on cpu-" not in line]
    return [f"**{md_text(s.name)}** on GPUs: " + md_text("; ".join(g.split(" on ", 1)[1] for g in gpu))] if gpu else []


def _notes(results: Results) -> list[str]:
    notes = []
    for s in results.setups:
        notes += placement_notes(s)
        described = s.quantization.description
        if described:  # a pre-quantized checkpoint, described from its own quantization_config
            notes.append(
                f"**{md_text(s.name)}** serves checkpoint {md_text(str(s.quantization.checkpoint))}: "
                f"{md_text(described)}"
            )
        for flag in s.flags:
            notes.append(f"**{md_text(s.name)}**: {md_text(flag)}")
        for t, c in s.vs_baseline.items():
            if c.verdict_reason:  # absent from results written before the floor on n
                notes.append(f"{md_text(s.name)} on {md_text(t)}: {c.verdict}: {md_text(c.verdict_reason)}")
            if c.kl is not None:
                notes.append(
                    f"{md_text(s.name)}: KL to baseline on {md_text(t)} = {c.kl:.5f} nats/token, "
                    f"top-1 agreement {100 * (c.top1_agreement or 0):.1f}%"
                )
        engine = s.memory.engine
        if engine:
            parts = [f"{s.name}: the vLLM engine reported a KV pool of {engine.kv_cache_tokens:,} tokens"]
            if engine.max_concurrency is not None:
                fit = whole_sequences(engine.max_concurrency)
                parts[0] += f", {fit} sequences of {engine.max_concurrency_context} tokens"
            parts.append(f"pool sized as {engine.pool}")
            kernels = s.quantization.engine_kernels
            if kernels:
                parts.append("kernels: " + ", ".join(f"{k}: {v}" for k, v in kernels.items()))
            notes.append(md_text("; ".join(parts)))
    for d in results.dropped:
        what = f"{d.setup}/{d.task}" if d.task else f"setup {d.setup}"
        notes.append(
            f"not compared: {md_text(what)} is stored under another run's key ({md_text(d.reason)}); "
            "rerun it to include it"
        )
    for name, why in results.run.skipped_setups.items():
        notes.append(f"optional setup {md_text(name)} skipped: {md_text(why)}")
    served = serving.workload_note(results.config.as_dict())
    if served:
        notes.append(md_text(served))
    return notes


def print_summary(results: Results, console: Console | None = None) -> None:
    """The same table, compact enough for a terminal: score and Δ share a cell. Every text from
    the run (names, error messages) is escaped: rich would read `[/x]` in it as markup."""
    console = console or Console()
    table = Table(title=escape(f"qeval: {results.run.name} (Δ vs baseline in brackets)"))
    for h in ["setup", "weights", "KV B/tok"] + [f"{t} {task_metric(results, t).name}" for t in top_level(results)]:
        table.add_column(escape(h), overflow="fold", no_wrap=h == "weights")
    for s in results.setups:
        if s.status != "ok":
            table.add_row(escape(s.name), "failed", "", escape((s.error or "")[:60]))
            continue
        cells = []
        for t in top_level(results):
            m = task_metric(results, t)
            value = _value(s, t, results.tasks[t].compared_metric)
            cmp = s.vs_baseline.get(t)
            delta = f" ({m.fmt_delta(cmp.delta, unit=False)})" if cmp else ""
            fewer = sequential_gates.fewer_documents(results, s, t)
            cells.append(escape(("—" if value is None else m.fmt(value) + fewer) + delta))
        table.add_row(
            escape(s.name + (" *" if s.baseline else "")),
            escape(weights_text(s.memory.weights_bytes, " (p)")),
            escape(kv_text(s.memory.kv_bytes_per_token)),
            *cells,
        )
    console.print(table)
    perf = perf_views.terminal_speed_rows(results)
    if perf:
        speed = Table(title="performance (medians; ranges and sources in report.md)")
        for h in ("setup", "output tok/s at 1", "output tok/s at the top level", "TPOT p50 at 1 (ms)"):
            speed.add_column(h)
        for row in perf:
            speed.add_row(*(escape(cell) for cell in row))
        console.print(speed)
    if any(
        f.measured is None and f.predicted is not None
        for s in results.setups
        if s.status == "ok"
        for f in (s.memory.weights_bytes, s.memory.kv_bytes_per_token)
    ):
        console.print("(p): predicted from config.json; this backend measures no such figure (see report.md)")
