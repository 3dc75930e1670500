"""Each setup's key metric over time: one value per run (in the order the runs finished), per
task its compared metric, as each run's results.json reports it; a table and a plot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import matplotlib.pyplot as plt

from qeval.compare.runs import LoadedRun
from qeval.results.metrics import describe

#: tasks drawn in the history plot, at most (a table row holds every one)
MAX_PLOTTED_TASKS = 12


@dataclass
class History:
    """runs: labels in time order; values[task][setup]: one value (or None) per run."""

    runs: list[str]
    metrics: dict[str, tuple[str, bool]]  # task -> (compared metric, higher is better)
    values: dict[str, dict[str, list[float | None]]]

    def rows(self, task: str) -> tuple[list[str], list[list[str]]]:
        """Header (run, then each setup) and one row per run, values as reports show them."""
        metric, hib = self.metrics[task]
        m = describe(metric, hib)
        setups = list(self.values[task])
        body = [
            [run] + ["—" if (v := self.values[task][s][i]) is None else m.fmt(v) for s in setups]
            for i, run in enumerate(self.runs)
        ]
        return ["run", *setups], body


def history(runs: list[LoadedRun]) -> History:
    """The runs in the order they finished (then as given), each setup's compared metric per task."""
    ordered = sorted(runs, key=lambda r: r.when)
    metrics: dict[str, tuple[str, bool]] = {}
    for r in ordered:
        for t, info in r.results.tasks.items():
            if info.entry in (None, t) and t not in metrics:
                metrics[t] = (
                    info.compared_metric,
                    describe(info.compared_metric, info.higher_is_better).higher_is_better,
                )
    values: dict[str, dict[str, list[float | None]]] = {t: {} for t in metrics}
    for i, r in enumerate(ordered):
        for s in r.results.setups:
            for t, (metric, _) in metrics.items():
                score = s.tasks.get(t)
                mv = score.metrics.get(metric) if score and s.status == "ok" else None
                values[t].setdefault(s.name, [None] * len(ordered))[i] = mv.value if mv else None
    return History([r.label for r in ordered], metrics, values)


def history_figure(h: History) -> Any:
    """One panel per task (up to MAX_PLOTTED_TASKS), a line per setup across the runs."""
    tasks = list(h.metrics)[:MAX_PLOTTED_TASKS]
    cols = min(len(tasks), 2) or 1
    rows = max((len(tasks) + cols - 1) // cols, 1)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 2.8 * rows + 0.6), squeeze=False)
    x = list(range(len(h.runs)))
    for ax, task in zip(axes.flat, tasks, strict=False):
        metric, hib = h.metrics[task]
        m = describe(metric, hib)
        for setup, series in h.values[task].items():
            ys = [None if v is None else v * m.scale for v in series]
            ax.plot(x, [float("nan") if y is None else y for y in ys], marker="o", label=setup)
        ax.set_title(f"{task} · {metric}{'' if hib else ' (lower is better)'}")
        ax.set_xticks(x, [f"run {i + 1}" for i in x])
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(tasks) :]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig
