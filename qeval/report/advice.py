"""The report's advice section (a run with an `advise:` block, docs/advisor.md "In a run"): the
chosen mix, the verification table (the advised setup's predicted and measured memory and
quality beside the run's uniform INT4 and INT8 setups, each with its paired difference from the
baseline and its gate verdict), the held-out check against random mixes, and the per-unit
sensitivity (layer x module type; report.html draws it as heatmaps with qeval/report/plots.py's
`sensitivity_heatmap`, the figure advice.html has). Empty for results without advice."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qeval.report import plots
from qeval.report.sections import HtmlTables, ReportSection
from qeval.report.tables import Escape, md_table
from qeval.results.advice import AdviceResult
from qeval.results.metrics import describe
from qeval.results.schema import Results, SetupResult

TITLE = "Mixed-precision advice"


def _kl(x: float | None) -> str:
    return "—" if x is None else f"{x:.5f}"


def _bytes(n: int | float | None) -> str:
    return "—" if n is None else f"{int(n):,}"


def mix_row(a: AdviceResult, esc: Escape) -> tuple[list[str], list[str]]:
    """The chosen mix in one row: what is kept, its bytes, and the advisor's predictions."""
    s = a.search
    below = s.measured_calib_kl < a.uniform_kl
    header = [
        "setup",
        "target",
        "kept",
        "bytes kept",
        "allowance",
        "budget",
        f"KL uniform {esc(a.target)}",
        "KL predicted (gains added)",
        "KL measured (calibration)",
        "below the uniform's",
    ]
    row = [
        esc(a.setup),
        esc(a.target),
        esc(", ".join(s.kept) or "nothing"),
        _bytes(s.extra_bytes),
        _bytes(s.allowance_bytes),
        esc(a.budget),
        _kl(a.uniform_kl),
        _kl(s.predicted_kl),
        _kl(s.measured_calib_kl),
        "yes" if below else "no",
    ]
    return header, row


def _uniform(s: SetupResult, kv: bool = False) -> bool:
    """A uniform quanto INT4 or INT8 setup (the KV advice: a uniform quantized KV cache on 16-bit
    weights): what the advised mix is verified against."""
    spec = s.spec
    if kv:
        return spec.kv_cache != "auto" and spec.weights in (None, "bf16", "fp16", "fp32") and not spec.kv_keep
    return spec.weights in ("int4", "int8") and spec.method == "rtn" and not spec.keep and spec.kv_cache == "auto"


def _is_kv(a: AdviceResult) -> bool:
    """Whether the advice is the KV advisor's (per-layer KV precision)."""
    return a.search.kl_target is not None


def compared_setups(results: Results) -> list[SetupResult]:
    """The baseline, the advised setup, its target, then the other uniform INT4 / INT8 setups."""
    a = results.advice
    assert a is not None
    named = [results.baseline.name if results.baseline else None, a.setup, a.target]
    by_name = {s.name: s for s in results.setups}
    first = [by_name[n] for n in dict.fromkeys(named) if n in by_name]
    return first + [s for s in results.setups if s not in first and _uniform(s, _is_kv(a)) and not s.control]


def gate_verdict(s: SetupResult) -> str:
    """fail if any gated task or suite fails, else inconclusive if any is, else pass; no gate."""
    verdicts = [c.verdict for c in s.vs_baseline.values() if c.verdict] + [
        v.verdict for v in s.suites.values() if v.verdict
    ]
    if s.status != "ok":
        return "failed"
    for v in ("fail", "inconclusive", "pass"):
        if v in verdicts:
            return v
    return "no gate"


def verification(results: Results, esc: Escape) -> tuple[list[str], list[list[str]]]:
    """The verification table's header and rows (see the module docstring)."""
    a = results.advice
    assert a is not None
    held = {m.name: m.heldout_kl for m in a.heldout}
    tasks = [t for t, info in results.tasks.items() if info.entry in (None, t)]
    kl_tasks = [
        t for t in tasks if any(s.vs_baseline.get(t) and s.vs_baseline[t].kl is not None for s in results.setups)
    ]
    memory = "KV bytes per token" if _is_kv(a) else "weights"
    header = [
        "setup",
        "kept",
        f"{memory} predicted",
        f"{memory} measured",
        "advisor KL (calibration)",
        "advisor KL (held out)",
    ]
    header += [f"{esc(t)} KL to baseline (top-1)" for t in kl_tasks]
    header += [f"{esc(t)} Δ vs baseline [95% CI]" for t in tasks] + ["gates"]
    advisor = {a.target: a.uniform_kl, a.setup: a.search.measured_calib_kl}
    rows = []
    for s in compared_setups(results):
        w = s.memory.kv_bytes_per_token if _is_kv(a) else s.memory.weights_bytes
        kept = "(baseline)" if s.baseline else esc(", ".join(a.search.kept) or "nothing") if s.name == a.setup else "-"
        row = [
            esc(s.name),
            kept,
            _bytes(w.predicted),
            _bytes(w.measured),
            _kl(advisor.get(s.name)),
            _kl(held.get(s.name)),
        ]
        for t in kl_tasks:
            c = s.vs_baseline.get(t)
            row.append("" if c is None or c.kl is None else f"{c.kl:.5f} ({100 * (c.top1_agreement or 0):.1f}%)")
        for t in tasks:
            c = s.vs_baseline.get(t)
            if c is None:
                row.append("")
                continue
            m = describe(c.metric, c.higher_is_better)
            row.append(
                f"{m.fmt_delta(c.delta)} [{m.fmt_delta(c.ci[0], unit=False)}, {m.fmt_delta(c.ci[1], unit=False)}]"
            )
        row.append("" if s.baseline else gate_verdict(s))
        rows.append(row)
    return header, rows


def heldout_rows(a: AdviceResult, esc: Escape) -> list[list[str]]:
    return [
        [esc(m.name), esc(", ".join(m.kept) or "-")]
        + [_bytes(m.kv_bytes_per_token if _is_kv(a) else m.weights_bytes), _kl(m.heldout_kl)]
        for m in a.heldout
    ]


def heldout_header(a: AdviceResult) -> list[str]:
    """The held-out table's columns: the mixes' weights, or their KV bytes per token."""
    return ["mix", "kept", "KV bytes per token" if _is_kv(a) else "weights bytes (predicted)", "KL (held out)"]


def versus_line(a: AdviceResult) -> str:
    v = a.versus_random
    if v.ci95 is None or v.mean_diff is None:
        return v.verdict
    return (
        f"Random minus advisor, paired by document (mean over {v.draws} draws): {v.mean_diff:+.5f} KL, "
        f"95% CI [{v.ci95[0]:+.5f}, {v.ci95[1]:+.5f}]; {v.draws_beaten} of {v.draws} draws beaten "
        f"beyond noise: {v.verdict}."
    )


def sensitivity_rows(a: AdviceResult) -> tuple[list[str], list[list[str]]]:
    """Layer x module type as a table (the heatmap's numbers): each cell's cost and gain."""
    kinds = sorted({u.kind for u in a.units if u.layer is not None and u.kind})
    layers = sorted({u.layer for u in a.units if u.layer is not None and u.kind})
    cell = {(u.layer, u.kind): u for u in a.units if u.layer is not None and u.kind}
    kept = set(a.search.kept)
    header = ["layer"] + [f"{k} {what}" for k in kinds for what in ("cost", "gain")] + ["kept"]
    rows = []
    for layer in layers:
        row = [str(layer)]
        for k in kinds:
            u = cell.get((layer, k))
            row += [_kl(u.cost_kl if u else None), _kl(u.gain_kl if u else None)]
        row.append(", ".join(k for k in kinds if (u := cell.get((layer, k))) is not None and u.unit in kept))
        rows.append(row)
    return header, rows


def _how(a: AdviceResult) -> str:
    c, t = a.calibration, a.timing
    done = (
        "reused from advice.json (stored under this run's advice key)"
        if a.reused
        else f"computed in {t.total_s if t else 0:.1f} s ({int(t.passes if t else 0)} forward passes)"
    )
    basis = a.budget_basis if _is_kv(a) else f"Budget {a.budget} ({a.budget_bytes:,} bytes: {a.budget_basis})"
    return (
        f"{basis[0].upper()}{basis[1:]}. Calibration: {c.tokens} tokens in "
        f"{c.documents} documents of {c.source}; KL(baseline || mix) on the baseline's top-{c.top_k} "
        f"ids plus a tail bucket, mean per token. Advice {done}. The search honours the budget only: the "
        "run's gates judge the advised setup, in the verification table."
    )


def markdown(results: Results, esc: Escape) -> list[str]:
    a = results.advice
    if a is None:
        return []
    mh, mr = mix_row(a, esc)
    vh, vr = verification(results, esc)
    sh, sr = sensitivity_rows(a)
    lines = [
        f"## {TITLE}",
        "",
        esc(_how(a)),
        "",
        "### Chosen mix",
        "",
        *md_table(mh, [mr]),
        "",
        "### Verification",
        "",
        *md_table(vh, vr),
        "",
        (
            "KV bytes per token (predicted from config.json, measured on the cache's storage)"
            if _is_kv(a)
            else "Weights in bytes (predicted from config.json, measured on the loaded model)"
        )
        + "; the advisor's KL on its "
        "own calibration and held-out documents; the run's KL and Δ on the run's tasks, paired by document; "
        "gates: the setup's verdict over the config's gates.",
        "",
    ]
    if a.heldout:
        lines += [
            "### Held-out check against random mixes",
            "",
            *md_table(heldout_header(a), heldout_rows(a, esc)),
            "",
            esc(versus_line(a)),
            "",
        ]
    lines += [
        "### Sensitivity (layer x module type)",
        "",
        *md_table(sh, sr),
        "",
        "cost: KL with only this cell quantized; gain: KL recovered with only this cell kept at the model's "
        "dtype (report.html draws both as heatmaps).",
        "",
    ]
    return lines


def tables(results: Results) -> HtmlTables:
    a = results.advice
    if a is None:
        return {}
    mh, mr = mix_row(a, str)
    out: HtmlTables = {
        "Chosen mix: " + _how(a): (mh, [mr]),
        "Verification: predicted and measured, against the baseline": verification(results, str),
    }
    if a.heldout:
        out["Held-out check: " + versus_line(a)] = (heldout_header(a), heldout_rows(a, str))
    out["Sensitivity per cell (the heatmaps' numbers)"] = sensitivity_rows(a)
    return out


def figures(results: Results) -> dict[str, Callable[[Results], Any]]:
    if results.advice is None:
        return {}

    def draw(value: str) -> Callable[[Results], Any]:
        return lambda r: plots.sensitivity_heatmap(r.advice.units if r.advice else [], value)

    return {
        "Advisor sensitivity, gain: KL recovered with only this cell kept": draw("gain_kl"),
        "Advisor sensitivity, cost: KL with only this cell quantized": draw("cost_kl"),
    }


SECTION = ReportSection(title=TITLE, anchor="advice", markdown=markdown, tables=tables, figures=figures)
