"""Quality gates: the run config's `gates`, and the non-inferiority verdict they give."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from qeval.strict import Strict


class Gate(Strict):
    """Non-inferiority: the drop on `task` ("all": every task of the config, lm-eval groups as
    one) is at most `max_drop` (points for accuracies; a share of the baseline's value with
    `relative`), or the setup keeps at least `min_recovery` of the baseline's score (0.99 =
    99%; on a suite, of its average)."""

    task: str = "all"
    max_drop: float | None = Field(default=None, gt=0, description="the largest drop allowed, in the metric's units "
                                                                   "(a share of the baseline's value with relative)")
    relative: bool = False
    min_recovery: float | None = Field(default=None, gt=0, le=1, description="the smallest share of the baseline's "
                                                                           "score the setup must keep (0.99 = 99%)")
    #: qeval/tasks/long_context/tasks.py resolves it to one generated task
    length: int | Literal["budget"] | None = Field(
        default=None, description="a long-context gate's length in tokens, or `budget` (budget.context_len); its "
                                  "task is then a long-context family, `all` meaning each of them")

    @model_validator(mode="after")
    def _one(self) -> Gate:
        if (self.max_drop is None) == (self.min_recovery is None):
            raise ValueError("a gate takes max_drop or min_recovery (one of them)")
        return self

    def margin(self, base_value: float) -> float:
        """The allowed drop in the metric's units, given the baseline's value."""
        if self.min_recovery is not None:
            return (1 - self.min_recovery) * base_value
        assert self.max_drop is not None
        return self.max_drop * (base_value if self.relative else 1.0)
