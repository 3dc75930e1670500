"""The sweep's one report, RUN_DIR/report.md, from sweep.json and each model's results.json
alone (as a run's report is from its results.json): the models' baselines side by side with
each one's difference from the reference model, one recommendation per model, every setup
across the models, then each model's own report in full."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from qeval.files.atomic import atomic_write_bytes
from qeval.memory.capacity import whole_sequences
from qeval.report.markdown import render_markdown
from qeval.report.sections import ReportSection
from qeval.report.tables import code_text, md_table, md_text
from qeval.results.metrics import describe
from qeval.results.schema import Results, read_results
from qeval.sweep.schema import SweepResults, model_run_dir, read_sweep


def write_sweep_report(root: Path, sections: Sequence[ReportSection] = ()) -> Path:
    """Write RUN_DIR/report.md of a sweep (the same files always give the same bytes)."""
    sweep = read_sweep(root / "sweep.json")
    runs = {m.name: read_results(model_run_dir(root, m) / "results.json") for m in sweep.models}
    path = root / "report.md"
    atomic_write_bytes(path, render_sweep(sweep, runs, sections).encode())
    return path


def render_sweep(sweep: SweepResults, runs: dict[str, Results], sections: Sequence[ReportSection] = ()) -> str:
    """report.md of a sweep (see the module docstring); `sections` as for a run's report."""
    lines = [
        f"# qeval sweep: {md_text(sweep.name)}",
        "",
        f"{len(sweep.models)} models, each served under its setups and compared with its own baseline "
        f"(executor: {sweep.executor}). Each model's run directory is `models/<model>/`.",
        "",
    ]
    lines += _baselines(sweep) + _recommendations(sweep, runs) + _setups(sweep, runs)
    for m in sweep.models:
        own = render_markdown(runs[m.name], sections).splitlines()[1:]  # its title: the heading below
        lines += [f"## Model {md_text(m.name)}"] + [_demote(line) for line in own]
    return "\n".join(lines).rstrip("\n") + "\n"


def _demote(line: str) -> str:
    """A model's own report nested under the sweep's headings."""
    return "##" + line if re.match(r"^#+ ", line) else line


def _baselines(sweep: SweepResults) -> list[str]:
    ref = sweep.reference_model
    header = ["model", "path", "baseline"]
    for task, name in sweep.tasks.items():
        m = describe(name)
        header += [
            f"{md_text(task)} {m.name}{'' if m.higher_is_better else ' (lower is better)'}",
            f"Δ vs {md_text(ref)} [95% CI]",
        ]
    rows = []
    for model in sweep.models:
        status = "" if model.baseline_status == "ok" else f" ({model.baseline_status})"
        row = [
            md_text(model.name) + (" (reference)" if model.name == ref else ""),
            f"`{code_text(model.path)}`",
            md_text(model.baseline or "—") + status,
        ]
        vs = sweep.baselines_vs_reference.get(model.name, {})
        for task, name in sweep.tasks.items():
            m, value, cmp = describe(name), model.baseline_scores.get(task), vs.get(task)
            row.append("—" if value is None else m.fmt(value.value))
            row.append(
                ""
                if cmp is None
                else f"{m.fmt_delta(cmp.delta)} [{m.fmt_delta(cmp.ci[0], unit=False)}, "
                f"{m.fmt_delta(cmp.ci[1], unit=False)}]"
            )
        rows.append(row)
    return ["## The models' baselines", "", *md_table(header, rows)] + [
        "",
        f"Accuracies in percent. Δ is the model's baseline minus {md_text(ref)}'s, paired by document "
        f"(Newcombe's interval for accuracies, {_ratio_ci(sweep)} for bits per byte), on tasks both "
        "scored on the same data.",
        "",
    ]


def _recommendations(sweep: SweepResults, runs: dict[str, Results]) -> list[str]:
    lines = ["## Recommendation per model", ""]
    for m in sweep.models:
        rec = runs[m.name].recommendation
        if rec.blocked:
            head = f"no recommendation: {md_text(rec.blocked)}"
        elif rec.setup:  # the reason names the setup first ("int8: recommended: …")
            head = md_text(rec.reasons.get(rec.setup, f"{rec.setup}: recommended"))
        else:
            head = "no setup passes every gate and fits the budget"
        lines.append(f"- **{md_text(m.name)}**: {head}")
    return lines + [""]


def _setups(sweep: SweepResults, runs: dict[str, Results]) -> list[str]:
    """Every setup (rows) of every model (columns): its verdict and the sequences it fits."""
    names: list[str] = []
    for m in sweep.models:
        names += [s.name for s in runs[m.name].setups if s.name not in names]
    header = ["setup"] + [md_text(m.name) for m in sweep.models]
    rows = [[md_text(n)] + [_verdict(runs[m.name], n) for m in sweep.models] for n in names]
    return ["## Setups across models", "", *md_table(header, rows)] + [
        "",
        "Each setup against its own model's baseline; sequences: of the budget's context length that fit "
        "the budget. —: the model has no such setup.",
        "",
    ]


def _verdict(results: Results, name: str) -> str:
    s = next((x for x in results.setups if x.name == name), None)
    if s is None:
        return "—"
    if s.status != "ok":
        return "failed"
    rec = results.recommendation
    verdicts = {c.verdict for c in s.vs_baseline.values()}
    word = (
        "**recommended**"
        if rec.setup == name
        else "baseline"
        if s.baseline
        else "passes"
        if name in rec.candidates
        else "fails a gate"
        if "fail" in verdicts
        else "inconclusive"
        if "inconclusive" in verdicts
        else "not recommendable"
    )
    conc = s.memory.max_concurrency
    return word + ("" if conc is None else f", {whole_sequences(conc)} sequences")


def _ratio_ci(sweep: SweepResults) -> str:
    """How bits per byte was compared (sweeps written before the t-interval: a bootstrap)."""
    t = any(c.ci_method == "t" for vs in sweep.baselines_vs_reference.values() for c in vs.values())
    return "a t-interval on the paired differences" if t else "a paired bootstrap"


def regenerate(run_dir: Path) -> list[Path]:
    """`qeval report RUN_DIR`: report.md and report.html again from RUN_DIR/results.json (byte for
    byte), with every task kind's section; for a sweep, each model's and then the sweep's
    report.md from sweep.json. The paths written (a sweep's: its own report)."""
    from qeval.report.write import write_report
    from qeval.run.phases import report_sections

    if (run_dir / "sweep.json").is_file():  # a sweep: each model's report, then the sweep's
        for m in read_sweep(run_dir / "sweep.json").models:
            folder = model_run_dir(run_dir, m)
            write_report(folder, read_results(folder / "results.json"), report_sections())
        return [write_sweep_report(run_dir, report_sections())]
    return list(write_report(run_dir, read_results(run_dir / "results.json"), report_sections()))
