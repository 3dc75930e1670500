"""The lm_eval kind's entry: lm-evaluation-harness tasks, groups and suites (`lm_eval:` in the
config), loaded through lm-eval's own TaskManager and scored through lm-eval's `evaluate()`
(all of a setup's pending tasks together, chunk by chunk of documents)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qeval.analysis.sequential_run import Monitor, cell_units, leaf_chunks, pass_horizons
from qeval.config.chat import merge_think_end
from qeval.records.keys import key_of
from qeval.tasks.chat import ChatResolver, task_chat
from qeval.tasks.kinds import Scoring, TaskKind, check_generation_room
from qeval.tasks.lm_eval.scoring import leaf_requests, score_lm_eval
from qeval.tasks.lm_eval.session import ChatFor, LmEvalSession, open_session

if TYPE_CHECKING:
    from qeval.config import RunConfig
    from qeval.records.preflight import Preflight


def chat_for(cfg: RunConfig) -> ChatFor:
    """Each lm-eval entry's chat settings: its own keys over the run's, resolved against the
    model's tokenizer (loaded once, and only if some entry asks for a template)."""
    resolver = ChatResolver(cfg.model)
    return lambda entry: task_chat(resolver, cfg, entry, f"lm-eval task {entry.name}")


def _session(cfg: RunConfig) -> LmEvalSession:
    assert cfg.lm_eval is not None
    return open_session(cfg.lm_eval, Path.cwd(), cfg.limit, chat_for(cfg), lambda e: merge_think_end(cfg, e))


def expand(pre: Preflight, model_config: dict[str, Any]) -> None:
    """Load the lm-eval tasks once here (names, data, few-shot pools): a typo costs seconds."""
    spec = pre.cfg.lm_eval
    if spec is None:
        return
    session = _session(pre.cfg)
    try:
        for name, info in session.infos.items():
            max_gen = (session.tasks[name].config.generation_kwargs or {}).get("max_gen_toks", 256)
            check_generation_room(pre.cfg, name, info.output_type, int(max_gen))
            pre.tasks.append(info)
        pre.groups = session.groups
        pre.suites = spec.suite_members()
    finally:
        session.close()


def score(ctx: Scoring, names: list[str]) -> None:
    """The setup's pending lm-eval tasks through lm-eval's evaluate(), all of them in each call
    (one batched backend call per request type and chunk of documents)."""
    assert ctx.cfg.lm_eval is not None
    session = _session(ctx.cfg)
    # the baseline's top-k, read from its file chunk by chunk: never held whole
    refs = {n: ref for n in names if (ref := ctx.open_reference(n)) is not None}
    try:
        t0 = time.time()
        label = f"{ctx.setup.name}: {len(names)} lm-eval tasks"
        seq = ctx.sequential
        order = leaf_chunks(seq, {n: session.infos[n].n_docs for n in names}) if seq is not None else None
        stop = None
        if seq is not None and ctx.baseline_records is not None:  # the baseline scores up to the cap
            stop = Monitor.for_leaves(seq, names, ctx.baseline_records).chunk
        counts = leaf_requests(session, names, order)
        with ctx.progress(label, sum(counts.values())) as bar:
            # under the tasks' resume keys: a worker killed mid-task carries on from its last chunk
            keys = {n: key_of(ctx.key_parts[n]) for n in names if n in ctx.key_parts}
            chunk = ctx.sequential.chunk_docs if ctx.sequential else ctx.cfg.lm_eval.chunk_docs
            results = score_lm_eval(
                ctx.backend,
                session,
                names,
                bar.advance,
                refs,
                chunk_docs=chunk,
                scratch=ctx.scratch,
                keep_topk=ctx.keeps_topk,
                requests=counts,
                resume_keys=keys,
                order=order,
                stop=stop,
                # a sequential run's pass: its sequential tasks score up to the horizon (qeval/run/passes.py)
                until=pass_horizons(ctx.sequential, names),
                together=cell_units(seq, names),
            )
        seconds = round((time.time() - t0) / len(names), 2)  # the tasks were scored together: their time shared out
        for name, result in results.items():
            ctx.store(name, result, seconds, session.infos[name].sha256)
    finally:
        for ref in refs.values():
            ref.close()
        session.close()


KIND = TaskKind(name="lm_eval", expand=expand, score=score)
