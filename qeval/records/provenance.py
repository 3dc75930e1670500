"""Where a run came from: qeval version, git commit, time, package versions, hardware."""

from __future__ import annotations

import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qeval.records.preflight import Preflight


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


def run_info(pre: Preflight, output: Path) -> dict[str, Any]:
    """results.json's `run` block but for `started`: what ran, where, with which model, dtype and code."""
    from qeval.version import __version__

    return {
        "name": pre.cfg.name,
        "config_hash": pre.config_hash(),  # model.dtype resolved, as it always was
        "qeval_version": __version__,
        "git_commit": git_commit(),
        "finished": now_iso(),
        "device": pre.device,
        "backend": pre.cfg.backend,
        "model_sha256": pre.model_sha256,
        "limit": pre.cfg.limit,
        "output": str(output),
        "skipped_setups": pre.skipped,
        "dtype": pre.precision.dtype,
        "dtype_requested": pre.precision.requested,
        "dtype_reason": pre.precision.reason,
    }
