"""The report's noise-floor and engine-parity sections: each A/A control (the baseline served again
under other conditions) against the baseline, task by task, and which setups changed no more than
it did; and each engine-parity control (the baseline on another backend), paired per document
(docs/statistics.md, "The noise floor" and "Engine parity")."""

from __future__ import annotations

from collections.abc import Iterator

from qeval.analysis.floor import changed_documents
from qeval.report.sections import table_section
from qeval.report.tables import Escape, flips_cell, kl_cell
from qeval.results.metrics import Metric, describe
from qeval.results.schema import Comparison, Results, SetupResult

HEADER = ["control", "conditions", "task", "Δ", "flips right→wrong / wrong→right", "KL", "setups within it"]
LEGEND = (
    "Each control is the baseline served again under conditions that must not change its answers; what it "
    "changed is the engine's own noise. A setup is within it where it flipped no more documents, moved its "
    "score no further and (where measured) diverged no more than the control did. A deterministic engine "
    "shows zero flips and a KL of zero. A gate a setup fails where the control's own drop reaches the "
    "margin is inconclusive: this run cannot tell the setup's drop from the engine's."
)


def _compared(results: Results, parity: bool) -> Iterator[tuple[SetupResult, str, Comparison, Metric]]:
    """Each control of one sort (the engine-parity controls, else the noise floor's A/A controls) with
    each task it was compared on, and the descriptor of that task's metric."""
    for k in results.setups:
        if k.control and k.parity == parity:
            for task, c in k.vs_baseline.items():
                yield k, task, c, describe(c.metric, c.higher_is_better)


def rows(results: Results, esc: Escape) -> list[list[str]]:
    """One row per control and task; nothing where the run has no control that was compared."""
    out = []
    for k, task, c, m in _compared(results, parity=False):
        inside = [
            s.name
            for s in results.setups
            if (f := s.vs_baseline.get(task)) is not None and f.floor is not None and f.within_floor
        ]
        cells = [m.fmt_delta(c.delta), flips_cell(c), kl_cell(c, top1=False), esc(", ".join(inside))]
        out.append([esc(k.name), esc(k.spec.conditions()), esc(task), *cells])
    return out


SECTION = table_section("Noise floor", "noise-floor", "The engine's own noise (A/A controls)", HEADER, rows, LEGEND)


PARITY_HEADER = [
    "control",
    "served on",
    "task",
    "Δ",
    "95% CI",
    "same outcome",
    "flips right→wrong / wrong→right",
    "KL (top-1)",
]
PARITY_LEGEND = (
    "Each parity control is the baseline (or the setup it is against) served on another engine, paired with "
    "it document by document: Δ is the other engine minus the run's, same outcome the share of documents "
    "scored alike (right on both or wrong on both), KL the other engine's divergence from the run's "
    "next-token distribution on the scored tokens. Its difference is the engines', not the quantization's; it "
    "is never a candidate."
)


def parity_rows(results: Results, esc: Escape) -> list[list[str]]:
    """One row per engine-parity control and task; nothing where the run has none."""
    out = []
    for k, task, c, m in _compared(results, parity=True):
        on = ", ".join(x for x in (k.spec.served_on() or "", k.spec.conditions()) if x)
        on += f"; against {k.spec.partner()}" if k.spec.partner() else ""
        changed = changed_documents(c)
        same = "" if changed is None or not c.n else f"{100 * (1 - changed / c.n):.1f}%"
        ci = f"[{m.fmt_delta(c.ci[0])}, {m.fmt_delta(c.ci[1])}]"
        out.append([esc(k.name), esc(on), esc(task), m.fmt_delta(c.delta), ci, same, flips_cell(c), kl_cell(c)])
    return out


PARITY = table_section(
    "Engine parity", "engine-parity", "The same setup on another engine", PARITY_HEADER, parity_rows, PARITY_LEGEND
)


def parity_controls(results: Results) -> dict[str, SetupResult]:
    """Each engine-parity control that ran, by the setup it serves again (its `of`, else the baseline)."""
    base = results.baseline.name if results.baseline else ""
    out: dict[str, SetupResult] = {}
    for k in results.setups:  # the first of several for one setup: the config's own order
        if k.parity and k.status == "ok" and k.vs_baseline:
            out.setdefault(k.spec.partner() or base, k)
    return out


def parity_cell(parity: dict[str, SetupResult], results: Results, setup: SetupResult, task: str, esc: Escape) -> str:
    """ "-0.8, 11 / 7 (w8a8-on-vllm)": the engines' difference on the row's task, the setup's own
    parity control's where it has one, else the baseline's (its engines' gap); '' for a control."""
    if setup.control:
        return ""
    base = results.baseline.name if results.baseline else ""
    k = parity.get(setup.name) or parity.get(base)
    c = k.vs_baseline.get(task) if k else None
    if k is None or c is None:
        return ""
    m = describe(c.metric, c.higher_is_better)
    figures = [m.fmt_delta(c.delta, unit=False), flips_cell(c)]
    return f"{', '.join(x for x in figures if x)} ({esc(k.name)})"
