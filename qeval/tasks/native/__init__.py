"""The native task kind: qeval's own task YAMLs in `tasks_dir` (tasks.py), and their entry in
the task-kind registry (kind.py)."""

from qeval.tasks.native.tasks import GenerationKwargs, Task, TaskSpec, available_tasks, load_task

__all__ = ["GenerationKwargs", "Task", "TaskSpec", "available_tasks", "load_task"]
