"""The base of every results model (results.json, its performance and long-context blocks,
sweep.json): in a module of its own so those modules share it without importing each other."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: a gate's verdict, wherever results.json gives one
Verdict = Literal["pass", "fail", "inconclusive"]


class ResultModel(BaseModel):
    # No docstring: pydantic would give it to every subclass without one, in the JSON Schema.
    # extra="allow": a reader keeps (and writes back) fields a newer qeval added, so a file of
    # the same schema version from a newer qeval still reads (docs/architecture.md).
    model_config = ConfigDict(extra="allow")


class PairedDelta(ResultModel):
    """A figure of one group of documents against the baseline's on the same documents: the
    change, its 95% paired interval and the paired test (each null for the baseline itself).
    The subclass's docstring names the figure and the interval."""

    delta: float | None = Field(
        None, description="this setup's figure minus the baseline's on the same documents (null: the baseline)"
    )
    ci: tuple[float, float] | None = Field(None, description="95% paired interval of delta over documents")
    p_value: float | None = Field(
        None, description="the paired test: McNemar's exact test (right/wrong) or Wilcoxon's signed-rank test"
    )


class TokenAgreement(ResultModel):
    """How far the setup's next-token distribution is from the baseline's on the tokens a block
    is over (each null for the baseline itself, or where it was not measured)."""

    kl: float | None = Field(
        None,
        description="mean KL(baseline || setup) per token, nats (the baseline's top-16 + a tail bucket: a lower "
        "bound of the full KL)",
    )
    top1_agreement: float | None = Field(
        None, description="share of the tokens where the setup's top-1 prediction is the baseline's"
    )
