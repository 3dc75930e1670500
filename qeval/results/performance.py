"""The typed `performance` block of a setup and the run's `ceilings` block in results.json
(imported by qeval/results/schema.py; exported with it to docs/results.schema.json)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from qeval.results.base import ResultModel


class Measured(ResultModel):
    """A repeated measurement: the median of the repeats, their spread, how many, and how."""

    median: float = Field(description="median over the timed repeats (the figure reports show)")
    min: float = Field(description="the smallest repeat")
    max: float = Field(description="the largest repeat")
    repeats: int = Field(description="timed repeats (warm-up passes excluded)")
    unit: str = Field(description="e.g. tokens/s, requests/s, s, bytes/s, FLOP/s")
    source: str = Field(description="how it was measured, in words (clock, what was timed, the workload)")
    values: list[float] = Field([], description="every repeat's value, in the order measured")


class PerfWorkload(ResultModel):
    """The synthetic workload the setup was timed on (`performance:` in the config)."""

    input_len: int = Field(description="prompt tokens per request (special tokens included)")
    output_len: int = Field(description="tokens generated per request (end of sequence ignored)")
    num_requests: int = Field(description="requests per level (at least the level, rounded up to whole waves)")
    levels: list[int] = Field(description="concurrency levels timed: requests submitted at once per wave")
    repeats: int = Field(description="timed repeats per level")
    warmup: int = Field(description="untimed passes per level before the repeats")
    seed: int = Field(description="seed of the prompts (warm-up prompts: seed + 1)")
    levels_source: str = Field("", description="how the levels were chosen (`max`: the budget's concurrency, caps)")
    lengths: list[list[int]] = Field(
        [],
        description="per request [prompt tokens, output tokens], cycled, from the "
        "config's workload (performance.from_workload); empty: every "
        "request is input_len / output_len",
    )
    lengths_source: str = Field("", description="the workload the lengths came from")


class PerfLevel(ResultModel):
    """Every figure at one concurrency level."""

    concurrency: int = Field(description="requests served at once (one wave)")
    requests: int = Field(description="requests timed per repeat")
    requests_per_s: Measured = Field(description="throughput: requests completed per second")
    output_tokens_per_s: Measured = Field(description="throughput: tokens generated per second")
    prefill_tokens_per_s: Measured = Field(description="prompt tokens processed per second of prefill")
    decode_tokens_per_s: Measured = Field(description="tokens generated per second of decoding (after the first)")
    ttft_p50_s: Measured = Field(description="time to first token, median over requests (s)")
    ttft_p90_s: Measured = Field(description="time to first token, 90th percentile over requests (s)")
    tpot_p50_s: Measured = Field(description="time per output token after the first, median over requests (s)")
    tpot_p90_s: Measured = Field(description="time per output token after the first, 90th percentile (s)")
    e2e_p50_s: Measured = Field(description="request latency (submission to last token), median over requests (s)")
    e2e_p90_s: Measured = Field(description="request latency, 90th percentile over requests (s)")


class CeilingShare(ResultModel):
    """An achieved rate against the device's physical limit for this setup (docs/performance.md)."""

    achieved: float = Field(description="the achieved rate (median), tokens/s")
    concurrency: int = Field(description="the level the achieved rate was measured at")
    ceiling: float = Field(description="the physical limit for this setup on this device, tokens/s")
    share: float = Field(description="achieved / ceiling; over 1 means the ceiling is wrong (flagged, not clipped)")
    source: str = Field(description="the formula and the figures it used")


class Performance(ResultModel):
    """A setup's serving speed on the workload, measured after scoring in the same worker."""

    status: Literal["ok", "failed"]
    error: str | None = Field(None, description="why the performance phase failed, one line")
    workload: PerfWorkload | None = Field(None, description="what was timed")
    levels: list[PerfLevel] = Field([], description="figures per concurrency level, ascending")
    decode: CeilingShare | None = Field(
        None,
        description="decode tokens/s at concurrency 1 against bandwidth / (weight bytes + KV bytes at the context)",
    )
    prefill: CeilingShare | None = Field(
        None, description="prefill tokens/s at the top level against matmul peak / (2 x parameters per token)"
    )
    budget_concurrency: float | None = Field(
        None, description="the setup's memory.max_concurrency the `max` level came from"
    )
    notes: list[str] = Field([], description="what a reader of these figures must know (engine threads, caches)")
    seconds: float | None = Field(None, description="wall time of the whole phase")

    def level(self, concurrency: int) -> PerfLevel | None:
        return next((x for x in self.levels if x.concurrency == concurrency), None)

    @property
    def top(self) -> PerfLevel | None:
        """The highest level timed: the budget's concurrency with the default levels."""
        return self.levels[-1] if self.levels else None


class Ceilings(ResultModel):
    """The device's limits, measured once per run on the setups' device (qeval/perf/ceilings.py)."""

    device: str
    device_name: str = Field(description="the CPU model or GPU name")
    threads: int = Field(description="torch threads of the probe (a CPU engine may compute on fewer)")
    torch: str = Field(description="torch version of the probe (the workers' interpreter)")
    cache_bytes: int | None = Field(
        None,
        description="the largest cache (CPU last level, GPU L2); the bandwidth "
        "probe is sized past it (2x on a CPU, 8x on a GPU)",
    )
    copy_bandwidth: Measured = Field(description="bytes read + written per second by a large tensor copy")
    matmul_peak: dict[str, Measured] = Field(description="dtype -> matmul rate (FLOP/s; int8: OP/s)")
    notes: list[str] = Field([], description="what the probe could not measure, and why")
    seconds: float | None = Field(None, description="wall time of the probe process")
    probe_s: float | None = Field(
        None,
        description="time the measurements took inside the probe (bounded at 10 s: "
        "each is sized by time; null before probe version 2)",
    )
