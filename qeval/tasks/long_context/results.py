"""Long-context results: each setup's KV bytes at each length and its loss by token
position paired with the baseline's, bucket by bucket, from the stored records
(qeval/tasks/long_context/buckets.py). The per-length task comparisons are ordinary ones."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from qeval.results.long_context import LengthPoint, LongContextInfo, PositionBucket, SetupLongContext
from qeval.results.samples import SampleRecord
from qeval.results.schema import Results, SetupResult
from qeval.tasks.kinds import scored_tasks
from qeval.tasks.long_context.buckets import compared_bucket
from qeval.tasks.long_context.tasks import LongContextTask

if TYPE_CHECKING:
    from qeval.records.preflight import Preflight
    from qeval.records.store import RunStore

SOURCE = (
    "Generated in memory by qeval/tasks/long_context (no download): passkey prompts after Mohtashami & Jaggi "
    "(2023), RULER-style multi-key needles (Hsieh et al. 2024) in generated prose, and generated prose "
    "for perplexity by position; each sized with the model's tokenizer"
)


def attach_long_context(results: Results, pre: Preflight, store: RunStore) -> Results:
    """`results` with its long-context blocks, when the run generated long-context tasks."""
    tasks = scored_tasks(pre, results, LongContextTask)
    spec = pre.cfg.long_context
    if not tasks or spec is None:
        return results
    lengths = sorted({t.length for t in tasks})
    families: dict[str, dict[str, str]] = {}
    for t in tasks:
        families.setdefault(t.family, {})[str(t.length)] = t.name
    edges = max((t.buckets for t in tasks), key=len, default=[])
    info = LongContextInfo(
        lengths=lengths,
        deployment_length=next(t.length for t in tasks if t.deployment),
        families=families,
        seed=spec.seed,
        samples=spec.samples,
        depths=spec.depths,
        bucket_edges=edges,
        source=SOURCE,
    )
    base = results.baseline
    setups = [
        s.model_copy(update={"long_context": _setup_block(s, base, tasks, lengths, store, pre.cfg.seed)})
        for s in results.setups
    ]
    return results.model_copy(update={"long_context": info, "setups": setups})


def _setup_block(
    s: SetupResult,
    base: SetupResult | None,
    tasks: list[LongContextTask],
    lengths: list[int],
    store: RunStore,
    seed: int,
) -> SetupLongContext:
    kv = s.memory.kv_bytes_per_token
    per_token, source = (kv.measured, "measured") if kv.measured else (kv.predicted, "predicted")
    points = []
    for length in lengths:
        here = {t.family: t.name for t in tasks if t.length == length and t.name in s.tasks}
        ppl = here.get("position_ppl")
        buckets = []
        if ppl and s.status == "ok":
            paired = base is not None and not s.baseline and base.status == "ok" and ppl in base.tasks
            buckets = position_buckets(
                store.read_samples(s.name, ppl), store.read_samples(base.name, ppl) if paired and base else None, seed
            )
        points.append(
            LengthPoint(
                length=length,
                kv_bytes=int(per_token * length) if per_token else None,
                kv_source=source if per_token else "",
                tasks=here,
                buckets=buckets,
            )
        )
    return SetupLongContext(lengths=points)


def position_buckets(
    records: list[SampleRecord], baseline: list[SampleRecord] | None, seed: int
) -> list[PositionBucket]:
    """Loss by position bucket over a length's documents; with the baseline's records, paired
    by document: the difference of the token-weighted mean NLL with a t-interval over
    documents (stats.paired_ratio), and the KL and top-1 agreement the setup's records carry."""
    mine = {r.sample_id: r.buckets for r in records if r.buckets}
    theirs = {r.sample_id: r.buckets for r in baseline or [] if r.buckets}
    ids = [i for i in mine if i in theirs] if baseline is not None else list(mine)
    if not ids:
        return []
    out = []
    for k in range(len(mine[ids[0]])):
        docs = [i for i in ids if mine[i][k].tokens > 0]
        if not docs:
            continue
        nll = np.array([mine[i][k].nll for i in docs])
        base_nll = np.array([theirs[i][k].nll for i in docs]) if baseline is not None else None
        out.append(compared_bucket(PositionBucket, [mine[i][k] for i in docs], nll, base_nll, seed))
    return out
