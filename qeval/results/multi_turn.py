"""The multi-turn block of results.json (docs/results.md): what was generated, and per setup its
accuracy at each question turn beside the baseline's (the turn's task comparison: paired by
document, with its gate's verdict) and the divergence on its answer tokens. Per-turn task scores
and comparisons are ordinary tasks (`multi_turn_t6`, ...) in `tasks` and `vs_baseline`."""

from __future__ import annotations

from pydantic import Field

from qeval.results.base import ResultModel, Verdict


class TurnPoint(ResultModel):
    """One setup at one question turn."""

    turn: int = Field(description="the user turn at which the question comes (the facts come in turn 1)")
    task: str = Field(description="the turn's task")
    documents: int = Field(description="conversations scored")
    gap_tokens: float = Field(description="mean tokens of the filler between the facts and the question")
    accuracy: float | None = Field(None, description="exact match of the answer (null: not scored)")
    delta: float | None = Field(None, description="accuracy - the baseline's, paired by conversation (null: baseline)")
    ci: tuple[float, float] | None = Field(None, description="95% paired interval of delta (Newcombe's)")
    p_value: float | None = Field(None, description="McNemar's exact test")
    verdict: Verdict | None = Field(None, description="the turn's gate's verdict (null: no gate)")
    kl: float | None = Field(
        None,
        description="mean KL(baseline || setup) per token of the baseline's answer, "
        "teacher-forced (null: no generation_divergence, or the baseline)",
    )
    top1_agreement: float | None = Field(
        None, description="share of the baseline's answer tokens where the setup's top-1 is the baseline's"
    )


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
