"""The SLO maths of `qeval goodput` (docs/performance.md, "Serving the workload"), on the
per-request figures `vllm bench serve --save-detailed` stores for one load level.

- A request's figures, as vLLM computes them (vllm/benchmarks/serve.py, calculate_metrics, vLLM
  0.32.0): TTFT; TPOT = (latency - TTFT) / (output tokens - 1), 0 for a one-token output; ITL,
  the gaps between its streamed chunks; E2E, its latency.
- Percentiles: numpy's linear interpolation (`np.percentile`), the definition `vllm bench serve`
  prints with `--metric-percentiles`, so qeval's p99 and the bench's are the same number.
- **Goodput** (vLLM's `--goodput`, after DistServe): completed requests whose TTFT, TPOT and
  E2E are each within their target, per second of the level's duration. A failed request is
  never good. `itl_ms` has no per-request form in vLLM; it enters only the level's verdict.
- A level **meets the SLO** when no request failed and, for every target given, the SLO's
  percentile of that figure over the level's requests is within the target (ITL: over all the
  level's inter-token gaps).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: the percentiles every level reports
SHOWN = (50.0, 90.0, 99.0)
#: SLO key -> the figure it bounds
FIGURE_OF = {"ttft_ms": "ttft", "tpot_ms": "tpot", "itl_ms": "itl", "e2e_ms": "e2e"}


@dataclass(frozen=True)
class RequestTimes:
    """One request's figures in seconds (None for a failed request)."""

    ok: bool
    ttft: float = 0.0
    tpot: float = 0.0
    e2e: float = 0.0
    itl: tuple[float, ...] = ()
    output_tokens: int = 0
    prompt_tokens: int = 0


@dataclass
class LevelFigures:
    """A level's figures: counts, rates, percentiles in ms, goodput, the SLO verdict."""

    requests: int
    completed: int
    failed: int
    duration_s: float
    throughput_rps: float
    output_tokens_per_s: float
    goodput_rps: float
    good: int
    #: figure -> {"p50": ms, "p90": ms, "p99": ms, "p<SLO percentile>": ms}
    percentiles_ms: dict[str, dict[str, float]]
    meets_slo: bool
    violations: list[str] = field(default_factory=list)


def requests_of_detailed(result: dict[str, Any]) -> list[RequestTimes]:
    """The per-request figures of a `vllm bench serve --save-detailed` result (its lists:
    ttfts, itls, latencies, output_lens, input_lens, errors), TPOT as vLLM computes it."""
    out = []
    n = len(result["latencies"])
    errors = result.get("errors") or [""] * n
    for i in range(n):
        if errors[i]:
            out.append(RequestTimes(False))
            continue
        tokens = int(result["output_lens"][i])
        latency, ttft = float(result["latencies"][i]), float(result["ttfts"][i])
        tpot = (latency - ttft) / (tokens - 1) if tokens > 1 else 0.0
        out.append(
            RequestTimes(
                True,
                ttft,
                tpot,
                latency,
                tuple(float(x) for x in result["itls"][i]),
                tokens,
                int(result["input_lens"][i]),
            )
        )
    return out


def ms(x: float) -> str:
    """Milliseconds as a line shows them: whole with thousands separators, else six significant
    digits (a target of 0.5 ms reads 0.5 ms, never 0 ms; 52.5 ms stays 52.5)."""
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.6g}"


def pct(values: list[float], p: float) -> float:
    """The p-th percentile by linear interpolation (np.percentile); 0 for no values (as vLLM)."""
    return float(np.percentile(values, p)) if values else 0.0


def is_good(r: RequestTimes, targets: dict[str, float]) -> bool:
    """Within every per-request target (ttft_ms, tpot_ms, e2e_ms; vLLM's goodput rule: `<=`)."""
    if not r.ok:
        return False
    return all(getattr(r, FIGURE_OF[k]) * 1e3 <= v for k, v in targets.items() if k != "itl_ms")


def level_figures(
    reqs: list[RequestTimes], duration_s: float, targets: dict[str, float], percentile: float
) -> LevelFigures:
    """The module docstring's figures for one level of `duration_s` seconds."""
    done = [r for r in reqs if r.ok]
    series = {
        "ttft": [r.ttft for r in done],
        "tpot": [r.tpot for r in done if r.output_tokens > 1],
        "itl": [x for r in done for x in r.itl],
        "e2e": [r.e2e for r in done],
    }
    shown = sorted({*SHOWN, float(percentile)})
    pcts = {name: {f"p{p:g}": round(pct(vals, p) * 1e3, 3) for p in shown} for name, vals in series.items()}
    good = sum(is_good(r, targets) for r in reqs)
    violations = []
    failed = len(reqs) - len(done)
    if failed:
        violations.append(f"{failed} of {len(reqs)} requests failed")
    for key, target in targets.items():
        name = FIGURE_OF[key]
        # the all-time tpot list keeps 0 for one-token outputs in vLLM's goodput; the verdict uses real ones
        got = pcts[name][f"p{percentile:g}"]
        if not series[name] or got > target:
            violations.append(
                f"p{percentile:g} {name.upper()} {ms(got)} ms > {ms(target)} ms"
                if series[name]
                else f"no {name.upper()} measured"
            )
    return LevelFigures(
        len(reqs),
        len(done),
        failed,
        duration_s,
        len(done) / duration_s,
        sum(r.output_tokens for r in done) / duration_s,
        good / duration_s,
        good,
        pcts,
        not violations,
        violations,
    )
