"""`qeval compare --fail-on-regression`'s verdict on stderr and its exit code: 3 where a setup
got worse than in the first run beyond the margin, 4 where none did but a setup or task of the
first run could not be checked, else 0 (what is checked: qeval/compare/comparison.py)."""

from __future__ import annotations

import math
import sys

from qeval.compare.comparison import RunComparison
from qeval.errors import UserError
from qeval.run.exits import EXIT_GATE_FAILED, EXIT_NOT_CHECKED, EXIT_OK


def check_margin(margin: float | None) -> None:
    """One line for a margin that is not a finite number >= 0 (click lets inf and nan through)."""
    if margin is not None and not (math.isfinite(margin) and margin >= 0):
        raise UserError(
            f"--fail-on-regression {margin}: expected a finite number >= 0, in the "
            "compared metric's units (0.02: 2 points of accuracy)"
        )


def regression_exit(comparison: RunComparison, margin: float | None) -> int:
    """What was not checked (a warning without a margin), the regressions and the gate's verdict on
    stderr; the exit code (0 without a margin)."""
    gated = margin is not None
    for line in comparison.unchecked():
        print(f"qeval: {'not checked' if gated else 'warning: not checked'}: {line}", file=sys.stderr)
    if margin is None:
        return EXIT_OK
    for line in comparison.regressions():
        print(f"qeval: regression: {line}", file=sys.stderr)
    gate = comparison.gate()
    if gate == "regression":
        return EXIT_GATE_FAILED
    if gate == "unchecked":
        print(
            f"no regression beyond {margin:g} found, but {len(comparison.unchecked())} setup(s) or "
            "task(s) of the reference run could not be checked: the gate fails",
            file=sys.stderr,
        )
        return EXIT_NOT_CHECKED
    open_ = comparison.inconclusive()
    if open_:  # the gate passes (it fails on "worse"), but these intervals do not rule a regression out
        more = f" and {len(open_) - 5} more" if len(open_) > 5 else ""
        print(
            f"no regression beyond {margin:g} found, but none ruled out on {len(open_)} "
            f"comparison(s) whose 95% interval reaches past the margin (inconclusive): "
            f"{'; '.join(open_[:5])}{more}",
            file=sys.stderr,
        )
    else:
        print(f"no regression beyond {margin:g}", file=sys.stderr)
    return EXIT_OK
