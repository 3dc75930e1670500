"""The divergence-along-the-generation block of results.json (docs/results.md): for each
generation task, each setup's divergence from the baseline by generated-token position (the
baseline's own generation teacher-forced through the setup) and its accuracy by answer length
(documents bucketed by the baseline's generated length), paired with the baseline by document."""

from __future__ import annotations

from pydantic import Field

from qeval.results.base import PairedDelta, ResultModel, Verdict
from qeval.results.long_context import NllBucket


class GeneratedPositionBucket(NllBucket):
    """Generated-token positions [start, end) of one task's documents (0: the first generated
    token): the documents whose generation reaches the bucket, the negative log-prob of the
    baseline's generated tokens."""

    max_drop: float | None = Field(
        None, description="a gate at this position: the largest delta allowed (nats per token); null: no gate"
    )
    verdict: Verdict | None = Field(
        None, description="the gate's verdict on the interval of delta (non-inferiority, as every gate); null: no gate"
    )
    verdict_reason: str | None = Field(
        None,
        description="why the verdict is inconclusive whatever the interval says (too few documents reach the bucket)",
    )


class AnswerLengthBucket(PairedDelta):
    """Documents whose baseline answer is [start, end) generated tokens long: delta is accuracy -
    baseline_accuracy (positive: better), its interval Newcombe's for right/wrong and a t-interval
    for sampled shares."""

    start: int = Field(description="shortest baseline answer in the bucket (tokens)")
    end: int | None = Field(description="one past the longest; null: open-ended")
    documents: int = Field(description="documents in the bucket, paired with the baseline's")
    accuracy: float = Field(description="this setup's accuracy (mean `correct`) on them")
    baseline_accuracy: float | None = Field(None, description="the baseline's on the same documents")


class TaskGeneration(ResultModel):
    """One setup on one generation task."""

    positions: list[GeneratedPositionBucket] = Field([], description="divergence by generated-position bucket")
    answer_lengths: list[AnswerLengthBucket] = Field([], description="accuracy by the baseline's answer length")


class GenerationDivergence(ResultModel):
    """results.json `generation_divergence`: present when the config set `generation_divergence:`."""

    position_buckets: list[int] = Field(description="lower edges of the generated-position buckets")
    length_buckets: list[int] = Field(description="lower edges of the answer-length buckets (baseline's tokens)")
    tasks: list[str] = Field(description="the generation tasks measured")
    setups: dict[str, dict[str, TaskGeneration]] = Field(description="setup -> task -> its tables")
