"""What the recommendation optimises when the config says `recommend_by: throughput` or
`latency` (qeval/analysis/recommend.py keeps `concurrency`, its original rule): the figure
each setup is ranked on, and how a reason states it, with its spread."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qeval.results.performance import Measured
    from qeval.results.schema import SetupResult


def figure(s: SetupResult, by: str) -> tuple[Measured, int] | None:
    """The ranked figure and the concurrency it was measured at: output tokens/s at the top
    level (the budget's concurrency by default), or request latency p50 at concurrency 1."""
    perf = s.performance
    if perf is None or perf.status != "ok":
        return None
    level = perf.top if by == "throughput" else perf.level(1)
    if level is None:
        return None
    return (level.output_tokens_per_s if by == "throughput" else level.e2e_p50_s), level.concurrency


def sort_value(s: SetupResult, by: str) -> float:
    """Smaller ranks first: minus throughput, or latency."""
    found = figure(s, by)
    assert found is not None
    return -found[0].median if by == "throughput" else found[0].median


def missing(s: SetupResult, by: str) -> str | None:
    """Why `s` cannot be ranked by `by`, or None."""
    if figure(s, by) is not None:
        return None
    perf = s.performance
    why = ("no performance figures" if perf is None else f"its performance phase failed ({perf.error})"
           if perf.status != "ok" else "concurrency 1 was not timed")
    return f"{s.name}: passes every gate, but cannot be ranked by {by}: {why}"


def describe(s: SetupResult, by: str) -> str:
    """"1,234 output tokens/s at concurrency 24 (median of 3, 1,180-1,290)"."""
    found = figure(s, by)
    assert found is not None
    f, level = found
    if by == "throughput":
        return (f"{f.median:,.0f} output tokens/s at concurrency {level} (median of {f.repeats}, "
                f"{f.min:,.0f}-{f.max:,.0f})")
    return (f"a request latency of {f.median * 1e3:,.1f} ms at concurrency 1 (p50, median of {f.repeats}, "
            f"{f.min * 1e3:,.1f}-{f.max * 1e3:,.1f})")


def overlaps(best: SetupResult, other: SetupResult, by: str) -> bool:
    """The two setups' repeats overlap: the ranking between them is within the noise."""
    a, b = figure(best, by), figure(other, by)
    assert a is not None and b is not None
    return a[0].min <= b[0].max and b[0].min <= a[0].max
