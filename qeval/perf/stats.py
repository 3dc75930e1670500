"""A repeated measurement as results.json stores it: the median of the repeats with their
spread (min, max), the repeat count, the unit and how it was measured. These machines are
shared: one timing is an anecdote, so every figure is a median over repeats."""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np


def measured(values: list[float], unit: str, source: str) -> dict[str, Any]:
    """{median, min, max, repeats, unit, source, values}: one figure of the performance block."""
    if not values:
        raise ValueError("a measurement needs at least one repeat")
    return {
        "median": float(statistics.median(values)),
        "min": float(min(values)),
        "max": float(max(values)),
        "repeats": len(values),
        "unit": unit,
        "source": source,
        "values": [float(v) for v in values],
    }


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (linear interpolation, numpy's default)."""
    return float(np.percentile(np.asarray(values, dtype=float), q))


def spread(figure: dict[str, Any]) -> float:
    """Relative spread of a figure's repeats: max / min - 1 (0 for a single repeat)."""
    lo = figure["min"]
    return float(figure["max"] / lo - 1) if lo > 0 else float("inf")
