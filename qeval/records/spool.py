"""A task's records and top-k on their way to the run store, held on disk instead of in memory.

A task scored in chunks (lm-eval's, qeval/tasks/lm_eval/scoring.py) appends each chunk's
records and top-k here as it goes, so the worker's memory does not grow with the number of
documents. The files live in the run directory's scratch folder (RunStore.scratch_dir, the same
file system as the store), so storing them never rebuilds them in memory: the records' file is
renamed into place (`RecordSpool.move_to`), and `TopkSpool.write_npz` writes the `.topk.npz` that
`np.savez_compressed` would, one block at a time.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import shutil
import stat
import zipfile
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from qeval.files.atomic import atomic_write_bytes, jsonable
from qeval.results.samples import SampleRecord, read_record

#: bytes copied at a time when a spool is written into the store
BLOCK = 1 << 20


def _scratch_file(folder: Path, stem: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{stem}.{secrets.token_hex(6)}.spool"


class RecordSpool:
    """Per-document records appended to a JSONL file and read back on demand: what a task's
    TaskResult holds in place of a list when it was scored in chunks. Iterating it reads the
    records back one at a time, in the order they were added."""

    def __init__(self, folder: Path, stem: str, resume: dict[str, Any] | None = None) -> None:
        """A new spool in `folder`, or with `resume` (a `state()` of one saved after a chunk) that
        spool again, cut back to what the state says it held: a chunk written after the state was
        saved, wholly or in part, is dropped, and its records come again."""
        if resume is None:
            self.path = _scratch_file(folder, stem)
            self._out: IO[bytes] | None = open(self.path, "wb")  # noqa: SIM115  # closed by finish()/discard()
            self.n = 0
        else:
            self.path = _named_in(folder, resume["file"])
            _check_holds(self.path, int(resume["bytes"]))
            self._out = _open_existing(self.path)  # closed by finish()/discard()
            self._out.truncate(int(resume["bytes"]))
            self._out.seek(0, os.SEEK_END)
            self.n = int(resume["n"])

    def state(self) -> dict[str, Any]:
        """What `RecordSpool(folder, stem, resume=...)` needs to carry on from here: the file, its
        records and bytes so far (flushed to the OS, so a killed worker's records survive)."""
        assert self._out is not None, "the spool is finished"
        self._out.flush()
        os.fsync(self._out.fileno())  # on disk before the state that names it: a crash of the machine too
        return {"file": self.path.name, "n": self.n, "bytes": self._out.tell()}

    def extend(self, records: list[SampleRecord]) -> None:
        """Append records (JSON, one a line, as the store writes them)."""
        assert self._out is not None, "the spool is finished"
        for r in records:
            self._out.write(r.to_line())
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

    def copy(self) -> RecordSpool:
        """A finished spool of its own over a copy of this one's file (this one left as it is: a
        sequential task stored at a pass's horizon moves the copy into the store, and a later pass
        carries on appending to this one from its saved state)."""
        self.finish()
        out = RecordSpool.__new__(RecordSpool)
        out.path, out._out, out.n = _scratch_file(self.path.parent, "copy"), None, self.n
        shutil.copyfile(self.path, out.path)
        return out

    def __iter__(self) -> Iterator[SampleRecord]:
        for line in self.lines():
            yield read_record(json.loads(line))

    def __len__(self) -> int:
        return self.n

    def discard(self) -> None:
        self.finish()
        self.path.unlink(missing_ok=True)


class TopkSpool:
    """Consecutive top-k packs (`pack_topk`'s form: offsets, then per-token arrays) appended to one
    raw file per array. The offsets (8 bytes a request) stay in memory; the per-token arrays,
    the bulk, go to disk."""

    def __init__(
        self, folder: Path, stem: str, resume: dict[str, Any] | None = None, lengths: np.ndarray | None = None
    ) -> None:
        """A new spool in `folder`, or with `resume` and `lengths` (a `state()` of one saved after
        a chunk) that spool again, each raw file cut back to the rows the state says it held."""
        self.folder, self.stem = folder, stem
        self.lengths: list[np.ndarray] = []
        #: array name -> (its raw file, dtype, shape of one row, rows written)
        self.arrays: dict[str, tuple[Path, np.dtype[Any], tuple[int, ...], int]] = {}
        if resume is None:
            return
        self.lengths = [np.asarray(lengths, dtype=np.int64)] if lengths is not None and len(lengths) else []
        for key, (name, descr, row, rows) in resume["arrays"].items():
            dtype, shape = np.dtype(descr), tuple(int(x) for x in row)
            path = _named_in(folder, name)
            size = int(rows) * dtype.itemsize * int(np.prod(shape, dtype=np.int64))
            _check_holds(path, size)
            with _open_existing(path) as f:
                f.truncate(size)
            self.arrays[key] = (path, dtype, shape, int(rows))

    def state(self) -> tuple[dict[str, Any], np.ndarray]:
        """What `TopkSpool(folder, stem, resume=..., lengths=...)` needs to carry on from here:
        each array's file and rows (JSON), and the requests' token counts (an array)."""
        for path, *_ in self.arrays.values():
            _fsync(path)  # on disk before the state that names them
        arrays = {
            key: [path.name, np.lib.format.dtype_to_descr(dtype), list(row), rows]
            for key, (path, dtype, row, rows) in self.arrays.items()
        }
        lengths = np.concatenate(self.lengths) if self.lengths else np.zeros(0, dtype=np.int64)
        return {"arrays": arrays}, lengths

    def append(self, pack: dict[str, np.ndarray]) -> None:
        """One pack: its requests follow the ones already held."""
        self.lengths.append(np.diff(pack["offsets"]).astype(np.int64))
        for key, arr in pack.items():
            if key == "offsets":
                continue
            arr = np.ascontiguousarray(arr)
            path, dtype, row, rows = self.arrays.get(key) or (
                _scratch_file(self.folder, f"{self.stem}.{key}"),
                arr.dtype,
                arr.shape[1:],
                0,
            )
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
                header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (rows, *row)}
                with zf.open(f"{key}.npy", "w", force_zip64=True) as member, open(path, "rb") as f:
                    np.lib.format.write_array_header_1_0(member, header)  # a few dozen bytes: 1.0 holds it
                    while block := f.read(BLOCK):
                        member.write(block)

    def copy(self) -> TopkSpool:
        """A spool of its own over copies of this one's files (see RecordSpool.copy)."""
        out = TopkSpool(self.folder, self.stem)
        out.lengths = list(self.lengths)
        for key, (path, dtype, row, rows) in self.arrays.items():
            dest = _scratch_file(self.folder, f"{self.stem}.{key}")
            shutil.copyfile(path, dest)
            out.arrays[key] = (dest, dtype, row, rows)
        return out

    def discard(self) -> None:
        for path, *_ in self.arrays.values():
            path.unlink(missing_ok=True)
        self.arrays.clear()


def _named_in(folder: Path, name: str) -> Path:
    """`folder/name` for a spool's file name read back from a saved state: a bare file name of a
    spool that is a regular file there, never a path elsewhere nor a symlink to one (the state and
    the folder are in the run directory, not trusted)."""
    if not isinstance(name, str) or Path(name).name != name or not name.endswith(".spool"):
        raise ValueError(f"scratch state names {name!r}, not a spool of its folder")
    path = folder / name
    if not stat.S_ISREG(os.lstat(path).st_mode):
        raise ValueError(f"{name}: not a regular file")
    return path


def _open_existing(path: Path) -> IO[bytes]:
    """A spool taken up again, opened for reading and writing without following a symlink."""
    return os.fdopen(os.open(path, os.O_RDWR | os.O_NOFOLLOW), "r+b")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: a saved state in a scratch folder (a chunked scoring's, to be resumed): JSON and arrays, one npz
STATE_SUFFIX = ".state.npz"


def save_state(
    folder: Path, name: str, meta: dict[str, Any], arrays: dict[str, np.ndarray], files: Collection[str]
) -> None:
    """Write a state (`meta`: JSON, `arrays`: numpy) into `folder`, atomically: a worker killed
    while writing it leaves the previous one whole. `files`: the spools it needs, which
    `clear_scratch(folder, keep_states=True)` then keeps."""
    payload = {f"a.{k}": v for k, v in arrays.items()}
    blob = json.dumps({"meta": meta, "files": sorted(files)}, default=jsonable).encode()
    payload["state"] = np.frombuffer(blob, dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **payload)  # type: ignore[arg-type]  # numpy's stubs want positional arrays
    atomic_write_bytes(folder / f"{name}{STATE_SUFFIX}", buf.getvalue())


def discard_state(folder: Path, name: str) -> None:
    """Remove a saved state (the spools it names go when the folder is next cleared)."""
    (folder / f"{name}{STATE_SUFFIX}").unlink(missing_ok=True)


def load_state(folder: Path, name: str) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """A state `save_state` wrote, or None where there is none or it cannot be read (read as
    data: JSON and plain arrays, never a pickle)."""
    read = _read_state(folder / f"{name}{STATE_SUFFIX}", with_arrays=True)
    return None if read is None else (read[0]["meta"], read[1])


def _read_state(path: Path, with_arrays: bool) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            state = json.loads(bytes(z["state"]).decode())
            arrays = {k[2:]: z[k] for k in z.files if k.startswith("a.")} if with_arrays else {}
        if not isinstance(state, dict) or not isinstance(state.get("meta"), dict):
            return None
        return state, arrays
    except Exception:  # noqa: BLE001 - damaged in any way (RecursionError from deep JSON too): no state
        return None


def _check_holds(path: Path, size: int) -> None:
    """A spool taken up again must hold at least what its state says (it is cut back to that,
    never padded: a shorter file was damaged, and its task is scored again)."""
    if size < 0 or path.stat().st_size < size:
        raise ValueError(f"{path.name}: holds less than its saved state says")


def clear_scratch(folder: Path, keep_states: bool = False) -> None:
    """Remove what a worker left in its scratch folder (spools, half-written temporary files);
    with `keep_states`, not the saved states and the spools they name: a chunked scoring
    interrupted there carries on from them (qeval/tasks/lm_eval/resume.py)."""
    if not folder.is_dir():
        return
    keep: set[str] = set()
    if keep_states:
        for path in folder.glob(f"*{STATE_SUFFIX}"):
            read = _read_state(path, with_arrays=False)
            files = read[0].get("files") if read is not None else None
            if isinstance(files, list):
                keep.add(path.name)
                keep.update(f for f in files if isinstance(f, str))
    for p in folder.iterdir():
        if p.name not in keep and p.is_file():
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
                read_header = (
                    np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                )
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
