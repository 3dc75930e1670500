"""The multi_turn kind's entry: preflight generates the conversations under the model's chat
template (and resolves gates written at a turn) before any model loads; the worker generates
them again and checks they are the same documents, by fingerprint; assembly adds accuracy and
answer divergence by turn (results.py), the report its section (report.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qeval.errors import UserError
from qeval.tasks.kinds import Scoring, TaskKind, score_each
from qeval.tasks.multi_turn.report import SECTION
from qeval.tasks.multi_turn.results import attach_multi_turn
from qeval.tasks.multi_turn.spec import MultiTurnSpec
from qeval.tasks.multi_turn.tasks import NAME, build_tasks, resolve_gates, spec_of

if TYPE_CHECKING:
    from qeval.records.preflight import Preflight


def expand(pre: Preflight, model_config: dict[str, Any]) -> None:
    """Append the config's multi-turn tasks to `pre.tasks`; gates at a turn become gates on
    that turn's task (pre.cfg.gates)."""
    spec = spec_of(pre.cfg)
    gates = resolve_gates(pre.cfg.gates, spec)
    if spec is None:
        return
    tasks = build_tasks(pre.cfg, spec)
    clash = sorted({t.name for t in pre.tasks} & {t.name for t in tasks})
    if clash:
        raise UserError(f"task {clash[0]!r} is both a config task and a generated multi-turn one")
    pre.tasks += tasks
    pre.cfg = pre.cfg.model_copy(update={"gates": gates})


def score(ctx: Scoring, names: list[str]) -> None:
    """The pending turns' tasks, generated here; documents that differ from preflight's (another
    tokenizer or template in this environment) are refused rather than scored under the wrong key."""
    spec = spec_of(ctx.cfg)
    assert spec is not None
    tasks = {t.name: t for t in build_tasks(ctx.cfg, spec) if t.name in names}
    for name, task in tasks.items():
        if task.fingerprint != ctx.key_parts[name].get("task"):
            raise RuntimeError(
                f"multi-turn task {name}: the conversations generated in the worker differ from "
                "preflight's (a different tokenizer or chat template in this environment?)"
            )
    score_each(ctx, (tasks[n] for n in names))


KIND = TaskKind(name=NAME, expand=expand, score=score, results=attach_multi_turn, report=SECTION, spec=MultiTurnSpec)
