"""The report's generated-length section: per setup and generation task, the mean tokens
generated per document and its ratio to the baseline's. A quantized model that thinks 30%
longer costs 30% more at serving time, whatever its accuracy."""

from __future__ import annotations

from qeval.report.sections import table_section
from qeval.report.tables import Escape
from qeval.results.schema import Results, SetupResult

HEADER = ["setup", "task", "mean generated tokens", "vs baseline"]
LEGEND = (
    "Tokens generated per document, the stop token and any reasoning block included (a task's "
    "`think_end_token` strips the block before scoring, not from this count); the ratio is the setup's "
    "mean over the baseline's on the same documents: the serving cost of its answers."
)


ALL = "all generation tasks"


def setup_lengths(s: SetupResult) -> dict[str, tuple[float, int]]:
    """task -> (mean generated tokens, documents) for the setup's generation tasks, and, where
    there are several, ALL: their documents pooled."""
    out = {t: (sc.generated_tokens, sc.n) for t, sc in s.tasks.items() if sc.generated_tokens is not None}
    if len(out) > 1:
        n = sum(k for _, k in out.values())
        out[ALL] = (sum(m * k for m, k in out.values()) / n, n)
    return out


def rows(results: Results, esc: Escape) -> list[list[str]]:
    """One row per setup and generation task (and their pool); nothing where no task generates."""
    base = results.baseline
    ref = setup_lengths(base) if base is not None else {}
    out = []
    for s in results.setups:
        for task, (mean, _) in setup_lengths(s).items():
            theirs = ref.get(task)
            ratio = "—" if s is base or theirs is None or not theirs[0] else f"{mean / theirs[0]:.2f}x"
            out.append([esc(s.name), esc(task), f"{mean:.1f}", ratio])
    return out


SECTION = table_section(
    "Generated length", "generated-length", "Mean tokens generated per document", HEADER, rows, LEGEND
)
