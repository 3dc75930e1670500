"""One comparison of runs: the runs (the first is the reference), each later run against it
setup by setup with what changed, and each setup's key metric over them all (docs/tracking.md,
"Comparing runs"). In a module of its own so that the report imports it without importing the
package that re-exports both."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qeval.compare.history import History, history
from qeval.compare.pairing import SetupPair, compare_setups
from qeval.compare.provenance import Change, provenance_diff
from qeval.compare.runs import LoadedRun, load_runs


@dataclass
class OtherRun:
    """A run compared with the reference: per setup its deltas, and what changed."""

    run: LoadedRun
    setups: list[SetupPair]
    changes: list[Change]


@dataclass
class RunComparison:
    """The runs (the first is the reference), each other run against it, and the history."""

    runs: list[LoadedRun]
    margin: float | None
    others: list[OtherRun]
    history: History

    def regressions(self) -> list[str]:
        """One line per setup and task that got worse beyond the margin with 95% confidence (and
        per setup that stopped working), naming the run; empty without a margin."""
        if self.margin is None:
            return []
        return [f"{o.run.path.name}: {line}" for o in self.others for p in o.setups for line in p.regressions()]

    def unchecked(self) -> list[str]:
        """One line per setup and task the reference run holds that a later run could not be
        checked on (absent, not scored, records that are not what results.json reports, too few
        documents, no interval): a gate that could not check them has not passed."""
        return [f"{o.run.path.name}: {line}" for o in self.others for p in o.setups for line in p.unchecked()]

    def inconclusive(self) -> list[str]:
        """One line per setup and task whose 95% interval reaches past the margin on the bad side
        without lying wholly beyond it: no regression found there, and none ruled out."""
        return [
            f"{o.run.path.name}: {p.setup} · {t.task}"
            for o in self.others
            for p in o.setups
            for t in p.tasks
            if t.verdict == "inconclusive"
        ]

    def gate(self) -> str | None:
        """`--fail-on-regression`'s outcome: "regression", "unchecked" (none found, but not all
        checked) or "pass"; None without a margin."""
        if self.margin is None:
            return None
        return "regression" if self.regressions() else "unchecked" if self.unchecked() else "pass"


def compare_runs(paths: list[Path], margin: float | None = None) -> RunComparison:
    """Load and compare the runs in `paths` (one UserError for a folder that is not a run)."""
    runs = load_runs(paths)
    ref = runs[0]
    others = [OtherRun(r, compare_setups(ref, r, margin), provenance_diff(ref.results, r.results)) for r in runs[1:]]
    return RunComparison(runs, margin, others, history(runs))
