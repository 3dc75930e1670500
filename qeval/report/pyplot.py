"""matplotlib's pyplot, imported at the first drawing (no backend forced: Agg headless, inline in a
notebook). A worker process imports the task kinds' report sections and draws nothing, and pyplot
is about a quarter of a second of its start on the 2-core CI machines."""

from __future__ import annotations

from typing import Any


def pyplot() -> Any:
    """matplotlib.pyplot (imported once, by the first call)."""
    import matplotlib.pyplot as plt

    return plt


def subplots(*args: Any, **kw: Any) -> tuple[Any, Any]:
    """`matplotlib.pyplot.subplots`, pyplot imported at the first call."""
    return pyplot().subplots(*args, **kw)
