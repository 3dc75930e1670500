"""A described workload drawn into requests: `requests` prompt lengths, then as many output
lengths, then (with `arrival_rate`) Poisson inter-arrival gaps, all from one generator seeded
with `seed`, so the same block draws the same requests on every machine."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from qeval.config.workload import (
    FixedLength,
    LengthSpec,
    LogNormalLength,
    PercentileLength,
    UniformLength,
    WorkloadSpec,
)
from qeval.workload.tokens import TokenCounter
from qeval.workload.trace import Request, Trace, check_requests, read_trace


def requests_of(spec: WorkloadSpec, counter: TokenCounter | None = None, context: int | None = None) -> Trace:
    """The workload `spec` names: its trace read, or its distribution drawn; each request checked."""
    if spec.trace is not None:
        return read_trace(Path(spec.trace), spec.format, counter, context, spec.custom_output_len)
    return draw(spec, context)


def draw(spec: WorkloadSpec, context: int | None = None) -> Trace:
    """The requests `spec` describes (it has `input` and `output`), none longer than `context`."""
    assert spec.input is not None and spec.output is not None  # the spec's own validator
    rng = np.random.default_rng(spec.seed)
    inputs = lengths(spec.input, rng, spec.requests)
    outputs = lengths(spec.output, rng, spec.requests)
    times: list[float | None] = [None] * spec.requests
    arrivals = "none (all at once)"
    if spec.arrival_rate is not None:
        times = [float(t) for t in np.cumsum(rng.exponential(1 / spec.arrival_rate, spec.requests))]
        arrivals = f"Poisson at {spec.arrival_rate:g} requests/s (seed {spec.seed})"
    requests = [Request(int(i), int(o), t) for i, o, t in zip(inputs, outputs, times, strict=True)]
    check_requests(requests, [f"workload: drawn request {n}" for n in range(1, len(requests) + 1)], context)
    return Trace(
        requests,
        f"drawn: input {describe(spec.input)}, output {describe(spec.output)}, "
        f"{spec.requests} requests, seed {spec.seed}",
        "drawn",
        arrivals=arrivals,
    )


def lengths(spec: LengthSpec, rng: np.random.Generator, n: int) -> list[int]:
    """n whole lengths, at least 1, drawn by `spec`'s family."""
    if isinstance(spec, FixedLength):
        return [spec.value] * n
    if isinstance(spec, UniformLength):
        return [int(x) for x in rng.integers(spec.min, spec.max + 1, size=n)]
    if isinstance(spec, LogNormalLength):
        raw = rng.lognormal(mean=math.log(spec.median), sigma=spec.sigma, size=n)
        return [int(x) for x in np.clip(np.rint(raw), spec.min, spec.max)]
    ps = sorted(spec.points)
    u = rng.uniform(0, 100, size=n)
    curve = np.interp(u, [0.0, *ps], [float(spec.min), *(float(spec.points[p]) for p in ps)])
    return [max(int(x), 1) for x in np.rint(curve)]


def describe(spec: LengthSpec) -> str:
    """The family and its parameters, in one phrase."""
    if isinstance(spec, FixedLength):
        return f"fixed {spec.value}"
    if isinstance(spec, UniformLength):
        return f"uniform {spec.min}-{spec.max}"
    if isinstance(spec, LogNormalLength):
        return f"lognormal median {spec.median:g} sigma {spec.sigma:g} in {spec.min}-{spec.max}"
    assert isinstance(spec, PercentileLength)  # the union's last member
    return "percentiles " + ", ".join(f"p{p:g} {spec.points[p]}" for p in sorted(spec.points))
