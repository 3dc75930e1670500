"""`qeval run`'s options over the config (the command line's, a sweep's, a test's)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class RunOptions:
    output: Path
    setups: list[str] | None = None
    tasks: list[str] | None = None
    limit: int | None = None
    force: bool = False
    #: `local` or `ray`: overrides the config's executor.kind (`qeval run --executor`)
    executor: str | None = None
    #: overrides the config's performance.enabled (`qeval run --performance/--no-performance`)
    performance: bool | None = None
