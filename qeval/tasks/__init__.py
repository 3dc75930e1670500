"""Tasks and scoring: qeval's own task YAMLs (native.py), metric descriptors, scorers."""

from qeval.tasks.native import Task, TaskSpec, available_tasks, load_task

__all__ = ["Task", "TaskSpec", "available_tasks", "load_task"]
