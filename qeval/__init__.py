"""qeval: quantization quality-vs-memory evaluation for large language models."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qeval.version import __version__

__all__ = ["__version__", "load_run"]

if TYPE_CHECKING:
    from qeval.notebook import Run


def load_run(path: Any) -> Run:
    """Open a finished run directory for drill-down with pandas (see qeval.notebook)."""
    from qeval.notebook import load_run as _load  # lazy: `import qeval` stays cheap

    return _load(path)
