"""One line of RUN_DIR/samples/<setup>/<task>.jsonl as a typed model: the per-document record
every scorer builds (qeval/tasks/scoring.py, the lm-eval kind, the long-context and generation
passes), the run store writes and reads (qeval/records/store.py), and every reader uses by
attribute. Its JSON Schema is exported with results.json's (schema.py `json_schema`).

On disk a record holds exactly the fields its scorer set (`to_line`: unset fields are left out,
a field set to null stays null), so a line is the JSON object qeval wrote before the record was
typed. A line from another qeval with keys this one does not know still reads: the keys are kept
(ResultModel allows extra keys) and written back as they came.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field, field_validator

from qeval.files.atomic import jsonable
from qeval.results.base import ResultModel


class BucketSums(ResultModel):
    """One position bucket of one document: its tokens and, against the baseline, summed KL and
    top-1 agreements (the fields both kinds of position bucket share)."""

    start: int = Field(description="the bucket's first token position (0: the first)")
    end: int | None = Field(description="the position past its last (null: open-ended)")
    tokens: int = Field(description="tokens of the document in the bucket")
    kl: float | None = Field(None, description="summed KL(baseline || setup), nats (absent: not against a baseline)")
    top1: int | None = Field(None, description="tokens whose top-1 prediction is the baseline's")


class PositionSums(BucketSums):
    """A long-context perplexity document's sums over one bucket of prompt token positions."""

    nll: float = Field(description="summed negative log-likelihood of the bucket's tokens, nats")


class GeneratedPositionSums(BucketSums):
    """A generation's sums over one bucket of generated-token positions (teacher-forced)."""

    logprob: float = Field(description="summed log-probability of the baseline's generated tokens, nats")


class TeacherForced(ResultModel):
    """The baseline's generation of the document teacher-forced through this setup
    (docs/tasks.md, "Divergence along the generation")."""

    tokens: int = Field(description="tokens of the baseline's generation")
    buckets: list[GeneratedPositionSums] = Field(description="sums per generated-position bucket the document reaches")


class SampledRepeat(ResultModel):
    """One repeat of one document of a sampled generation task."""

    seed: int = Field(description="the seed of this repeat's random stream")
    raw_output: str = Field(description="the repeat's whole generated text")
    prediction: str = Field(description="the answer extracted from it")
    correct: bool = Field(description="the answer is the target")


class SampleRecord(ResultModel):
    """One line of RUN_DIR/samples/<setup>/<task>.jsonl: one document's outcome. Which fields a
    line holds depends on the task's output type and kind (docs/results.md, "Sample records")."""

    sample_id: str = Field(description="the document's id (unique within the task)")
    doc_id: int | None = Field(None, description="lm-eval tasks: lm-eval's document index")
    prompt: str | None = Field(None, description="the prompt (perplexity: the text) the setup was given")
    target: Any = Field(None, description="the gold answer")
    prediction: Any = Field(None, description="what the setup answered")
    raw_output: str | None = Field(None, description="generation tasks: the whole generated text")
    correct: bool | float | None = Field(
        None, description="null for perplexity tasks; a sampled task's share of its repeats that are right"
    )
    correct_norm: bool | None = Field(
        None, description="multiple choice: right by the length-normalised log-likelihood (acc_norm)"
    )
    doc_hash: str | None = Field(None, description="lm-eval tasks: lm-eval's hash of the document")
    prompt_hash: str | None = Field(
        None, description="lm-eval tasks: lm-eval's hash of the prompt (documents pair only where it agrees)"
    )
    metrics: dict[str, float] | None = Field(
        None, description="lm-eval tasks: the document's value of each metric (`metric,filter` past the first filter)"
    )
    loglikelihoods: list[float] | None = Field(None, description="per choice, multiple choice only")
    nll: float | None = Field(None, description="negative log-likelihood of the gold continuation or the text")
    n_tokens: int | list[int] | None = Field(
        None, description="tokens scored (lm-eval multiple choice: per choice, a list)"
    )
    n_bytes: int | None = Field(None, description="perplexity: UTF-8 bytes of the text (the bits-per-byte denominator)")
    n_words: int | None = Field(None, description="lm-eval perplexity: words of the text")
    is_greedy: bool | None = Field(None, description="lm-eval log-likelihood tasks: the continuation is the greedy one")
    generated_tokens: int | None = Field(
        None,
        description="generation tasks: tokens generated for this document (`raw_output`, a reasoning block included)",
    )
    response: str | None = Field(
        None, description="generation tasks: the text scored, where a reasoning block was stripped from `raw_output`"
    )
    filtered: dict[str, Any] | None = Field(
        None, description="lm-eval generation tasks: the answer after each of the task's filters"
    )
    repeats: list[SampledRepeat] | None = Field(
        None, description="a sampled task's repeats (null: greedy); `prediction` is then their majority answer"
    )
    pass_at_k: bool | None = Field(None, description="a sampled task: any of its repeats right")
    maj_at_k: bool | None = Field(None, description="a sampled task: its majority answer right")
    kl: float | None = Field(
        None, description="against the baseline's top-k: mean KL(baseline || setup) over the scored tokens, nats"
    )
    top1_agreement: float | None = Field(None, description="share of those tokens whose top-1 is the baseline's")
    kl_tokens: int | None = Field(None, description="tokens `kl` and `top1_agreement` are over")
    buckets: list[PositionSums] | None = Field(
        None, description="long-context perplexity (position_ppl_*): sums per token-position bucket"
    )
    teacher_forced: TeacherForced | None = Field(
        None, description="generation tasks under generation_divergence: the baseline's generation teacher-forced"
    )

    @field_validator("sample_id", mode="before")
    @classmethod
    def _id_text(cls, v: Any) -> Any:
        # a hand-written file's whole-number id reads as its text (ids are compared as strings)
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    def to_line(self) -> bytes:
        """The record as one JSONL line: the fields set (null ones included) and any extra keys."""
        return (json.dumps(self.model_dump(exclude_unset=True), default=jsonable) + "\n").encode()


def read_record(obj: dict[str, Any]) -> SampleRecord:
    """A stored line's object, typed (pydantic's ValidationError where it is no record)."""
    return SampleRecord.model_validate(obj)
