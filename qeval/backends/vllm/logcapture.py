"""Capture what a process *and its children* print (vLLM's engine core is a spawned child
that logs figures qeval needs, such as the KV cache size), while still showing it."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class CapturedOutput:
    """Lines written to fds 1 and 2 while the capture was active."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def text(self) -> str:
        with self._lock:
            return "".join(self.lines)

    def _add(self, line: str) -> None:
        with self._lock:
            self.lines.append(line)


@contextmanager
def capture_fds() -> Iterator[CapturedOutput]:
    """Point fds 1 and 2 at a pipe (children inherit it), tee it to the original stderr.
    The pipe stays in place after the block: later children keep writing into it."""
    captured = CapturedOutput()
    read_fd, write_fd = os.pipe()
    original = os.dup(2)
    os.dup2(write_fd, 1)
    os.dup2(write_fd, 2)
    os.close(write_fd)

    def pump() -> None:
        with os.fdopen(read_fd, "r", errors="replace") as src, os.fdopen(original, "w") as dst:
            for line in src:
                captured._add(line)
                dst.write(line)
                dst.flush()

    threading.Thread(target=pump, daemon=True).start()
    yield captured
