"""The native kind's entry: qeval's own task YAMLs, named by the config's `tasks` and read from
its `tasks_dir`, scored document by document (qeval/tasks/scoring.py). The run's chat keys
apply to its multiple-choice and generation tasks (a perplexity task scores its text as it is)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from qeval.tasks.chat import ChatResolver, task_chat
from qeval.tasks.kinds import Scoring, TaskKind, check_generation_room, score_each
from qeval.tasks.native.tasks import Task, load_task
from qeval.tasks.sampling import model_card, task_sampling
from qeval.tasks.sequential import score_one

if TYPE_CHECKING:
    from qeval.config import RunConfig
    from qeval.records.preflight import Preflight


def _load(cfg: RunConfig, names: list[str]) -> list[Task]:
    """The tasks, each with the run's chat settings where it prompts (the tokenizer is loaded
    once, and only when a template is asked for)."""
    resolver = ChatResolver(cfg.model)
    tasks = []
    for name in names:
        task = load_task(name, Path(cfg.tasks_dir), cfg.limit)
        if task.output_type in ("multiple_choice", "generate_until"):
            task.chat = task_chat(resolver, cfg, None, f"task {name}")
        if task.output_type == "generate_until":
            task.think_end_token = cfg.think_end_token
        tasks.append(task)
    return tasks


def expand(pre: Preflight, model_config: dict[str, Any]) -> None:
    """Load each of the config's own tasks (checksums verified) before any model loads."""
    cfg = pre.cfg
    for task in _load(cfg, cfg.tasks):
        check_generation_room(cfg, task.name, task.output_type, task.spec.generation_kwargs.max_gen_toks)
        _with_card(cfg, task)  # from_model_card without sampling keys in the card: refused here
        pre.tasks.append(task)


def _with_card(cfg: RunConfig, task: Task) -> Task:
    """The task with the model card's sampling keys, where it samples `from_model_card`."""
    if task.spec.generation_kwargs.from_model_card:
        task.model_card = model_card(cfg)
        task_sampling(task.spec, task.model_card)
    return task


def score(ctx: Scoring, names: list[str]) -> None:
    cfg = ctx.cfg
    score_each(ctx, (_with_card(cfg, t) for t in _load(cfg, names)), score_one)


def fingerprint(cfg: RunConfig, name: str) -> str:
    return load_task(name, Path(cfg.tasks_dir), cfg.limit).fingerprint


KIND = TaskKind(name="native", expand=expand, score=score, fingerprint=fingerprint)
