"""The row-of-panels helpers the kinds' report figures share (qeval/report/plots.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from qeval.report.plots import finish_panels, panel_row, svg_of
from qeval.tasks.multi_turn.report import accuracy_by_turn_figure


def test_a_row_of_panels_gets_one_legend_only_where_a_line_is_labelled() -> None:
    fig, axes = panel_row(3, 2.0, sharey=True)
    assert len(axes) == 3 and tuple(fig.get_size_inches()) == (6.0, 3.2)
    axes[1].plot([0, 1], [0, 1], label="a")  # a labelled line on another panel than the first
    finish_panels(fig, axes, "y")
    assert axes[0].get_ylabel() == "y" and axes[0].get_legend() is None
    axes[0].plot([0, 1], [1, 0], label="b")
    assert finish_panels(fig, axes).axes[0].get_legend() is not None


def test_the_multi_turn_figure_names_its_axis_and_setups() -> None:
    info = SimpleNamespace(turns=[1, 3], setups={"int4": [SimpleNamespace(turn=1, accuracy=0.5)]})
    results: Any = SimpleNamespace(multi_turn=info)  # only the block the figure reads
    svg = svg_of(accuracy_by_turn_figure, results)
    assert "exact match (%)" in svg and "int4" in svg
