"""The run directory: atomic writes, per-(setup, task) results keyed for resume.

    RUN_DIR/results.json                      the assembled run
    RUN_DIR/setups/<setup>.json               one worker's outcome: status, memory, versions, key
    RUN_DIR/samples/<setup>/<task>.jsonl      one line per sample (the store of record)
    RUN_DIR/samples/<setup>/<task>.meta.json  its resume key (and the key's parts), metrics, timing
    RUN_DIR/samples/<setup>/<task>.topk.npz   top-k distributions (the baseline's, a parity partner's)

Every path is built from validated names and checked to resolve inside RUN_DIR.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from qeval.errors import UserError
from qeval.files.atomic import atomic_write_bytes, atomic_write_json, atomic_write_stream, read_json
from qeval.files.names import inside
from qeval.records.job import KeyParts, Outcome, outcome_of
from qeval.records.spool import RecordSpool, TopkReader, TopkSpool
from qeval.results.samples import SampleRecord, read_record


class StoredMetric(BaseModel):
    """One metric of a stored task, as its scorer computed it (non-finite values included: the
    run says so, qeval/analysis/finite.py)."""

    model_config = ConfigDict(extra="allow")

    value: float
    stderr: float | None = None


class TaskMeta(BaseModel):
    """RUN_DIR/samples/<setup>/<task>.meta.json: the file that marks a (setup, task) stored
    (docs/guarantees.md), read back typed."""

    # extra="allow": a meta written by another qeval version still reads (its key then differs)
    model_config = ConfigDict(extra="allow")

    #: the resume key the task was stored under, and its parts
    key: str
    key_parts: KeyParts | None = None
    #: documents scored
    n: int
    metrics: dict[str, StoredMetric] = {}
    seconds: float | None = None
    #: the checksum of the task's data as scored
    task_sha256: str | None = None
    #: scored against the baseline's top-k: the token-level KL and Δp distribution
    kl_distribution: dict[str, float] | None = None
    #: generation tasks on a backend that counts: the mean tokens generated per document
    generated_tokens: float | None = None

    def metric_values(self) -> dict[str, dict[str, Any]]:
        """The metrics as the scorer wrote them (what qeval/analysis/finite.py checks)."""
        return {k: v.model_dump() for k, v in self.metrics.items()}


def task_meta(raw: Any, where: Path) -> tuple[TaskMeta | None, str | None]:
    """A meta file's content, validated; else None and why."""
    try:
        return TaskMeta.model_validate(raw), None
    except ValidationError as exc:
        err = exc.errors()[0]
        return None, f"{where}: not a qeval task meta ({'.'.join(map(str, err['loc']))}: {err['msg']})"


class RunStore:
    """Reads and writes one run directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def samples_path(self, setup: str, task: str) -> Path:
        return inside(self.root, "samples", setup, f"{task}.jsonl")

    def meta_path(self, setup: str, task: str) -> Path:
        return inside(self.root, "samples", setup, f"{task}.meta.json")

    def topk_path(self, setup: str, task: str) -> Path:
        return inside(self.root, "samples", setup, f"{task}.topk.npz")

    def scratch_dir(self, setup: str) -> Path:
        """Where a setup's tasks scored in chunks keep their records and top-k until they are
        stored (qeval/records/spool.py): inside the run directory, so storing them never needs
        them in memory; a worker clears it as it starts."""
        return inside(self.root, "samples", setup, ".scratch")

    def setup_path(self, setup: str) -> Path:
        return inside(self.root, "setups", f"{setup}.json")

    @property
    def results_path(self) -> Path:
        return self.root / "results.json"

    def is_done(self, setup: str, task: str, key: str) -> bool:
        meta = self.read_meta(setup, task)
        return meta is not None and meta.key == key and self.samples_path(setup, task).is_file()

    def write_task(
        self,
        setup: str,
        task: str,
        key: str,
        records: Sequence[SampleRecord] | RecordSpool,
        metrics: dict[str, Any],
        extra: dict[str, Any],
        topk: dict[str, np.ndarray] | TopkSpool | None,
    ) -> None:
        """The meta file marks the pair stored (docs/guarantees.md, "Which file marks a task
        stored"): an earlier meta is removed first, then the samples, the top-k and the meta are
        written, each atomically. A kill anywhere between leaves the pair not done, never done
        with missing samples, nor done under an earlier key with these samples (a config changed
        back would take them for its own). Records and top-k held in a spool
        (qeval/records/spool.py) go from its files, never loaded whole."""
        self.meta_path(setup, task).unlink(missing_ok=True)
        if isinstance(records, RecordSpool):  # already on disk, in the run directory: moved into place
            records.move_to(self.samples_path(setup, task))
        else:
            atomic_write_bytes(self.samples_path(setup, task), (r.to_line() for r in records))  # streamed, not joined
        if isinstance(topk, TopkSpool):
            atomic_write_stream(self.topk_path(setup, task), topk.write_npz)
            topk.discard()
        elif topk is not None:
            buf = io.BytesIO()
            np.savez_compressed(buf, **topk)  # type: ignore[arg-type]  # numpy's stub types **kwds as bool
            atomic_write_bytes(self.topk_path(setup, task), buf.getvalue())
        atomic_write_json(self.meta_path(setup, task), {"key": key, "n": len(records), "metrics": metrics} | extra)

    def read_meta(self, setup: str, task: str) -> TaskMeta | None:
        """The stored meta, typed, or None when absent or unreadable (a corrupt meta means the
        pair is not done: it is recomputed, and the reason printed)."""
        consequence = f"{setup}/{task} will be recomputed"
        raw = _read_object(self.meta_path(setup, task), consequence)
        if raw is None:
            return None
        meta, why = task_meta(raw, self.meta_path(setup, task))
        if why is not None:
            print(f"qeval: warning: {why}; {consequence}", file=sys.stderr)
        return meta

    def read_outcome(self, setup: str) -> Outcome | None:
        """A worker's stored outcome, typed, or None when absent or unreadable."""
        raw = _read_object(self.setup_path(setup), f"setup {setup} will be rerun")
        return None if raw is None else outcome_of(raw, self.setup_path(setup))

    def read_samples(self, setup: str, task: str) -> list[SampleRecord]:
        """Per-sample records, typed; a corrupt line, or one that is no record, is a one-line
        UserError naming file and line."""
        path = self.samples_path(setup, task)
        return read_sample_file(path) if path.is_file() else []

    def open_topk(self, setup: str, task: str) -> TopkReader | None:
        """The stored top-k, to read request by request (TopkReader), or None where there is none."""
        path = self.topk_path(setup, task)
        return TopkReader(path) if path.is_file() else None

    def read_topk(self, setup: str, task: str) -> dict[str, np.ndarray] | None:
        path = self.topk_path(setup, task)
        if not path.is_file():
            return None
        with np.load(path) as z:
            return {k: z[k] for k in z.files}


def read_sample_file(path: Path) -> list[SampleRecord]:
    """The records of one samples file (RunStore.read_samples; `qeval compare` reads another
    run's through it); a corrupt line, or one that is no record, is a one-line UserError."""
    from pydantic import ValidationError

    from qeval.files.jsonl import read_objects

    out = []
    try:
        for lineno, obj in read_objects(path):
            try:
                out.append(read_record(obj))
            except ValidationError as exc:
                err = exc.errors()[0]
                where = ".".join(map(str, err["loc"]))
                raise UserError(f"{path}:{lineno}: malformed record: {where}: {err['msg']}") from None
    except UserError as exc:
        raise UserError(str(exc).replace("corrupt dataset line", "corrupt samples line")) from None
    return out


def _read_object(path: Path, consequence: str) -> dict[str, Any] | None:
    """A JSON object qeval stored, or None when absent; a corrupt one is None too, with a
    warning saying what follows from it."""
    if not path.is_file():
        return None
    try:
        obj = read_json(path)
    except UserError as exc:
        print(f"qeval: warning: {exc}; {consequence}", file=sys.stderr)
        return None
    return obj if isinstance(obj, dict) else None
