"""The run directories `qeval compare` reads: each checked to be a finished qeval run that no
`qeval run` is writing (its lock, held shared while compare reads it), read through the one
results reader and the run store (whose paths stay inside the directory), and every per-document
record checked before a number is taken from it."""

from __future__ import annotations

import fcntl
import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from qeval.analysis.comparison import _PAIRED_FIELD as PAIRED_FIELD
from qeval.errors import UserError
from qeval.files.jsonl import read_objects
from qeval.files.names import check_name
from qeval.records.store import RunStore
from qeval.results.metrics import describe
from qeval.results.samples import SampleRecord, read_record
from qeval.results.schema import Results, read_results
from qeval.run.rundir import LOCK


@dataclass
class LoadedRun:
    """One finished run: where it is, its results, its store of per-document records, and the
    run directory's lock held shared (None: a run written before locks, or by hand)."""

    path: Path
    results: Results
    store: RunStore
    lock: IO[bytes] | None = None
    _records: dict[tuple[str, str, str], list[SampleRecord]] = field(default_factory=dict, repr=False)

    @property
    def label(self) -> str:
        """How tables name the run: its folder and when it finished."""
        when = self.results.run.finished or self.results.run.started or "time unknown"
        return f"{self.path.name} ({when})"

    @property
    def when(self) -> str:
        return self.results.run.finished or self.results.run.started or ""

    def members(self, task: str) -> list[str]:
        """The stored tasks behind a compared entry: an lm-eval group's members, else itself."""
        members = self.results.groups.get(task)
        return list(members) if self.results.tasks[task].is_group and members else [task]

    def records(self, setup: str, task: str, metric: str) -> list[SampleRecord]:
        """A (setup, task)'s per-document records, each checked to hold a usable value of `metric`
        (one UserError naming file and line for the first that does not); an lm-eval group's are
        its members', each id prefixed with its task (ids are unique within a task only)."""
        members = self.members(task)
        if members == [task]:
            return self.stored_records(setup, task, metric)
        return [
            r.model_copy(update={"sample_id": f"{m}/{r.sample_id}"})
            for m in members
            for r in self.stored_records(setup, m, metric)
        ]

    def stored_records(self, setup: str, task: str, metric: str) -> list[SampleRecord]:
        """One stored task's records, checked (read once per metric)."""
        if (setup, task, metric) not in self._records:
            path = self.store.samples_path(setup, task)
            self._records[(setup, task, metric)] = check_records(path, metric) if path.is_file() else []
        return self._records[(setup, task, metric)]


def check_records(path: Path, metric: str) -> list[SampleRecord]:
    """The records of one samples file, typed, or one UserError naming the file, the line and
    what is wrong: a record without a usable sample id, a repeated id, no finite value of
    `metric` in its range (a proportion within 0..1), or a field of the wrong type: compare
    computes on none of them. The checks run on the line as stored, before it is typed (a
    model would turn some of what they catch, a whole-number id say, into a value)."""
    out: list[SampleRecord] = []
    seen: set[str | int] = set()
    try:
        for lineno, rec in read_objects(path):
            problem = _record_problem(rec, metric, seen)
            if problem is None:
                try:
                    out.append(read_record(rec))
                except ValidationError as exc:
                    err = exc.errors()[0]
                    problem = f"{'.'.join(map(str, err['loc']))}: {err['msg']}"
            if problem:
                raise UserError(f"{path}:{lineno}: malformed record: {problem}")
    except UserError as exc:
        raise UserError(str(exc).replace("corrupt dataset line", "corrupt samples line")) from None
    return out


def _record_problem(rec: dict[str, Any], metric: str, seen: set[str | int]) -> str | None:
    sid = rec.get("sample_id")
    if not isinstance(sid, (str, int)) or isinstance(sid, bool):
        return "no sample_id" if sid is None else f"sample_id must be a string, not {type(sid).__name__}"
    if sid in seen:
        return f"sample_id {str(sid)[:60]!r} appears twice"
    seen.add(sid)
    if not isinstance(rec.get("prompt_hash"), (str, type(None))):
        return "prompt_hash must be a string"
    if metric == "bits_per_byte":
        return _number_problem(rec, "nll", rec.get("nll"), low=0.0) or _bytes_problem(rec.get("n_bytes"))
    metrics = rec.get("metrics")
    if metrics is not None and not isinstance(metrics, dict):
        return "metrics must be an object"
    if isinstance(metrics, dict) and metric in metrics:
        name, value = f"metrics.{metric}", metrics[metric]
    elif metric in PAIRED_FIELD:
        name = PAIRED_FIELD[metric]
        value = rec.get(name)
    else:
        return f"no per-document value of {metric}"
    proportion = describe(metric).proportion
    problem = _number_problem(rec, name, value, low=0.0 if proportion else None, high=1.0 if proportion else None)
    if problem is None and metric == "exact_match" and "repeats" in rec:
        reps = rec["repeats"]
        if not isinstance(reps, list) or not all(isinstance(r, dict) for r in reps):
            return "repeats must be a list of objects"
        problem = next(
            (p for r in reps if (p := _number_problem(r, "repeats[].correct", r.get("correct"), 0.0, 1.0))), None
        )
    return problem


def _number_problem(
    rec: dict[str, Any], name: str, value: Any, low: float | None = None, high: float | None = None
) -> str | None:
    """Why `value` is not a finite number within [low, high] (a bool counts as 0 or 1), or None."""
    if name not in rec and not name.startswith(("metrics.", "repeats")):
        return f"no {name}"
    if not isinstance(value, (bool, int, float)):
        return f"{name} must be a number or true/false, not {type(value).__name__}"
    if not math.isfinite(float(value)):
        return f"{name} is {value}, not a finite number"
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"between {low:g} and {high:g}" if high is not None else f"at least {low:g}"
        return f"{name} is {value:g}, not {bounds}"
    return None


def _bytes_problem(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return f"n_bytes must be a positive whole number, not {str(value)[:30]}"
    return None


def hold_lock(path: Path) -> IO[bytes] | None:
    """The run directory's lock held shared while compare reads it: one UserError when a
    `qeval run` holds it (it is writing results.json and the records, which may belong to two
    different runs until it finishes); None where there is no lock file."""
    lock = path / LOCK
    try:  # no link followed, no FIFO waited on: the lock is a regular file qeval made
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UserError(f"{lock}: cannot be read ({exc.strerror})") from None
    handle = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        handle.close()
        raise UserError(f"{lock}: not a regular file")
    try:
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = handle.read(32).decode("ascii", "replace").strip() or "unknown"
        handle.close()
        raise UserError(
            f"{path}: a qeval run (PID {pid}) is writing to it; compare it once that run has finished"
        ) from None
    return handle


def load_run(path: Path) -> LoadedRun:
    """The finished run in `path`, or one UserError saying why it is not one."""
    if not path.exists():
        raise UserError(f"{path}: not found")
    if not path.is_dir():
        raise UserError(f"{path}: not a directory (give a qeval run directory)")
    if (path / "sweep.json").is_file() and not (path / "results.json").exists():
        raise UserError(
            f"{path}: a sweep of several models: compare its models' run directories ({path}/models/<model>)"
        )
    if not (path / "results.json").exists():
        raise UserError(f"{path}: not a qeval run directory (no results.json)")
    lock = hold_lock(path)  # before results.json is read: a run started now is refused until compare ends
    results = read_results(path / "results.json")
    try:  # names from results.json become parts of paths under the run directory: held to the pattern
        for name in [s.name for s in results.setups]:
            check_name("setup", name)
        for name in [*results.tasks, *(m for members in results.groups.values() for m in members)]:
            check_name("task", name)
    except UserError as exc:
        raise UserError(f"{path / 'results.json'}: {exc}") from None
    return LoadedRun(path, results, RunStore(path), lock)


def load_runs(paths: list[Path]) -> list[LoadedRun]:
    """Every run `qeval compare` names, in the order given (the first is the reference)."""
    if len(paths) < 2:
        raise UserError("qeval compare needs at least two run directories (RUN_A RUN_B ...)")
    return [load_run(p) for p in paths]
