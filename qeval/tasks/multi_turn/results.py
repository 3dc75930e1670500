"""The multi-turn block at assembly: per setup and question turn, the turn task's accuracy and
its comparison with the baseline (the ordinary one: paired by conversation, with the gate's
verdict), and, where `generation_divergence:` teacher-forced the baseline's answers, the KL and
top-1 agreement on the answer tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from qeval.results.multi_turn import MultiTurnInfo, TurnPoint
from qeval.results.schema import Results, SetupResult
from qeval.tasks.kinds import scored_tasks
from qeval.tasks.multi_turn.tasks import MultiTurnTask, spec_of

if TYPE_CHECKING:
    from qeval.records.preflight import Preflight
    from qeval.records.store import RunStore

SOURCE = (
    "Generated in memory by qeval/tasks/multi_turn (no download): a system message, facts (a few "
    "'My <thing> number is <n>.') in the first user turn, filler exchanges of generated prose, then a "
    "question about one fact, rendered with the model's chat template"
)


def attach_multi_turn(results: Results, pre: Preflight, store: RunStore) -> Results:
    """`results` with its multi-turn block, when the run generated multi-turn tasks."""
    spec = spec_of(pre.cfg)
    tasks = sorted(scored_tasks(pre, results, MultiTurnTask), key=lambda t: t.turn)
    if spec is None or not tasks:
        return results
    setups = {
        s.name: [_point(s, t, store) for t in tasks if t.name in s.tasks] for s in results.setups if s.status == "ok"
    }
    info = MultiTurnInfo(
        turns=[t.turn for t in tasks],
        tasks={str(t.turn): t.name for t in tasks},
        seed=spec.seed,
        samples=spec.samples,
        facts=spec.facts,
        filler_words=spec.filler_words,
        source=SOURCE,
        setups=setups,
    )
    return results.model_copy(update={"multi_turn": info})


def _point(s: SetupResult, task: MultiTurnTask, store: RunStore) -> TurnPoint:
    score = s.tasks[task.name].metrics.get("exact_match")
    p = TurnPoint(
        turn=task.turn,
        task=task.name,
        documents=len(task.docs),
        gap_tokens=float(np.mean([d["gap_tokens"] for d in task.docs])),
        accuracy=None if score is None else score.value,
    )
    c = s.vs_baseline.get(task.name)
    if c is not None and not s.baseline:
        p = p.model_copy(update={"delta": c.delta, "ci": c.ci, "p_value": c.p_value, "verdict": c.verdict})
    if not s.baseline:
        sums = [
            (b.tokens, b.kl, b.top1 or 0)
            for r in store.read_samples(s.name, task.name)
            if r.teacher_forced
            for b in r.teacher_forced.buckets
            if b.kl is not None
        ]
        tokens = sum(n for n, _, _ in sums)
        if tokens:
            p = p.model_copy(
                update={
                    "kl": sum(kl for _, kl, _ in sums) / tokens,
                    "top1_agreement": sum(top1 for _, _, top1 in sums) / tokens,
                }
            )
    return p
