"""The multi-turn kind's config piece, `kinds: {multi_turn: ...}` (docs/tasks.md, "Multi-turn
probes")."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from qeval.config.chat import TEMPLATE_NAME
from qeval.strict import Seed, Strict

DEFAULT_SYSTEM = "You are a helpful assistant. Remember what the user tells you and answer briefly."


class MultiTurnSpec(Strict):
    """Conversations generated from `seed`: one task per question turn in `turns` (the user turn
    at which the question comes; the facts are given in turn 1, so turn t has t - 2 exchanges of
    filler between them), `samples` conversations each."""

    seed: Seed = 1234
    turns: list[int] = Field(default=[2, 4, 6, 8], min_length=1, max_length=32)
    samples: int = Field(default=12, gt=0, le=1000)
    #: facts given in turn 1 (the question asks for one of them)
    facts: int = Field(default=2, ge=1, le=8)
    #: words of prose in each filler answer of the assistant (0: a one-word answer)
    filler_words: int = Field(default=40, ge=0, le=2000)
    #: the conversation's system message (empty: none)
    system_prompt: str = Field(default=DEFAULT_SYSTEM, max_length=20_000)
    #: the tokenizer's template: true (its default) or the name of one of its templates
    chat_template: bool | Annotated[str, Field(pattern=TEMPLATE_NAME)] = True
    #: new tokens an answer may take
    max_gen_toks: int = Field(default=12, gt=0, le=256)

    @model_validator(mode="after")
    def _check(self) -> MultiTurnSpec:
        if self.chat_template is False:
            raise ValueError("chat_template: multi-turn probes are rendered under a chat template (true or a name)")
        if self.turns[0] < 2 or self.turns != sorted(set(self.turns)):
            raise ValueError("turns: user-turn numbers of at least 2 (the facts come in turn 1), ascending")
        return self
