"""Task kinds and scoring: the registry (kinds.py) and one folder per kind, native/ (qeval's own
task YAMLs), lm_eval/ (lm-evaluation-harness tasks) and long_context/ (generated long-context
tasks); the scorers (scoring.py) and the template sandbox (templates.py). Every task describes
itself alike (records.preflight.TaskInfoLike)."""

from __future__ import annotations

from qeval.records.preflight import TaskInfoLike
from qeval.tasks.native import Task, TaskSpec, available_tasks, load_task

__all__ = ["Task", "TaskInfoLike", "TaskSpec", "available_tasks", "load_task"]
