"""Choose the units to keep at the model's dtype under a budget: exact where the candidates
are few (every subset, the KL gains taken as additive), else greedy on KL gained per byte."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from qeval.config.advise import AdviceBudget, parse_advice_budget
from qeval.errors import UserError

#: candidates up to which every subset is tried (2^12 sums: instant)
EXACT_UP_TO = 12


def parse_budget(text: str) -> AdviceBudget:
    """`4.5bpw` (or `4.5bits`), `350MiB`, `2GiB`, `123456B`; anything else is a UserError."""
    return parse_advice_budget(text, "--budget")


@dataclass(frozen=True)
class Choice:
    """The kept units and what they were chosen by."""

    kept: tuple[int, ...]  # indices into the candidates
    extra_bytes: int
    predicted_gain: float  # the sum of the kept units' measured gains
    method: str  # "exact" or "greedy"


def choose(gains: list[float], costs: list[int], allowance: int) -> Choice:
    """Keep units whose summed gain is largest with summed cost <= allowance bytes."""
    if allowance < 0:
        raise UserError(
            "the budget is below the uniformly quantized setup itself: nothing to keep, and the target does not fit"
        )
    useful = [i for i, g in enumerate(gains) if g > 0]  # keeping a unit that gains nothing wastes bytes
    if len(useful) <= EXACT_UP_TO:
        best: tuple[float, int, tuple[int, ...]] = (0.0, 0, ())
        for r in range(1, len(useful) + 1):
            for subset in itertools.combinations(useful, r):
                cost = sum(costs[i] for i in subset)
                gain = sum(gains[i] for i in subset)
                if cost <= allowance and (gain > best[0] or (gain == best[0] and cost < best[1])):
                    best = (gain, cost, subset)
        return Choice(tuple(sorted(best[2])), best[1], best[0], "exact")
    kept: list[int] = []
    spent = 0
    for i in sorted(useful, key=lambda i: -gains[i] / max(costs[i], 1)):
        if spent + costs[i] <= allowance:  # a unit that does not fit is skipped; a smaller one may
            kept.append(i)
            spent += costs[i]
    return Choice(tuple(sorted(kept)), spent, sum(gains[i] for i in kept), "greedy")
