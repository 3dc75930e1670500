"""The multi-turn block of results.json (docs/results.md): what was generated, and per setup its
accuracy at each question turn beside the baseline's (the turn's task comparison: paired by
document, with its gate's verdict) and the divergence on its answer tokens. Per-turn task scores
and comparisons are ordinary tasks (`multi_turn_t6`, ...) in `tasks` and `vs_baseline`."""

from __future__ import annotations

from pydantic import Field

from qeval.results.base import PairedDelta, ResultModel, TokenAgreement, Verdict


class TurnPoint(PairedDelta, TokenAgreement):
    """One setup at one question turn: delta is accuracy - the baseline's, paired by conversation
    (Newcombe's interval, McNemar's test); kl and top1_agreement are over the baseline's answer
    tokens, teacher-forced (null: no generation_divergence)."""

    turn: int = Field(description="the user turn at which the question comes (the facts come in turn 1)")
    task: str = Field(description="the turn's task")
    documents: int = Field(description="conversations scored")
    gap_tokens: float = Field(description="mean tokens of the filler between the facts and the question")
    accuracy: float | None = Field(None, description="exact match of the answer (null: not scored)")
    verdict: Verdict | None = Field(None, description="the turn's gate's verdict (null: no gate)")


class MultiTurnInfo(ResultModel):
    """results.json `multi_turn`: present when the config has `kinds: {multi_turn: ...}`."""

    turns: list[int] = Field(description="the question turns generated")
    tasks: dict[str, str] = Field(description="turn -> its task")
    seed: int = Field(description="the generator's seed")
    samples: int = Field(description="conversations generated per turn (before --limit)")
    facts: int = Field(description="facts given in turn 1")
    filler_words: int = Field(description="words of prose in each filler answer")
    source: str = Field(description="where the conversations come from")
    setups: dict[str, list[TurnPoint]] = Field(description="setup -> its points, by turn")
