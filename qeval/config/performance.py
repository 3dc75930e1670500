"""The performance phase's piece of the run config (`performance:`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from qeval.strict import Strict

#: a concurrency level: a number of sequences, or `max`, the most the setup's memory budget allows
Level = int | Literal["max"]


def _default_levels() -> list[Level]:
    return [1, "max"]


class PerfSpec(Strict):
    """The synthetic workload every setup is timed on, after scoring (docs/performance.md).

    Each concurrency level serves `num_requests` requests (at least the level itself, rounded
    up to whole waves), `level` at a time, all of a wave submitted at once; every prompt has
    `input_len` tokens and every request generates exactly `output_len` tokens (end of
    sequence ignored). Each level is run `warmup` times untimed, then `repeats` times timed."""

    enabled: bool = True
    input_len: int = Field(default=128, gt=0)
    #: at least 2, so that time per output token (after the first) is defined
    output_len: int = Field(default=32, ge=2)
    num_requests: int = Field(default=16, gt=0)
    #: `max` is the setup's `memory.max_concurrency` at the budget, capped at `max_concurrency`
    concurrency: list[Level] = Field(default_factory=_default_levels, min_length=1)
    #: the cap on `max`: timing hundreds of sequences on a CPU takes minutes per setup
    max_concurrency: int = Field(default=64, gt=0)
    repeats: int = Field(default=3, ge=1)
    warmup: int = Field(default=1, ge=0)

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, levels: list[Level]) -> list[Level]:
        if any(isinstance(x, int) and x < 1 for x in levels):
            raise ValueError("concurrency levels are whole numbers of sequences, at least 1 (or `max`)")
        if len(set(levels)) != len(levels):
            raise ValueError("a concurrency level is listed twice")
        return levels


#: what the recommendation optimises among the setups that pass every gate and fit the budget
RecommendBy = Literal["concurrency", "throughput", "latency"]
