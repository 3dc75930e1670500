"""Tasks and scoring: qeval's own task YAMLs (native.py), lm-evaluation-harness tasks
(harness/), metric descriptors, scorers. Both kinds describe themselves alike (TaskInfoLike)."""

from __future__ import annotations

from qeval.records.preflight import TaskInfoLike
from qeval.tasks.native import Task, TaskSpec, available_tasks, load_task

__all__ = ["Task", "TaskInfoLike", "TaskSpec", "available_tasks", "load_task"]
