"""The long-context blocks of results.json (docs/results.md): what was generated, and
for each setup its KV-cache bytes and perplexity by token position at each length, paired with
the baseline bucket by bucket. Per-length task scores and their comparisons are ordinary tasks
(`passkey_4096`, ...) in `tasks` and `vs_baseline`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from qeval.results.base import PairedDelta, ResultModel, TokenAgreement


class NllBucket(PairedDelta, TokenAgreement):
    """Token positions [start, end) of a task's documents: this setup's loss there, paired with
    the baseline's document by document (qeval/tasks/long_context/buckets.py `compared_bucket`):
    delta is nll - baseline_nll (nats per token; positive: worse), its test Wilcoxon's."""

    start: int = Field(description="first position of the bucket (0: the first token scored)")
    end: int | None = Field(description="one past its last position; null: open-ended (the last bucket)")
    documents: int = Field(description="documents with tokens in the bucket (paired with the baseline's)")
    tokens: int = Field(description="tokens scored in the bucket, over those documents")
    nll: float = Field(description="this setup's mean negative log-likelihood per token in the bucket (nats)")
    baseline_nll: float | None = Field(None, description="the baseline's, on the same tokens; null for the baseline")
    ci_method: Literal["t"] | None = Field(
        None,
        description="t: Student's t-interval on the documents' linearised "
        "differences (stats.paired_ratio); null: a paired percentile bootstrap "
        "(results written before the t-interval)",
    )


class PositionBucket(NllBucket):
    """One bucket of token positions [start, end) of a length's position_ppl documents (0: a
    document's first token)."""

    end: int = Field(description="one past its last position")


class LengthPoint(ResultModel):
    """One setup at one length: the KV cache one sequence of that length holds, the length's
    tasks, and its loss by position."""

    length: int = Field(description="tokens")
    kv_bytes: int | None = Field(
        None, description="KV-cache bytes of one sequence of this length: kv_bytes_per_token x length"
    )
    kv_source: str = Field("", description="measured or predicted: which kv_bytes_per_token figure it used")
    tasks: dict[str, str] = Field(
        {}, description="family -> its task at this length (scores in `tasks`, comparisons in `vs_baseline`)"
    )
    buckets: list[PositionBucket] = Field([], description="position_ppl by token position; empty without it")


class SetupLongContext(ResultModel):
    """A setup's long-context results, one point per length."""

    lengths: list[LengthPoint] = Field(description="one point per length, shortest first")


class LongContextInfo(ResultModel):
    """What the run generated (docs/tasks.md, "Long-context tasks")."""

    lengths: list[int] = Field(description="the lengths scored, in tokens")
    deployment_length: int = Field(
        description="budget.context_len where it is one of the lengths, else the longest: "
        "each family's task there is top-level (gated by `all`)"
    )
    families: dict[str, dict[str, str]] = Field(description="family -> length (as text) -> task name")
    seed: int = Field(description="the seed every document was generated from")
    samples: int = Field(description="documents generated per task and length")
    depths: list[float] = Field(description="needle depths, as a share of the filler before the needle")
    bucket_edges: list[int] = Field(description="position bucket boundaries in tokens (the longest length's)")
    source: str = Field(description="how the documents were made")
