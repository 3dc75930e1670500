"""The `long_context:` piece of the run config: which long-context tasks to generate, at which
lengths, from which seed (docs/tasks.md, "Long-context tasks")."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from qeval.strict import Seed, Strict

Family = Literal["passkey", "multikey", "position_ppl"]
FAMILIES: tuple[str, ...] = ("passkey", "multikey", "position_ppl")


class LongContextSpec(Strict):
    """Long-context tasks generated in memory, deterministically, from `seed`.

    Each family becomes one qeval task per length (`passkey_4096`, ...). Lengths default to
    1/4, 1/2 and 1 x `budget.context_len`, capped at the model's maximum (the smaller of its
    `max_position_embeddings` and `model.max_context`)."""

    lengths: list[int] | None = Field(default=None, min_length=1)
    seed: Seed = 1234
    tasks: list[Family] = Field(default=["passkey", "multikey", "position_ppl"], min_length=1)
    #: documents per task and length (passkey and multikey cycle through `depths`)
    samples: int = Field(default=6, gt=0, le=1000)
    #: where the needle sits, as a share of the filler before it (0 = start, 1 = end)
    depths: list[float] = Field(default=[0.1, 0.5, 0.9], min_length=1)
    #: multikey: needles in the text (one of them is asked)
    keys: int = Field(default=4, ge=2, le=64)
    #: upper edges of the position buckets of position_ppl, in tokens; default: a quarter of the
    #: shortest length, then every length (2048/4096/8192 -> 0-512, 512-2k, 2k-4k, 4k-8k)
    buckets: list[int] | None = Field(default=None, min_length=1)
    #: tokens per forward pass when a prompt is longer than this (hf backend): chunked prefill
    #: through the same cache, logits only where scored
    chunk_tokens: int = Field(default=1024, ge=16)

    @model_validator(mode="after")
    def _check(self) -> LongContextSpec:
        if any(not 0 <= d <= 1 for d in self.depths):
            raise ValueError("depths are shares of the filler, between 0 and 1")
        for name, values in (("lengths", self.lengths), ("buckets", self.buckets)):
            if values is not None and (sorted(set(values)) != values or values[0] <= 0):
                raise ValueError(f"{name} must be positive and strictly increasing")
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError("a long-context task is listed twice")
        return self
