"""The report's figures, as inline SVG strings (deterministic bytes: fixed hash salt, no date)."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from qeval.report.pyplot import pyplot, subplots
from qeval.results.metrics import describe
from qeval.results.schema import Results, SetupResult

T = TypeVar("T")

# Set per figure (rc_context), never globally: importing qeval must not restyle a notebook.
# - svg.hashsalt: stable element ids, so `qeval report` is byte-for-byte
# - text.parse_math off: names are data, and `$\foo$` in a task name is not mathtext to render
_RC: Any = {"svg.hashsalt": "qeval", "font.size": 9, "text.parse_math": False}  # Any: the stub wants literal keys


def svg_of(make: Callable[[T], Any], data: T) -> str:
    """The figure `make(data)` draws, as an inline SVG string under qeval's style (data: a run's
    Results, or another report's own model: `qeval compare`'s history)."""
    with pyplot().rc_context(_RC):
        fig = make(data)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": "qeval"})
        pyplot().close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog: it is inlined into HTML


def panel_row(n: int, width: float = 4.0, **kw: Any) -> tuple[Any, Any]:
    """A figure of `n` panels side by side, `width` inches each and 3.2 high, and its row of axes
    (`kw`: more of plt.subplots' arguments, e.g. sharey)."""
    fig, axes = subplots(1, n, figsize=(width * n, 3.2), squeeze=False, **kw)
    return fig, axes[0]


def finish_panels(fig: Any, axes: Any, ylabel: str | None = None) -> Any:
    """A row of panels finished: the first panel's y label and legend (where a line is labelled),
    the layout tightened."""
    if ylabel is not None:
        axes[0].set_ylabel(ylabel)
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def styled(make: Callable[[Results], Any]) -> Callable[[Results], Any]:
    """A figure function run under qeval's style, for notebook use."""

    def wrapped(results: Results) -> Any:
        with pyplot().rc_context(_RC):
            return make(results)

    return wrapped


def _ok(results: Results) -> list[SetupResult]:
    return [s for s in results.setups if s.status == "ok"]


def pareto(points: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """Points no other point beats on both memory (lower) and quality (higher)."""
    front = [
        p
        for p in points
        if not any(q[0] <= p[0] and q[1] >= p[1] and q != p and (q[0] < p[0] or q[1] > p[1]) for q in points)
    ]
    return sorted(front)


def quality_vs_memory(results: Results) -> str:
    return svg_of(quality_vs_memory_figure, results)


def task_deltas(results: Results) -> str:
    return svg_of(task_deltas_figure, results)


def memory_ledger(results: Results) -> str:
    return svg_of(memory_ledger_figure, results)


def tradeoff(results: Results) -> str:
    """Quality x memory x throughput (qeval/report/performance_plot.py)."""
    from qeval.report.performance_plot import tradeoff_figure

    return svg_of(tradeoff_figure, results)


def quality_vs_memory_figure(results: Results) -> Any:
    """Worst accuracy difference against the memory one sequence needs, with the Pareto front."""
    context = results.config.budget.context_len
    pts = [(s.sequence_bytes(context) / 2**20, s.worst_accuracy_delta(), s.name) for s in _ok(results)]
    fig, ax = subplots(figsize=(6, 3.6))
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], color="#4477aa", zorder=3)
    for x, y, name in pts:
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4))
    front = pareto(pts)
    ax.plot([p[0] for p in front], [p[1] for p in front], "--", color="#cc6677", label="Pareto front", zorder=2)
    ax.set_xlabel(f"weights + KV cache of one {context}-token sequence (MiB)")
    ax.set_ylabel("worst accuracy Δ vs baseline (pts)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)
    return fig


def task_deltas_figure(results: Results) -> Any:
    """Each setup x task difference from the baseline with its 95% CI, coloured by verdict:
    proportions (points) on the left, ratio metrics on the right."""
    rows = [(s.name, t, c) for s in _ok(results) for t, c in s.vs_baseline.items()]
    fig, axes = subplots(1, 2, figsize=(8, 0.35 * max(len(rows), 4) + 1), squeeze=False)
    for ax, proportion in zip(axes[0], (True, False), strict=True):
        sel = [r for r in rows if describe(r[2].metric).proportion == proportion]
        scale = 100 if proportion else 1
        for i, (_, _, c) in enumerate(sel):
            lo, hi = c.ci
            color = {"pass": "#228833", "fail": "#cc3311", "inconclusive": "#ee7733"}.get(c.verdict or "", "#4477aa")
            ax.errorbar(
                scale * c.delta,
                i,
                xerr=[[scale * (c.delta - lo)], [scale * (hi - c.delta)]],
                fmt="o",
                color=color,
                capsize=3,
            )
            if c.margin is not None:
                ax.axvline(
                    -scale * c.margin if c.higher_is_better else scale * c.margin, color="#999999", lw=0.8, ls=":"
                )
        ax.set_yticks(range(len(sel)), [f"{n} · {t}" for n, t, _ in sel])
        ax.axvline(0, color="black", lw=0.8)
        ax.set_xlabel("Δ accuracy (pts)" if proportion else "Δ bits per byte (lower is better)")
        ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return fig


def memory_ledger_figure(results: Results) -> Any:
    """Measured weights, KV cache of one sequence and scoring-time growth, stacked per setup."""
    context = results.config.budget.context_len
    setups = _ok(results)
    names = [s.name for s in setups]
    parts = {
        "weights": [s.memory.weights_bytes.measured or 0 for s in setups],
        f"KV cache, one {context}-token sequence": [
            (s.memory.kv_bytes_per_token.measured or 0) * context for s in setups
        ],
        "RSS / allocator growth while scoring (activations, KV, slack)": [
            s.memory.activations_bytes.measured or 0 for s in setups
        ],
    }
    fig, ax = subplots(figsize=(6, 0.4 * len(names) + 1.2))
    left = [0.0] * len(names)
    for (label, values), color in zip(parts.items(), ("#4477aa", "#66ccee", "#ccbb44"), strict=True):
        mib = [v / 2**20 for v in values]
        ax.barh(names, mib, left=left, label=label, color=color)
        left = [a + b for a, b in zip(left, mib, strict=True)]
    ax.set_xlabel("MiB")
    ax.invert_yaxis()
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), fontsize=7, frameon=False)
    ax.grid(alpha=0.3, axis="x")
    return fig


def sensitivity_heatmap(rows: Sequence[Any], value: str = "gain_kl") -> Any:
    """The advisor's layer x module-type heatmap, coloured by `value` (`gain_kl` or `cost_kl`):
    `rows` are units with `layer`, `kind` and that attribute (the advisor's rows, or results.json's
    `advice.units`); the unions (a whole block, a type over all layers) are left out. Shared by
    advice.html (qeval/advise/output.py) and the run's report (qeval/report/advice.py)."""
    cells = [r for r in rows if r.layer is not None and r.kind is not None]
    kinds = sorted({r.kind for r in cells if r.kind})
    layers = sorted({r.layer for r in cells if r.layer is not None})
    grid = [
        [next((getattr(r, value) for r in cells if r.layer == layer and r.kind == k), 0.0) for layer in layers]
        for k in kinds
    ]
    fig, ax = subplots(figsize=(max(4.0, 0.25 * len(layers) + 1.5), 1.6))
    im = ax.imshow(grid, aspect="auto", cmap="viridis")
    ax.set_yticks(range(len(kinds)), kinds)
    ax.set_xticks(range(len(layers)), [str(layer) for layer in layers])
    ax.set_xlabel("decoder layer")
    fig.colorbar(im, ax=ax, label=value.replace("_kl", " (KL)"))
    return fig
