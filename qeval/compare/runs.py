"""The run directories `qeval compare` reads: each checked to be a finished qeval run, read
through the one results reader and the run store (whose paths stay inside the directory)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qeval.errors import UserError
from qeval.files.names import check_name
from qeval.records.store import RunStore
from qeval.results.schema import Results, read_results


@dataclass
class LoadedRun:
    """One finished run: where it is, its results, its store of per-document records."""

    path: Path
    results: Results
    store: RunStore

    @property
    def label(self) -> str:
        """How tables name the run: its folder and when it finished."""
        when = self.results.run.finished or self.results.run.started or "time unknown"
        return f"{self.path.name} ({when})"

    @property
    def when(self) -> str:
        return self.results.run.finished or self.results.run.started or ""

    def records(self, setup: str, task: str) -> list[dict[str, Any]]:
        """A (setup, task)'s per-document records; an lm-eval group's are its members', each id
        prefixed with its task (ids are unique within a task only)."""
        members = self.results.groups.get(task)
        if self.results.tasks[task].is_group and members:
            return [r | {"sample_id": f"{m}/{r.get('sample_id')}"} for m in members
                    for r in self.store.read_samples(setup, m)]
        return self.store.read_samples(setup, task)


def load_run(path: Path) -> LoadedRun:
    """The finished run in `path`, or one UserError saying why it is not one."""
    if not path.exists():
        raise UserError(f"{path}: not found")
    if not path.is_dir():
        raise UserError(f"{path}: not a directory (give a qeval run directory)")
    if (path / "sweep.json").is_file() and not (path / "results.json").exists():
        raise UserError(f"{path}: a sweep of several models: compare its models' run directories "
                        f"({path}/models/<model>)")
    if not (path / "results.json").exists():
        raise UserError(f"{path}: not a qeval run directory (no results.json)")
    results = read_results(path / "results.json")
    try:  # names from results.json become parts of paths under the run directory: held to the pattern
        for name in [s.name for s in results.setups]:
            check_name("setup", name)
        for name in [*results.tasks, *(m for members in results.groups.values() for m in members)]:
            check_name("task", name)
    except UserError as exc:
        raise UserError(f"{path / 'results.json'}: {exc}") from None
    return LoadedRun(path, results, RunStore(path))


def load_runs(paths: list[Path]) -> list[LoadedRun]:
    """Every run `qeval compare` names, in the order given (the first is the reference)."""
    if len(paths) < 2:
        raise UserError("qeval compare needs at least two run directories (RUN_A RUN_B ...)")
    return [load_run(p) for p in paths]
