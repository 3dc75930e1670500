"""Tasks and scoring: qeval's own task YAMLs (native.py), lm-evaluation-harness tasks
(harness/), metric descriptors, scorers. Both kinds describe themselves alike (TaskInfoLike)."""

from __future__ import annotations

from typing import Protocol

from qeval.tasks.native import Task, TaskSpec, available_tasks, load_task

__all__ = ["Task", "TaskInfoLike", "TaskSpec", "available_tasks", "load_task"]


class TaskInfoLike(Protocol):
    """What the run, the keys and the assembly need of any task, native or lm-eval."""

    @property
    def name(self) -> str: ...

    @property
    def entry(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def output_type(self) -> str: ...

    @property
    def n_docs(self) -> int: ...

    @property
    def fingerprint(self) -> str: ...

    @property
    def sha256(self) -> str: ...

    @property
    def compared(self) -> str: ...

    @property
    def num_fewshot(self) -> int: ...
