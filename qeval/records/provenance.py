"""Where a run came from: qeval version, git commit, time, package versions, hardware."""

from __future__ import annotations

import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def hardware() -> dict[str, str | int]:
    import os

    return {
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count() or 0,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
