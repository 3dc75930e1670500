"""A task's records and top-k on their way to the run store, held on disk instead of in memory.

A task scored in chunks (lm-eval's, qeval/tasks/lm_eval/scoring.py) appends each chunk's
records and top-k here as it goes, so the worker's memory does not grow with the number of
documents. The files live in the run directory's scratch folder (RunStore.scratch_dir, the same
file system as the store), so storing them never rebuilds them in memory: the records' file is
renamed into place (`RecordSpool.move_to`), and `TopkSpool.write_npz` writes the `.topk.npz` that
`np.savez_compressed` would, one block at a time.
"""

from __future__ import annotations

import json
import os
import secrets
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from qeval.files.atomic import _jsonable

#: bytes copied at a time when a spool is written into the store
BLOCK = 1 << 20


def _scratch_file(folder: Path, stem: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{stem}.{secrets.token_hex(6)}.spool"


class RecordSpool:
    """Per-document records appended to a JSONL file and read back on demand: what a task's
    TaskResult holds in place of a list when it was scored in chunks. Iterating it reads the
    records back one at a time, in the order they were added."""

    def __init__(self, folder: Path, stem: str) -> None:
        self.path = _scratch_file(folder, stem)
        self._out: IO[bytes] | None = open(self.path, "wb")  # noqa: SIM115  # closed by finish()/discard()
        self.n = 0

    def extend(self, records: list[dict[str, Any]]) -> None:
        """Append records (JSON, one a line, as the store writes them)."""
        assert self._out is not None, "the spool is finished"
        for r in records:
            self._out.write((json.dumps(r, default=_jsonable) + "\n").encode())
        self.n += len(records)

    def finish(self) -> None:
        """Flush and close the file: nothing more is added."""
        if self._out is not None:
            self._out.close()
            self._out = None

    def lines(self) -> Iterator[bytes]:
        """The stored lines, as the store writes them into samples/<setup>/<task>.jsonl."""
        self.finish()
        with open(self.path, "rb") as f:
            yield from f

    def move_to(self, path: Path) -> None:
        """Make the spool `path`, atomically (fsync, then rename: the same file system): the
        store's samples file, written once, never copied."""
        self.finish()
        with open(self.path, "rb") as f:
            os.fsync(f.fileno())
        os.replace(self.path, path)
        self.path = path

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for line in self.lines():
            yield json.loads(line)

    def __len__(self) -> int:
        return self.n

    def discard(self) -> None:
        self.finish()
        self.path.unlink(missing_ok=True)


class TopkSpool:
    """Consecutive top-k packs (`pack_topk`'s form: offsets, then per-token arrays) appended to one
    raw file per array. The offsets (8 bytes a request) stay in memory; the per-token arrays,
    the bulk, go to disk."""

    def __init__(self, folder: Path, stem: str) -> None:
        self.folder, self.stem = folder, stem
        self.lengths: list[np.ndarray] = []
        #: array name -> (its raw file, dtype, shape of one row, rows written)
        self.arrays: dict[str, tuple[Path, np.dtype[Any], tuple[int, ...], int]] = {}

    def append(self, pack: dict[str, np.ndarray]) -> None:
        """One pack: its requests follow the ones already held."""
        self.lengths.append(np.diff(pack["offsets"]).astype(np.int64))
        for key, arr in pack.items():
            if key == "offsets":
                continue
            arr = np.ascontiguousarray(arr)
            path, dtype, row, rows = self.arrays.get(key) or (_scratch_file(self.folder, f"{self.stem}.{key}"),
                                                              arr.dtype, arr.shape[1:], 0)
            if (arr.dtype, arr.shape[1:]) != (dtype, row):
                raise ValueError(f"top-k pack {key}: {arr.dtype}{arr.shape[1:]} after {dtype}{row}")
            with open(path, "ab") as f:
                f.write(arr.tobytes())
            self.arrays[key] = (path, dtype, row, rows + len(arr))

    def __bool__(self) -> bool:
        return bool(self.lengths)

    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(np.concatenate(self.lengths))]).astype(np.int64)

    def write_npz(self, out: IO[bytes]) -> None:
        """The packs as one `.npz`, as `np.savez_compressed(out, **concat_topk(packs))` writes it
        (deflated .npy members), each array copied from its raw file a block at a time."""
        with zipfile.ZipFile(out, mode="w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as zf:
            with zf.open("offsets.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, self.offsets(), allow_pickle=False)
            for key, (path, dtype, row, rows) in self.arrays.items():
                header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                          "shape": (rows, *row)}
                with zf.open(f"{key}.npy", "w", force_zip64=True) as member, open(path, "rb") as f:
                    np.lib.format.write_array_header_1_0(member, header)  # a few dozen bytes: 1.0 holds it
                    while block := f.read(BLOCK):
                        member.write(block)

    def discard(self) -> None:
        for path, *_ in self.arrays.values():
            path.unlink(missing_ok=True)
        self.arrays.clear()


def clear_scratch(folder: Path) -> None:
    """Remove a scratch folder's spools left by a worker that died mid-task."""
    if folder.is_dir():
        for p in folder.glob("*.spool"):
            p.unlink(missing_ok=True)
        try:
            os.rmdir(folder)
        except OSError:
            pass


class TopkReader:
    """A stored `.topk.npz` read request by request, in order: its offsets whole (8 bytes a
    request), each per-token array streamed from its zip member as `take` asks for the next
    requests. A setup scored against the baseline holds one chunk of the baseline's top-k at a
    time, never all of it. Use it as a context manager, or `close()` it."""

    def __init__(self, path: Path) -> None:
        self._zip = zipfile.ZipFile(path)
        try:
            with self._zip.open("offsets.npy") as f:
                self.offsets: np.ndarray = np.lib.format.read_array(f, allow_pickle=False)
            #: array name -> (its open member, dtype, shape of one row)
            self._members: dict[str, tuple[IO[bytes], np.dtype[Any], tuple[int, ...]]] = {}
            for name in self._zip.namelist():
                key = name.removesuffix(".npy")
                if key == "offsets":
                    continue
                member = self._zip.open(name)
                version = np.lib.format.read_magic(member)
                read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                    np.lib.format.read_array_header_2_0
                shape, fortran, dtype = read_header(member)
                if fortran:
                    raise ValueError(f"{path}: {key} is stored in Fortran order")
                self._members[key] = (member, dtype, tuple(shape[1:]))
        except BaseException:
            self.close()
            raise
        self.n_requests = len(self.offsets) - 1
        self._next = 0

    def keys(self) -> set[str]:
        return {"offsets", *self._members}

    def take(self, n: int) -> list[tuple[np.ndarray, ...]]:
        """The next `n` requests' references (fewer where the file ends): per request, the arrays
        in the order pack_topk stores them (indices, logprobs, then token_logprobs if present)."""
        start, end = self._next, min(self._next + n, self.n_requests)
        first, rows = int(self.offsets[start]), int(self.offsets[end] - self.offsets[start])
        arrays = []
        for key in ("indices", "logprobs", "token_logprobs"):
            if key not in self._members:
                continue
            member, dtype, row = self._members[key]
            size = rows * dtype.itemsize * int(np.prod(row, dtype=np.int64))
            data = member.read(size)
            if len(data) != size:
                raise ValueError(f"top-k reference: {key} ends early")
            # a writable buffer: torch refuses (warns on) read-only arrays
            arrays.append(np.frombuffer(bytearray(data), dtype=dtype).reshape(rows, *row))
        self._next = end
        o = self.offsets[start : end + 1] - first
        return [tuple(a[o[i] : o[i + 1]] for a in arrays) for i in range(end - start)]

    def close(self) -> None:
        for member, *_ in getattr(self, "_members", {}).values():
            member.close()
        self._zip.close()

    def __enter__(self) -> TopkReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
