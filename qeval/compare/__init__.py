"""`qeval compare RUN_A RUN_B ...`: the same setups across runs (docs/tracking.md, "Comparing
runs"). Each later run against the first, setup by setup and task by task, paired by document
where both scored the same data (and chat settings) and their records are what results.json
reports; what changed between them, from their provenance; each setup's key metric over all
the runs; and whether any got worse beyond a margin (a CI gate that fails, too, on what it
could not check)."""

from __future__ import annotations

from qeval.compare.comparison import RunComparison, compare_runs
from qeval.compare.report import write_comparison

__all__ = ["RunComparison", "compare_runs", "write_comparison"]
