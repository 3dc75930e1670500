"""The workload's piece of the run config (`workload:`): the traffic a deployment will serve, as a
trace file or a described distribution, with its latency targets (docs/performance.md, "The
workload and the plan"). It drives `qeval plan --workload`, and `qeval goodput`, which serves it on
each setup and measures goodput against the SLOs (qeval/perf/serving.py, "Serving the workload")."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from qeval.strict import Seed, Strict

#: the trace formats qeval reads (qeval/workload/trace.py); `auto` picks one from the file's first entry
TraceFormat = Literal["auto", "qeval", "sharegpt", "vllm-custom"]
#: vLLM's `--custom-output-len` default (vllm/benchmarks/datasets/arg_utils.py): every request of its
#: custom dataset generates this many tokens, the file naming none
VLLM_CUSTOM_OUTPUT_LEN = 256
#: the most tokens one prompt or one output of a workload may have (2^24, 16,777,216): above
#: every model's context today (10M tokens at most), and far enough below 2^63 that no sum or
#: product of lengths (a max-model-len, a KV pool in blocks) overflows where a model's config
#: names no context to check them against
MAX_TOKENS = 2**24
#: a length in tokens: whole, positive, at most MAX_TOKENS
Length = Annotated[int, Field(gt=0, le=MAX_TOKENS)]


class FixedLength(Strict):
    """Every request the same length."""

    family: Literal["fixed"]
    value: Length


class _Bounded(Strict):
    """A family whose lengths are held to [min, max]: min at most max."""

    min: Length
    max: Length

    @model_validator(mode="after")
    def _order(self) -> Self:
        if self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}")
        return self


class UniformLength(_Bounded):
    """Whole lengths drawn uniformly from [min, max]."""

    family: Literal["uniform"]


class LogNormalLength(_Bounded):
    """exp(N(ln median, sigma)), rounded and held to [min, max] (max is required: a workload is bounded)."""

    family: Literal["lognormal"]
    median: float = Field(gt=0, le=MAX_TOKENS)
    sigma: float = Field(gt=0, le=5)
    min: Length = 1


class PercentileLength(Strict):
    """Lengths by percentiles, e.g. {50: 200, 90: 800, 100: 2000}: drawn by the inverse of the
    piecewise-linear distribution through (0, min) and these points; 100 (the maximum) is required."""

    family: Literal["percentiles"]
    points: dict[float, Length] = Field(min_length=1)
    min: Length = 1

    @model_validator(mode="after")
    def _points(self) -> PercentileLength:
        ps = sorted(self.points)
        if any(not 0 < p <= 100 for p in ps):
            raise ValueError("percentiles are above 0 and at most 100")
        if ps[-1] != 100:
            raise ValueError("give the maximum as percentile 100: a workload is bounded")
        values = [self.min, *(self.points[p] for p in ps)]
        if any(b < a for a, b in zip(values, values[1:], strict=False)):
            raise ValueError("lengths must not fall as the percentile rises (min first)")
        return self


#: a length distribution, by its `family`
LengthSpec = Annotated[FixedLength | UniformLength | LogNormalLength | PercentileLength, Field(discriminator="family")]


class SloSpec(Strict):
    """Latency targets at one percentile: a request level meets the SLO when each given figure's
    percentile is within its target. At least one target."""

    percentile: float = Field(default=99, gt=0, le=100)
    ttft_ms: float | None = Field(default=None, gt=0)
    tpot_ms: float | None = Field(default=None, gt=0)
    itl_ms: float | None = Field(default=None, gt=0)
    e2e_ms: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _some(self) -> SloSpec:
        if all(v is None for v in (self.ttft_ms, self.tpot_ms, self.itl_ms, self.e2e_ms)):
            raise ValueError("slo names no target: give ttft_ms, tpot_ms, itl_ms or e2e_ms")
        return self

    def targets(self) -> dict[str, float]:
        """The targets given, by name."""
        return {
            k: v
            for k, v in (
                ("ttft_ms", self.ttft_ms),
                ("tpot_ms", self.tpot_ms),
                ("itl_ms", self.itl_ms),
                ("e2e_ms", self.e2e_ms),
            )
            if v is not None
        }


_TRACE_ONLY = ("format", "custom_output_len")
_DRAWN_ONLY = ("requests", "seed", "arrival_rate")


class WorkloadSpec(Strict):
    """The traffic: a trace file (`trace`, JSON Lines or a ShareGPT JSON array), or a described
    distribution (`input` and `output` lengths, `requests` drawn with `seed`), and the SLOs."""

    trace: str | None = None
    format: TraceFormat = "auto"
    #: output tokens of every request of a `vllm-custom` trace (vLLM's `--custom-output-len`)
    custom_output_len: Length = VLLM_CUSTOM_OUTPUT_LEN
    input: LengthSpec | None = None
    output: LengthSpec | None = None
    requests: int = Field(default=1000, gt=0, le=1_000_000)
    seed: Seed = 0
    #: requests per second of a described distribution: Poisson gaps drawn with `seed`. Refused
    #: beside a trace, whose requests arrive at their own `arrival_s` or, at each serving level,
    #: by `serving.arrivals: poisson` (it was ignored there)
    arrival_rate: float | None = Field(default=None, gt=0)
    slo: SloSpec | None = None
    #: max-model-len is this percentile of prompt + output, rounded up to the KV block size
    max_model_len_percentile: float = Field(default=99, gt=0, le=100)

    @model_validator(mode="after")
    def _one_source(self) -> WorkloadSpec:
        drawn = self.input is not None or self.output is not None
        if self.trace is None and not drawn:
            raise ValueError("workload needs `trace` (a file) or `input` and `output` (a distribution)")
        if self.trace is not None and drawn:
            raise ValueError("workload takes `trace` or `input`/`output`, not both")
        if drawn and (self.input is None or self.output is None):
            raise ValueError(f"a described workload needs `{'output' if self.output is None else 'input'}` too")
        for key in _TRACE_ONLY if drawn else _DRAWN_ONLY:
            # at its default it changes nothing: a config dumped whole (a worker's job file) validates again
            if key in self.model_fields_set and getattr(self, key) != type(self).model_fields[key].default:
                if key == "arrival_rate":
                    raise ValueError(
                        "arrival_rate applies to a described distribution only: a trace's requests arrive "
                        "at its own arrival_s, and `serving.arrivals: poisson` (the default) sends them at "
                        "seeded Poisson gaps at each rate"
                    )
                raise ValueError(f"{key} applies to a {'trace' if drawn else 'described distribution'} only")
        return self
