"""The run directory: atomic writes, per-(setup, task) results keyed for resume.

    RUN_DIR/results.json                      the assembled run (schema below, design §8)
    RUN_DIR/setups/<setup>.json               one worker's outcome: status, memory, versions
    RUN_DIR/samples/<setup>/<task>.jsonl      one line per sample (the store of record)
    RUN_DIR/samples/<setup>/<task>.meta.json  its cache key, metrics and timing
    RUN_DIR/samples/<setup>/<task>.topk.npz   perplexity top-k distributions (baseline only)
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA_VERSION = 1
_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a temporary file in the same folder and rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; results are for sharing
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False, default=_jsonable) + "\n").encode())


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def task_key(*parts: str) -> str:
    """The resume key of a (setup, task): any change in its parts recomputes it."""
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:24]


class RunStore:
    """Reads and writes one run directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def samples_path(self, setup: str, task: str) -> Path:
        return self.root / "samples" / setup / f"{task}.jsonl"

    def meta_path(self, setup: str, task: str) -> Path:
        return self.root / "samples" / setup / f"{task}.meta.json"

    def topk_path(self, setup: str, task: str) -> Path:
        return self.root / "samples" / setup / f"{task}.topk.npz"

    def setup_path(self, setup: str) -> Path:
        return self.root / "setups" / f"{setup}.json"

    @property
    def results_path(self) -> Path:
        return self.root / "results.json"

    def is_done(self, setup: str, task: str, key: str) -> bool:
        meta = self.meta_path(setup, task)
        return meta.is_file() and self.samples_path(setup, task).is_file() and read_json(meta).get("key") == key

    def write_task(self, setup: str, task: str, key: str, records: list[dict[str, Any]],
                   metrics: dict[str, Any], extra: dict[str, Any], topk: dict[str, np.ndarray] | None) -> None:
        """Samples first, the meta (which marks the pair done) last: a crash between the
        two leaves the pair not done, never done with missing samples."""
        lines = "".join(json.dumps(r, default=_jsonable) + "\n" for r in records)
        atomic_write_bytes(self.samples_path(setup, task), lines.encode())
        if topk is not None:
            path = self.topk_path(setup, task)
            with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".npz", delete=False) as f:
                np.savez_compressed(f, **topk)
            os.replace(f.name, path)
        atomic_write_json(self.meta_path(setup, task), {"key": key, "n": len(records), "metrics": metrics} | extra)

    def read_meta(self, setup: str, task: str) -> dict[str, Any] | None:
        path = self.meta_path(setup, task)
        return read_json(path) if path.is_file() else None

    def read_samples(self, setup: str, task: str) -> list[dict[str, Any]]:
        path = self.samples_path(setup, task)
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def read_topk(self, setup: str, task: str) -> dict[str, np.ndarray] | None:
        path = self.topk_path(setup, task)
        if not path.is_file():
            return None
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
