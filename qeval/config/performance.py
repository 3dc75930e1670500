"""The performance phase's piece of the run config (`performance:`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from qeval.strict import Seed, Strict

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
    #: take each request's prompt and output lengths from the config's `workload:` (in order,
    #: cycled) instead of input_len / output_len: the hf backend's waves then follow the traffic
    #: (a wave is one padded batch; docs/performance.md, "The hf backend and the workload")
    from_workload: bool = False

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, levels: list[Level]) -> list[Level]:
        if any(isinstance(x, int) and x < 1 for x in levels):
            raise ValueError("concurrency levels are whole numbers of sequences, at least 1 (or `max`)")
        if len(set(levels)) != len(levels):
            raise ValueError("a concurrency level is listed twice")
        return levels


#: what the recommendation optimises among the setups that pass every gate and fit the budget
RecommendBy = Literal["concurrency", "throughput", "latency", "goodput"]


def _vllm_default() -> list[int | None]:
    return [None]


class ServingSpec(Strict):
    """How `qeval goodput` loads and tunes each setup on the workload (docs/performance.md,
    "Serving the workload"): every `max_num_seqs` value is one engine start; at each, the
    `rates` are swept upwards (open loop, seeded Poisson arrivals) until a level breaks the SLO.
    The cost is bounded by len(max_num_seqs) restarts and len(rates) levels per restart."""

    #: request rates (requests/s) to replay the workload at, swept in ascending order
    rates: list[float] = Field(min_length=1, max_length=12)
    #: the max-num-seqs values to try (one engine start each)
    max_num_seqs: list[int] = Field(default_factory=lambda: [256], min_length=1, max_length=8)
    #: max-num-batched-tokens values to try with each max_num_seqs (null: vLLM's default)
    max_num_batched_tokens: list[int | None] = Field(default_factory=_vllm_default, min_length=1, max_length=4)
    #: requests per level, taken in order from the workload (a trace shorter than this is cycled)
    requests: int = Field(default=100, gt=0, le=100_000)
    #: seed of the Poisson arrivals (vLLM bench serve's --seed)
    seed: Seed = 0
    #: a level's peak KV-cache usage must stay below this share of the pool (the auto-tune's 90%)
    kv_usage_limit: float = Field(default=0.9, gt=0, le=1)
    #: keep sweeping rates after a level breaks the SLO (an exhaustive sweep, for comparison)
    exhaustive: bool = False
    #: how requests arrive at each rate: `poisson` (seeded, vLLM bench serve's --request-rate), or
    #: `trace`: the workload's own arrival times (a trace's `arrival_s`, or a drawn workload's
    #: `arrival_rate`), replayed by `vllm bench serve --dataset-name timed_trace` with the times
    #: scaled so the level offers `rate` requests/s on average (bursts kept)
    arrivals: Literal["poisson", "trace"] = "poisson"

    @field_validator("rates")
    @classmethod
    def _rates(cls, rates: list[float]) -> list[float]:
        if any(not r > 0 or r != r or r == float("inf") for r in rates):
            raise ValueError("rates are finite request rates above 0 (requests/s)")
        if len(set(rates)) != len(rates):
            raise ValueError("a rate is listed twice")
        return sorted(rates)

    @field_validator("max_num_seqs")
    @classmethod
    def _seqs(cls, values: list[int]) -> list[int]:
        if any(v < 1 for v in values) or len(set(values)) != len(values):
            raise ValueError("max_num_seqs values are distinct whole numbers, at least 1")
        return sorted(values)
