"""The report's noise-floor section: each A/A control (the baseline served again under other
conditions) against the baseline, task by task, and which setups changed no more than it did
(docs/statistics.md, "The noise floor")."""

from __future__ import annotations

from qeval.report.sections import table_section
from qeval.report.tables import Escape
from qeval.results.metrics import describe
from qeval.results.schema import Results

HEADER = ["control", "conditions", "task", "Δ", "flips right→wrong / wrong→right", "KL", "setups within it"]
LEGEND = (
    "Each control is the baseline served again under conditions that must not change its answers; what it "
    "changed is the engine's own noise. A setup is within it where it flipped no more documents, moved its "
    "score no further and (where measured) diverged no more than the control did. A deterministic engine "
    "shows zero flips and a KL of zero. A gate a setup fails where the control's own drop reaches the "
    "margin is inconclusive: this run cannot tell the setup's drop from the engine's."
)


def rows(results: Results, esc: Escape) -> list[list[str]]:
    """One row per control and task; nothing where the run has no control that was compared."""
    out = []
    for k in (s for s in results.setups if s.control):
        conditions = ", ".join(f"{name} {v}" for name, v in (k.spec.control or {}).items())
        for task, c in k.vs_baseline.items():
            m = describe(c.metric, c.higher_is_better)
            flips = "" if c.flips_to_wrong is None else f"{c.flips_to_wrong} / {c.flips_to_right}"
            kl = "" if c.kl is None else f"{c.kl:.5f}"
            inside = [
                s.name
                for s in results.setups
                if (f := s.vs_baseline.get(task)) is not None and f.floor is not None and f.within_floor
            ]
            out.append(
                [esc(k.name), esc(conditions), esc(task), m.fmt_delta(c.delta), flips, kl, esc(", ".join(inside))]
            )
    return out


SECTION = table_section("Noise floor", "noise-floor", "The engine's own noise (A/A controls)", HEADER, rows, LEGEND)
