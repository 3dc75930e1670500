"""Progress bars on stderr (rich), quiet when stderr is not a terminal."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

_console = Console(stderr=True)


class _Bar:
    def __init__(self, progress: Progress, task_id: Any) -> None:
        self._p, self._id = progress, task_id

    def advance(self, n: int = 1) -> None:
        self._p.advance(self._id, n)


@contextmanager
def progress_bar(description: str, total: int | None) -> Iterator[_Bar]:
    """A bar for `total` units; in a log (no terminal) one line at start and end instead."""
    description = escape(description)  # rich reads `[...]` in a task or setup name as markup
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=_console,
        transient=False,
        disable=not _console.is_terminal,
    )
    if not _console.is_terminal:
        _console.print(f"{description} …", highlight=False)
    with progress:
        yield _Bar(progress, progress.add_task(description, total=total))
    if not _console.is_terminal:
        _console.print(f"{description} done", highlight=False)
