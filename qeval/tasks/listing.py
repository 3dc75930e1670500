"""`qeval tasks`: qeval's own tasks (kind, samples, data checksum), the lm-eval tasks and groups of
the include folders, the suites, and on request the size of lm-eval's own task library."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table


def task_table(tasks_dir: Path, lm_eval: list[Path] | None) -> Table:
    """Every task qeval can run from `tasks_dir` and the lm-eval folders (default: the fixtures,
    and the full sets where `make lm-eval-full` wrote them), and the suites; UserError (one line)
    for a task file that cannot be read."""
    from qeval.config.lm_eval import SUITES
    from qeval.tasks import available_tasks, load_task
    from qeval.tasks.lm_eval.yamls import local_names

    table = Table("task", "kind", "samples", "sha256 / source")
    for name in available_tasks(tasks_dir):
        t = load_task(name, tasks_dir)
        table.add_row(escape(name), escape(t.spec.output_type), str(len(t.docs)), t.sha256[:16] + "…")
    folders = (
        lm_eval
        if lm_eval is not None
        else [p for p in [tasks_dir / "lm_eval", tasks_dir / "lm_eval_full"] if p.is_dir()]
    )
    for folder in folders:
        for name, (kind, path) in local_names(folder).items():
            table.add_row(escape(name), f"lm-eval {kind}", "", escape(str(path)))
    for suite, members in SUITES.items():
        table.add_row(suite, "suite", "", escape(", ".join(f"{t.name} ({t.num_fewshot}-shot)" for t in members)))
    return table


def library_line() -> str:
    """lm-eval's own task library in one line (its index takes about 10 s)."""
    from lm_eval.tasks import TaskManager

    manager = TaskManager()
    return (
        f"lm-eval's library: {len(manager.all_subtasks)} tasks, {len(manager.all_groups)} groups, e.g. "
        + ", ".join(sorted(manager.all_groups)[:20])
        + " …"
    )
