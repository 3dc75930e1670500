"""The divergence-along-the-generation block at assembly: each setup's generation tasks paired
with the baseline's document by document, position bucket by position bucket (from the
`teacher_forced` sums teacher.py put in the records), and by the baseline's answer length."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from qeval.analysis.stats import paired_accuracy, paired_mean, small_sample_reason, verdict
from qeval.results.generation import (
    AnswerLengthBucket,
    GeneratedPositionBucket,
    GenerationDivergence,
    TaskGeneration,
)
from qeval.results.samples import GeneratedPositionSums, SampleRecord
from qeval.results.schema import Results
from qeval.tasks.long_context.buckets import compared_bucket

if TYPE_CHECKING:
    from qeval.records.preflight import Preflight
    from qeval.records.store import RunStore


def attach_generation(results: Results, pre: Preflight, store: RunStore) -> Results:
    """`results` with its `generation_divergence` block, when the config sets one."""
    spec = pre.cfg.generation_divergence
    base = results.baseline
    if spec is None or base is None or base.status != "ok":
        return results
    tasks = [t.name for t in pre.tasks if t.output_type == "generate_until" and t.name in base.tasks]
    if not tasks:
        return results
    seed = pre.cfg.seed
    theirs = {t: store.read_samples(base.name, t) for t in tasks}
    setups: dict[str, dict[str, TaskGeneration]] = {}
    for s in results.setups:
        if s.status != "ok":
            continue
        here = {}
        for t in tasks:
            if t not in s.tasks:
                continue
            mine = theirs[t] if s.baseline else store.read_samples(s.name, t)
            paired = None if s.baseline else theirs[t]
            gates = {g.position: g.max_drop for g in pre.cfg.gates if g.task == t and g.position is not None}
            here[t] = TaskGeneration(
                positions=judged(position_table(mine, paired, seed), gates),
                answer_lengths=length_table(mine, theirs[t], spec.length_buckets, not s.baseline, seed),
            )
        setups[s.name] = here
    block = GenerationDivergence(
        position_buckets=spec.position_buckets, length_buckets=spec.length_buckets, tasks=tasks, setups=setups
    )
    return results.model_copy(update={"generation_divergence": block})


def _sums(records: list[SampleRecord]) -> dict[str, list[GeneratedPositionSums]]:
    return {r.sample_id: r.teacher_forced.buckets for r in records if r.teacher_forced}


def position_table(
    records: list[SampleRecord], baseline: list[SampleRecord] | None, seed: int
) -> list[GeneratedPositionBucket]:
    """Per position bucket: the documents that reach it (with the baseline's: those both scored),
    the mean NLL of the baseline's generated tokens, and against the baseline the paired
    difference (stats.paired_ratio, as long-context position buckets), KL and top-1 agreement."""
    mine = _sums(records)
    theirs = _sums(baseline) if baseline is not None else {}
    ids = [i for i in mine if i in theirs] if baseline is not None else list(mine)
    depth = max((len(mine[i]) for i in ids), default=0)
    out = []
    for k in range(depth):
        docs = [i for i in ids if len(mine[i]) > k and (baseline is None or len(theirs[i]) > k)]
        if not docs:
            continue
        nll = -np.array([mine[i][k].logprob for i in docs])
        base_nll = -np.array([theirs[i][k].logprob for i in docs]) if baseline is not None else None
        out.append(compared_bucket(GeneratedPositionBucket, [mine[i][k] for i in docs], nll, base_nll, seed))
    return out


def judged(buckets: list[GeneratedPositionBucket], gates: dict[int, float | None]) -> list[GeneratedPositionBucket]:
    """Each bucket a gate names (its lower edge -> max_drop, nats per token) with the gate's
    verdict: non-inferiority on the paired interval of Δ NLL (stats.verdict, lower is better),
    inconclusive on fewer documents than a verdict needs (stats.MIN_PAIRED_N)."""
    out = []
    for b in buckets:
        margin = gates.get(b.start)
        if margin is not None and b.ci is not None:
            reason = small_sample_reason(b.documents)
            b = b.model_copy(
                update={
                    "max_drop": margin,
                    "verdict": "inconclusive" if reason else verdict(b.ci, False, margin),
                    "verdict_reason": reason,
                }
            )
        out.append(b)
    return out


def length_table(
    records: list[SampleRecord], baseline: list[SampleRecord], edges: list[int], compare: bool, seed: int
) -> list[AnswerLengthBucket]:
    """Accuracy by answer length: documents bucketed by the length of the baseline's generation
    (its teacher-forced tokens), this setup's accuracy on each bucket and, `compare`, the paired
    difference with the baseline's (Newcombe's interval and McNemar's test on right/wrong; a
    t-interval and Wilcoxon's test on a sampled task's shares)."""
    length = {r.sample_id: r.teacher_forced.tokens for r in baseline if r.teacher_forced}
    base_ok = {r.sample_id: r.correct for r in baseline}
    mine_ok = {r.sample_id: r.correct for r in records}
    ids = [
        i
        for i in length
        if isinstance(mine_ok.get(i), (bool, int, float)) and isinstance(base_ok.get(i), (bool, int, float))
    ]
    out = []
    for k, lo in enumerate(edges):
        hi = edges[k + 1] if k + 1 < len(edges) else None
        docs = [i for i in ids if length[i] >= lo and (hi is None or length[i] < hi)]
        if not docs:
            continue
        mine = np.array([float(mine_ok[i]) for i in docs])  # type: ignore[arg-type]
        b = AnswerLengthBucket(start=lo, end=hi, documents=len(docs), accuracy=float(mine.mean()))
        if compare:
            theirs = np.array([float(base_ok[i]) for i in docs])  # type: ignore[arg-type]
            binary = np.isin(mine, (0, 1)).all() and np.isin(theirs, (0, 1)).all()
            cmp = (paired_accuracy if binary else paired_mean)(theirs, mine, "accuracy", seed)
            b = b.model_copy(
                update={
                    "baseline_accuracy": float(theirs.mean()),
                    "delta": cmp.delta,
                    "ci": cmp.ci,
                    "p_value": cmp.p_value,
                }
            )
        out.append(b)
    return out
