"""Atomic writes (temporary file, then rename: a reader never sees half a file) and the
matching JSON reader, which turns a corrupt or truncated file into one line."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

import numpy as np

from qeval.errors import UserError


def atomic_write_bytes(path: Path, data: bytes | Iterable[bytes]) -> None:
    """Write via a temporary file in the same folder and rename: readers never see half a file.
    `data` may be an iterable of pieces (JSONL lines), written one by one so that the whole file
    is never held in memory."""

    def write(f: IO[bytes]) -> None:
        if isinstance(data, bytes):
            f.write(data)
        else:
            for piece in data:
                f.write(piece)

    atomic_write_stream(path, write)


def atomic_write_stream(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """`write(f)` into a temporary file in the same folder, then rename it to `path`. The
    temporary file is created with mode 0666 so that the process umask decides its permissions,
    as for any other file the user writes (mkstemp would make it 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False, default=jsonable) + "\n").encode())


def jsonable(obj: Any) -> Any:
    """`json.dumps`'s `default`: numpy scalars and arrays as plain JSON values (shared by the
    results, the spools and the sample records)."""
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def read_json(path: Path) -> Any:
    """A JSON file qeval wrote; a truncated, corrupt or non-UTF-8 one is a one-line UserError."""
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: corrupt JSON ({getattr(exc, 'msg', exc)})") from None
    except RecursionError:  # nested thousands deep: json's decoder recurses (a hostile file)
        raise UserError(f"{path}: corrupt JSON (nested too deeply)") from None
