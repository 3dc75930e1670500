"""The long_context kind's entry: preflight generates the tasks (and resolves gates written at a
length) before any model loads; the worker generates them again with the same tokenizer and
checks they are the same documents, by fingerprint; assembly adds the KV bytes and the loss by
token position at each length (results.py), and the report its section (report.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from qeval.errors import UserError
from qeval.tasks.kinds import Scoring, TaskKind, score_each
from qeval.tasks.long_context.report import SECTION
from qeval.tasks.long_context.results import attach_long_context
from qeval.tasks.long_context.tasks import LongContextTask, generated_tasks, plan, resolve_gates
from qeval.tasks.sequential import score_one

if TYPE_CHECKING:
    from qeval.config import RunConfig
    from qeval.records.preflight import Preflight


def expand(pre: Preflight, model_config: dict[str, Any]) -> None:
    """Append the config's long-context tasks to `pre.tasks`; gates on a family or at a length
    become gates on one generated task (pre.cfg.gates)."""
    cfg = pre.cfg
    if cfg.long_context is None:
        if any(g.length is not None for g in cfg.gates):
            raise UserError("a gate is written at a length, but the config has no long_context")
        return
    names = {t.name for t in pre.tasks}
    tasks = generated_tasks(cfg, model_config)
    clash = sorted(names & {t.name for t in tasks})
    if clash:
        raise UserError(f"task {clash[0]!r} is both a config task and a generated long-context one")
    pre.tasks += tasks
    pre.cfg = cfg.model_copy(update={"gates": resolve_gates(cfg.gates, cfg, plan(cfg, model_config))})


def model_config_of(path: str) -> dict[str, Any]:
    """config.json of the model (a folder, a GGUF file, or a hub id already cached)."""
    from qeval.model.source import gguf_config, is_gguf, read_model_config

    if is_gguf(path):
        return gguf_config(Path(path))
    if Path(path).is_dir():
        return read_model_config(Path(path))
    from transformers import AutoConfig

    return dict(AutoConfig.from_pretrained(path).to_dict())


def worker_tasks(cfg: RunConfig, wanted: dict[str, dict[str, str]]) -> dict[str, LongContextTask]:
    """The long-context tasks among `wanted` (task -> its key parts), generated here; a task
    whose documents differ from preflight's (another tokenizer in this environment) is refused
    rather than scored under the wrong key."""
    if cfg.long_context is None:
        return {}
    tasks = {t.name: t for t in generated_tasks(cfg, model_config_of(cfg.model.path)) if t.name in wanted}
    for name, task in tasks.items():
        if task.fingerprint != wanted[name].get("task"):
            raise RuntimeError(
                f"long-context task {name}: the documents generated in the worker differ from "
                "preflight's (a different tokenizer in this environment?)"
            )
    return tasks


def score(ctx: Scoring, names: list[str]) -> None:
    tasks = worker_tasks(ctx.cfg, {n: ctx.key_parts[n] for n in names})
    # a passkey or multikey task that is a sequential run's cell: in the run's order, until decided
    score_each(ctx, (tasks[n] for n in names), score_one)


KIND = TaskKind(name="long_context", expand=expand, score=score, results=attach_long_context, report=SECTION)
