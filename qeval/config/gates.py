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
    max_drop: float | None = Field(
        default=None,
        gt=0,
        description="the largest drop allowed, in the metric's units (a share of the baseline's value with relative)",
    )
    relative: bool = False
    min_recovery: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="the smallest share of the baseline's score the setup must keep (0.99 = 99%)",
    )
    #: qeval/tasks/long_context/tasks.py resolves it to one generated task
    length: int | Literal["budget"] | None = Field(
        default=None,
        description="a long-context gate's length in tokens, or `budget` (budget.context_len); its "
        "task is then a long-context family, `all` meaning each of them",
    )

    #: qeval/tasks/multi_turn/tasks.py resolves it to the task of that turn
    turn: int | None = Field(
        default=None,
        ge=2,
        description="a multi-turn gate's question turn (its task is then "
        "multi_turn): the gate applies to that turn's task",
    )
    #: qeval/tasks/generation/results.py judges it on the bucket's Δ NLL per token
    position: int | None = Field(
        default=None,
        ge=0,
        description="a generation task's bucket of generated positions "
        "(its lower edge, one of generation_divergence's "
        "position_buckets): max_drop is then the largest "
        "rise of the baseline's tokens' NLL, in nats a token",
    )

    @model_validator(mode="after")
    def _one(self) -> Gate:
        if (self.max_drop is None) == (self.min_recovery is None):
            raise ValueError("a gate takes max_drop or min_recovery (one of them)")
        if sum(x is not None for x in (self.length, self.turn, self.position)) > 1:
            raise ValueError("a gate names at most one of length, turn and position")
        if self.position is not None and (self.max_drop is None or self.relative):
            raise ValueError("a gate at a position takes max_drop (nats per token), not min_recovery or relative")
        return self

    def margin(self, base_value: float) -> float:
        """The allowed drop in the metric's units, given the baseline's value."""
        if self.min_recovery is not None:
            return (1 - self.min_recovery) * base_value
        assert self.max_drop is not None
        return self.max_drop * (base_value if self.relative else 1.0)
