"""A qeval-form task (native: multiple choice or generation; long-context: passkey, multikey)
scored in a sequential run's order (issue 42; docs/statistics.md, "Sequential gates"): its
documents in the run's seeded random order, cut at the cap, a chunk at a time, up to the pass's
horizon (qeval/run/passes.py); after each chunk a setup other than the baseline asks the monitor
whether the task's gate is decided, and stops there. The baseline scores as far as the pass's
horizon.

The same scoring as `score_task` on each chunk (qeval/tasks/scoring.py), so a record is what a
whole-task run writes for that document; the task's metrics are then computed over the records
scored. A multiple-choice task's KL reference is the baseline's top-k in the same order, sliced
to the chunk's requests. A task killed mid-way is scored again from its first chunk on resume (the
same order, so the same stop): these tasks are small. One stored at a pass's horizon carries on in
the next pass from its stored records (and top-k), and, scored against a KL reference, from the
per-token divergence saved in the setup's scratch folder at that horizon (the store keeps only its
summary); where either is missing, the cell is scored again from its first document."""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from qeval.analysis.sequential_run import Monitor, task_order
from qeval.records.keys import key_of
from qeval.records.spool import discard_state, load_state, save_state
from qeval.tasks.divergence import TokenDivergence, concat_topk
from qeval.tasks.scoring import TaskResult, record_metrics, score_task

if TYPE_CHECKING:
    from qeval.backends.base import Progress
    from qeval.results.samples import SampleRecord
    from qeval.tasks import Task
    from qeval.tasks.kinds import Scoring


def score_one(ctx: Scoring, task: Task, progress: Progress) -> TaskResult:
    """A sequential run's cell in the run's order, stopped when decided; any other task whole (the
    scorer the native and long-context kinds hand `score_each`)."""
    if is_sequential(ctx, task):
        return score_in_order(ctx, task, progress)
    return score_task(ctx.backend, task, progress, ctx.reference(task.name))


def is_sequential(ctx: Scoring, task: Task) -> bool:
    """Whether `task` is one of the run's sequential cells (its plan names it)."""
    return ctx.sequential is not None and task.name in ctx.sequential.tasks


def _slice_reference(ref: dict[str, np.ndarray] | None, start: int, stop: int) -> dict[str, np.ndarray] | None:
    """The baseline's top-k of requests [start, stop) as a pack of its own (None where the
    reference holds fewer requests: no KL, never a wrong one)."""
    if ref is None or len(ref["offsets"]) < stop + 1:
        return None
    o = ref["offsets"]
    lo, hi = int(o[start]), int(o[stop])
    return {"offsets": o[start : stop + 1] - lo} | {k: v[lo:hi] for k, v in ref.items() if k != "offsets"}


def _requests_per_doc(task: Task, docs: list[dict[str, Any]]) -> list[int]:
    """What the reference holds per document: a multiple-choice document's choices; 0 otherwise
    (generation tasks take no reference)."""
    if task.spec.output_type == "multiple_choice":
        return [len(task.choices(d)) for d in docs]
    return [0] * len(docs)


def _state_name(task: Task) -> str:
    """The scratch state (qeval/records/spool.py) of a cell's per-token divergence at a pass's
    horizon: the store keeps only its summary, and a later pass carries the distribution on."""
    return f"native.{task.name}"


def _key(ctx: Scoring, task: Task) -> str | None:
    parts = ctx.key_parts.get(task.name)
    return key_of(parts) if parts is not None else None


def _carried(
    ctx: Scoring, task: Task, ids: list[str], counts: list[int], tokens: TokenDivergence | None
) -> tuple[list[SampleRecord], list[dict[str, np.ndarray]]]:
    """What an earlier pass stored of this cell under the job's key (records and top-k), where the
    scoring can carry on from it: a prefix of the order ending at a look; scored against a KL
    reference (`tokens` given), also the per-token divergence that pass saved in the scratch folder
    for those records (restored into `tokens`). Else nothing: the cell is scored from its first
    document (the same records)."""
    got = ctx.stored(task.name)
    if got is None:
        return [], []
    records, topk = got
    n, chunk = len(records), ctx.sequential.chunk_docs if ctx.sequential else 0
    if not n or not chunk or n % chunk or [r.sample_id for r in records] != ids[:n]:
        return [], []
    if ctx.keeps_topk and task.spec.output_type == "multiple_choice":  # the others' KL reference: whole
        if not topk or len(topk["offsets"]) != sum(counts[:n]) + 1:
            return [], []
    if tokens is not None:
        saved = load_state(ctx.scratch, _state_name(task)) if ctx.scratch is not None else None
        meta = saved[0] if saved is not None else {}
        if saved is None or meta.get("key") != _key(ctx, task) or meta.get("n") != n:
            return [], []
        tokens.restore(dict(saved[1]), bool(meta.get("dp_missing")))
    print(
        f"{ctx.setup.name}: {task.name}: carrying on from document {n} (scored by an earlier pass)",
        file=sys.stderr,
        flush=True,
    )
    return records, [topk] if topk else []


def score_in_order(ctx: Scoring, task: Task, progress: Progress) -> TaskResult:
    """Score `task` chunk by chunk in the run's order, stopping where its cell is decided (a setup
    other than the baseline), at the pass's horizon, or at the cap."""
    plan = ctx.sequential
    assert plan is not None
    ids, order = task_order(plan, task)
    docs = [task.docs[i] for i in order]
    counts = _requests_per_doc(task, docs)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    reference = ctx.reference(task.name)
    monitor = None
    if ctx.baseline_records is not None:  # the baseline scores to the horizon: the others test against it
        monitor = Monitor(plan, {task.name: ids}, {task.name: ctx.baseline_records(task.name)})
    tokens = TokenDivergence()
    chunk = plan.chunk_docs
    records, packs = _carried(ctx, task, ids, counts, tokens if reference is not None else None)
    # a pass's horizon (qeval/run/passes.py): no further this pass; the next carries on from here
    end = min(len(docs), plan.horizon or len(docs))
    decided = monitor is not None and bool(records) and monitor.add(task.name, list(records))  # replayed
    if decided:
        end = len(records)  # decided already (not pending in a run: a direct call)
    for first in range(len(records), end, chunk):
        last = min(first + chunk, end)
        part = replace(task, docs=docs[first:last])
        ref = _slice_reference(reference, int(starts[first]), int(starts[last]))
        result = score_task(ctx.backend, part, progress, ref, tokens)
        got = list(result.records)
        for record, sample_id in zip(got, ids[first:last], strict=True):
            record.sample_id = sample_id  # the document's own id, not its place in the chunk
        records += got
        if isinstance(result.topk, dict) and result.topk:
            packs.append(result.topk)
        if monitor is not None and monitor.add(task.name, got):
            decided = True
            break
    if ctx.scratch is not None and reference is not None and (key := _key(ctx, task)) is not None:
        if not decided and len(records) < len(docs):  # stopped at the horizon: a later pass carries on
            meta = {"key": key, "n": len(records), "dp_missing": tokens.dp_missing}
            save_state(ctx.scratch, _state_name(task), meta, tokens.arrays(), [])
        else:
            discard_state(ctx.scratch, _state_name(task))
    keep = set(task.metrics) | {"kl_to_baseline", "top1_agreement"}
    sampled = bool(records) and records[0].pass_at_k is not None
    metrics = record_metrics(task.spec.output_type, records, sampled)
    return TaskResult(
        records, {k: v for k, v in metrics.items() if k in keep}, concat_topk(packs) if packs else {}, tokens.summary()
    )
