"""The three-sided figure: accuracy against throughput, marker area for the memory one
sequence needs, Pareto-optimal setups (over all three) filled. Drawn by report/plots.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qeval.report.performance import pareto3, tradeoff_points
from qeval.report.pyplot import subplots

if TYPE_CHECKING:
    from qeval.results.schema import Results


def tradeoff_figure(results: Results) -> Any:
    """Worst accuracy Δ (y) against output tokens/s at each setup's top level (x)."""
    points = tradeoff_points(results)
    front = pareto3(points)
    fig, ax = subplots(figsize=(6, 3.6))
    biggest = max((p[2] for p in points), default=1) or 1
    for name, delta, nbytes, tps in points:
        area = 40 + 360 * nbytes / biggest
        on_front = name in front
        ax.scatter(
            [tps],
            [delta],
            s=area,
            zorder=3,
            color="#cc6677" if on_front else "none",
            edgecolors="#cc6677" if on_front else "#4477aa",
            linewidths=1.2,
        )
        ax.annotate(f"{name} ({nbytes / 2**20:.2f} MiB)", (tps, delta), textcoords="offset points", xytext=(6, 6))
    context = results.config.budget.context_len
    ax.set_xlabel("output tokens/s at the setup's top concurrency level (median)")
    ax.set_ylabel("worst accuracy Δ vs baseline (pts)")
    ax.set_title(f"marker area: weights + KV of one {context}-token sequence; filled: Pareto-optimal", fontsize=8)
    ax.grid(alpha=0.3)
    return fig
