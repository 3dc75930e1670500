"""Taking a run directory: refuse a path that cannot hold a run, a folder holding someone
else's files or another config's run, and a folder another `qeval run` is writing (a lock).

    RUN_DIR/.qeval-run.json   qeval's marker: which config's run this folder holds
    RUN_DIR/.qeval.lock       flock(2)-held for the whole run, holding the owner's PID
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from qeval.errors import UserError
from qeval.files.atomic import atomic_write_json

MARKER = ".qeval-run.json"
LOCK = ".qeval.lock"


@dataclass
class RunDirLock:
    """An open, locked run directory; `release()` (or process exit) frees it."""

    root: Path
    handle: IO[str]

    def release(self) -> None:
        fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()


def take_run_dir(root: Path, config_name: str, force: bool, ours: frozenset[str] = frozenset()) -> RunDirLock:
    """Create or reuse `root` for a run of `config_name`; raise one-line UserErrors for every
    reason it cannot be, before anything in it is touched. `ours`: names the caller knows as
    this config's own though no marker says so (`qeval goodput`'s files of before it wrote one)."""
    if root.exists() and not root.is_dir():
        raise UserError(f"--output {root}: exists and is not a directory")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--output {root}: cannot create it ({exc.strerror})") from None
    _check_owner(root, config_name, force, ours)
    try:
        handle = open(root / LOCK, "a+")  # noqa: SIM115 - held for the whole run
    except OSError as exc:
        raise UserError(f"--output {root}: not writable ({exc.strerror})") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        pid = handle.read().strip() or "unknown"
        handle.close()
        raise UserError(
            f"--output {root}: another qeval run (PID {pid}) is writing to it; wait for it to finish "
            "or choose another --output"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    try:
        atomic_write_json(root / MARKER, {"config_name": config_name})
    except OSError as exc:
        handle.close()
        raise UserError(f"--output {root}: not writable ({exc.strerror})") from None
    return RunDirLock(root, handle)


def _check_owner(root: Path, config_name: str, force: bool, ours: frozenset[str] = frozenset()) -> None:
    """A folder qeval may write: empty, or holding this config's run (qeval's marker says so)."""
    entries = [p.name for p in root.iterdir() if p.name != LOCK and p.name not in ours]
    if not entries or force:
        return
    marker = root / MARKER
    if not marker.is_file():
        raise UserError(
            f"--output {root}: holds files qeval did not write ({', '.join(sorted(entries)[:3])}…); "
            "refusing to overwrite them (choose an empty folder, or pass --force)"
        )
    try:
        owner = json.loads(marker.read_text(encoding="utf-8")).get("config_name")
    except (OSError, ValueError, AttributeError):
        owner = None
    if owner != config_name:
        raise UserError(
            f"--output {root}: holds the run of config {owner!r}, not {config_name!r}; refusing to "
            "overwrite it (choose another --output, or pass --force)"
        )


def check_output(output: Path, model_dir: Path | None) -> None:
    """Refuse a run directory inside the model's folder, before anything is written: the model's
    checksum covers every file of that folder, so the run's own files would make each rerun see
    another model and recompute everything."""
    if model_dir is None:
        return
    out, model = output.resolve(), model_dir.resolve()
    if out == model or model in out.parents:
        raise UserError(
            f"--output {output}: inside the model folder {model_dir}: the run's files would change the "
            "model's checksum, and every rerun would recompute everything; write the run elsewhere"
        )
