"""The generation entry of the task-kind registry: no tasks of its own. Preflight checks the
gates written at a generated position (`{task: gsm8k, position: 64, max_drop: 0.05}`) against
`generation_divergence:` and the run's generation tasks; assembly adds the divergence along
the generation of every generation task (results.py), the report its section (report.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qeval.errors import UserError
from qeval.tasks.generation.report import SECTION
from qeval.tasks.generation.results import attach_generation
from qeval.tasks.kinds import Scoring, TaskKind

if TYPE_CHECKING:
    from qeval.records.preflight import Preflight


def expand(pre: Preflight, model_config: dict[str, Any]) -> None:
    """Gates at a position: generation_divergence set, the task a generation task of the run,
    the position one of the bucket edges."""
    spec = pre.cfg.generation_divergence
    kinds = {t.name: t.output_type for t in pre.tasks}
    for gate in pre.cfg.gates:
        if gate.position is None:
            continue
        if spec is None:
            raise UserError(
                f"a gate is written at generated position {gate.position}, but the config has no generation_divergence"
            )
        if kinds.get(gate.task) != "generate_until":
            raise UserError(f"gate at position {gate.position}: {gate.task!r} is not a generation task of this run")
        if gate.position not in spec.position_buckets:
            raise UserError(
                f"gate at position {gate.position}: not one of generation_divergence.position_buckets "
                f"{spec.position_buckets}"
            )


def score(ctx: Scoring, names: list[str]) -> None:
    raise AssertionError(f"the generation kind has no tasks to score ({names})")


KIND = TaskKind(name="generation", expand=expand, score=score, results=attach_generation, report=SECTION)
