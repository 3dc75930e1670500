"""lm-eval tasks scored by a qeval backend: an `lm_eval.api.model.LM` over the backend,
`lm_eval.evaluator.evaluate` calls each over all of a setup's pending tasks (so each request
type is one batched backend call a chunk), and lm-eval's logged samples turned into qeval's per-document
records (lm-eval's doc id, its metric values, log-likelihoods, generation).

Chat templates go through lm-eval's own arguments (`apply_chat_template`, `system_instruction`,
`fewshot_as_multiturn`) and `LM.apply_chat_template`, so lm-eval builds the prompts exactly as
`simple_evaluate(..., apply_chat_template=True)` does with `HFLM`: one `evaluate()` call per set
of chat settings among the leaves and chunk of documents.

Documents go through `evaluate()` in chunks of CHUNK_DOCS (lm-eval's `samples=` ids), so that
lm-eval's `Instance`s, its logged samples and the backend's per-request results (the top-k at
every scored token) are held for one chunk, not for the whole task: the worker's memory no
longer grows with those. The few-shot sampler is seeded once per task, never between chunks, so
each document gets the few-shot examples one call over every document would give it; metrics
are aggregated at the end with lm-eval's own `_compute_task_aggregations` over every chunk's
per-document values, which is what `evaluate()` does inside itself."""

from __future__ import annotations

import itertools
import json
import math
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qeval.backends.base import (
    Backend,
    GenerateRequest,
    LoglikelihoodRequest,
    Progress,
    RollingRequest,
    generated_tokens,
)
from qeval.config.chat import strip_thinking
from qeval.memory.heap import release_free_memory
from qeval.records.spool import RecordSpool, TopkReader, TopkSpool
from qeval.results.metrics import KL_OUTPUT_TYPES
from qeval.results.samples import SampleRecord, read_record
from qeval.tasks.chat import Chat
from qeval.tasks.divergence import (
    Reference,
    TokenDivergence,
    concat_topk,
    continuation_divergence,
    document_divergence,
    pack_topk,
    request_references,
    split_reference,
)
from qeval.tasks.lm_eval import resume
from qeval.tasks.lm_eval.session import LmEvalSession
from qeval.tasks.scoring import TaskResult

#: documents per lm-eval `evaluate()` call: what the worker holds at once (about 100 KB a
#: HellaSwag document: lm-eval's Instances and samples, the backend's top-k per scored token)
CHUNK_DOCS = 1000


def make_lm(
    backend: Backend, references: _References, progress: Progress, think: dict[str, str | None] | None = None
) -> Any:
    """The LM lm-eval calls; built lazily so that importing this module needs no lm-eval.
    `references` hands out each request's baseline reference (the KL reference), chunk by chunk.
    `think`: task -> its think_end_token (the reasoning block is stripped before lm-eval's
    filters and metrics see the text, as HFLM's `think_end_token` does)."""
    from lm_eval.api.model import LM

    class QevalLM(_LMMethods, LM):
        """lm-eval calls each method once with every request of every task of the call."""

    return QevalLM(backend, references, progress, think)


class _LMMethods:
    """The methods of make_lm's LM (lm-eval's base class comes in there, imported as needed):
    lm-eval calls each method once with every request of every task of the call."""

    def __init__(
        self, backend: Backend, references: _References, progress: Progress, think: dict[str, str | None] | None
    ) -> None:
        super().__init__()
        self.backend, self.references, self.progress, self.think = backend, references, progress, think
        #: the chat settings of the evaluate() call in progress (lm-eval asks the LM to render)
        self.chat: Chat | None = None
        #: the chunk in progress: task -> its document ids, ascending. With `samples=`, lm-eval
        #: numbers a chunk's requests from 0 in the set's order (its logged samples carry the true ids)
        self.chunk_ids: dict[str, list[int]] = {}
        #: the backend's own result per request, keyed (task, doc_id, idx) with the true doc
        #: id: token counts and the top-k that lm-eval's return types drop (one chunk's worth)
        self.raw: dict[tuple[str, int, int], Any] = {}
        #: the baseline's reference per request of the chunk in progress, same keys
        self.refs: dict[tuple[str, int, int], Reference] = {}

    @property
    def tokenizer_name(self) -> str:
        """Only lm-eval's request cache reads it (qeval runs without that cache)."""
        return "qeval"

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """HFLM.apply_chat_template over the model's tokenizer (qeval/tasks/chat.py)."""
        assert self.chat is not None and self.chat.template is not None
        return self.chat.apply(chat_history, add_generation_prompt)

    def _key(self, r: Any) -> tuple[str, int, int]:
        return (r.task_name, self.chunk_ids[r.task_name][r.doc_id], r.idx)

    def _keep(self, requests: list[Any], results: list[Any]) -> None:
        for r, res in zip(requests, results, strict=True):
            self.raw[self._key(r)] = res

    def _ref_ids(self, requests: list[Any]) -> list[np.ndarray | None]:
        """Per request, the baseline's top-k ids at its scored tokens (None: no reference).
        Each task's requests of the chunk take the next references in (document, choice) order."""
        by_task: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
        for r in requests:
            by_task[r.task_name].append(self._key(r))
        for task, keys in by_task.items():
            keys.sort()
            taken = self.references.take(task, len(keys))
            if taken is not None:
                self.refs.update(zip(keys, taken, strict=True))
        return [ref[0] if (ref := self.refs.get(self._key(r))) is not None else None for r in requests]

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        ids = self._ref_ids(requests)
        res = self.backend.loglikelihood(
            [LoglikelihoodRequest(r.args[0], r.args[1], i) for r, i in zip(requests, ids, strict=True)], self.progress
        )
        self._keep(requests, res)
        return [(float(r.logprob), bool(r.is_greedy)) for r in res]

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        ids = self._ref_ids(requests)
        res = self.backend.loglikelihood_rolling(
            [RollingRequest(r.args[0], i) for r, i in zip(requests, ids, strict=True)], self.progress
        )
        self._keep(requests, res)
        return [float(r.logprob) for r in res]

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        reqs = []
        for r in requests:
            context, kwargs = r.args[0], dict(r.args[1])
            if kwargs.get("do_sample") or float(kwargs.get("temperature") or 0) > 0:
                raise ValueError(f"lm-eval task {r.task_name} asks for sampling; qeval's backends generate greedily")
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            reqs.append(GenerateRequest(context, tuple(until), int(kwargs.get("max_gen_toks", 256))))
        out = self.backend.generate(reqs, self.progress)
        self._keep(requests, out)  # the whole generation, the reasoning block included
        cut = self.think or {}  # lm-eval is handed plain strings: what it scores, the block stripped
        return [str(strip_thinking(text, cut.get(r.task_name))) for r, text in zip(requests, out, strict=True)]


class _References:
    """The baseline's reference per request of each task, in (document, choice) order, handed
    out chunk by chunk: lm-eval sends a chunk's requests of one type in one call. A task's
    references are a list (held whole) or a TopkReader (read from the stored file as asked)."""

    def __init__(self, per_task: dict[str, list[Reference] | TopkReader | None]) -> None:
        self.per_task = per_task
        self.taken: dict[str, int] = defaultdict(int)

    def take(self, task: str, n: int) -> list[Reference] | None:
        """The next `n` requests' references of `task`, or None where it has none."""
        refs = self.per_task.get(task)
        start = self.taken[task]
        self.taken[task] += n
        if refs is None:
            return None
        taken = refs.take(n) if isinstance(refs, TopkReader) else refs[start : start + n]
        return taken if len(taken) == n else None  # past a prefix's end (qeval/run/passes.py): no KL, never a wrong one

    def skip(self, task: str, n: int) -> None:
        """Pass over `task`'s first `n` references (the requests of chunks scored before a
        resume); a stored file is read through, a block at a time, and nothing of it kept."""
        refs = self.per_task.get(task)
        if isinstance(refs, TopkReader):
            for start in range(0, n, 4096):
                refs.take(min(4096, n - start))
        self.taken[task] = n


def _leaf_references(
    session: LmEvalSession,
    leaf: str,
    ref: dict[str, np.ndarray] | TopkReader | None,
    n_requests: int,
    prefix: bool = False,
) -> list[Reference] | TopkReader | None:
    """The baseline's stored top-k of `leaf` (its `n_requests` requests) per request; None where
    it holds other data (a different document count or choice count: no KL, never a wrong one).
    `prefix`: a sequential leaf, whose baseline may have scored only a prefix of the same order
    (a pass's horizon): a stored file of fewer requests is taken (its requests come first)."""
    if ref is None:
        return None
    info = session.infos[leaf]
    if info.output_type == "loglikelihood_rolling":
        if isinstance(ref, TopkReader):
            return ref if ref.n_requests >= info.n_docs else None
        return split_reference(ref, info.n_docs)
    if info.output_type in ("multiple_choice", "loglikelihood"):
        if isinstance(ref, TopkReader):
            return ref if ref.n_requests == n_requests or (prefix and ref.n_requests < n_requests) else None
        held = len(ref["offsets"]) - 1
        return request_references(ref, held if prefix and held < n_requests else n_requests)
    return None


def leaf_requests(
    session: LmEvalSession, leaves: list[str], order: Mapping[str, list[list[int]]] | None = None
) -> dict[str, int]:
    """Per leaf, the requests it sends (multiple choice: one per choice): the progress bar's
    total, and what the baseline's reference must hold. `order`: a sequential run's documents
    per leaf, chunk by chunk (qeval/analysis/sequential_run.py `leaf_chunks`), else the first n_docs."""
    counts = {}
    for leaf in leaves:
        task, info = session.tasks[leaf], session.infos[leaf]
        docs: Any = itertools.islice(task.eval_docs, info.n_docs)
        if order is not None and leaf in order:
            chosen = {i for chunk in order[leaf] for i in chunk}
            docs = (d for i, d in enumerate(task.eval_docs) if i in chosen)
        counts[leaf] = (
            sum(len(task.doc_to_choice(d)) for d in docs) if info.output_type == "multiple_choice" else info.n_docs
        )
    return counts


def score_lm_eval(
    backend: Backend,
    session: LmEvalSession,
    leaves: list[str],
    progress: Progress,
    references: Mapping[str, dict[str, np.ndarray] | TopkReader] | None = None,
    chunk_docs: int = CHUNK_DOCS,
    scratch: Path | None = None,
    keep_topk: bool = True,
    requests: dict[str, int] | None = None,
    resume_keys: Mapping[str, str] | None = None,
    order: Mapping[str, list[list[int]]] | None = None,
    stop: Callable[[dict[str, list[SampleRecord]]], set[str]] | None = None,
    until: Mapping[str, int] | None = None,
    together: Mapping[str, str] | None = None,
) -> dict[str, TaskResult]:
    """Score `leaves` through lm-eval's evaluate(), `chunk_docs` documents a call (every leaf's
    chunk in the same call: one batched backend call per request type); per leaf, qeval's
    records and metrics.

    `scratch`: a folder in the run directory where each chunk's records and top-k go as it is
    scored (qeval/records/spool.py), so the worker holds neither for the whole task; without
    it they are held in memory (lists and arrays). `keep_topk`: keep the top-k (the baseline's,
    the other setups' KL reference); a setup that is not the baseline keeps none.
    `references`: per leaf, the baseline's top-k, whole or opened to be read chunk by chunk
    (TopkReader). `requests`: leaf_requests(session, leaves), where the caller has it already.
    `resume_keys`: per leaf, its resume key (qeval/records/keys.py); with a scratch folder, the
    state is saved after every chunk and an interrupted scoring under the same keys carries on
    from its last finished chunk (qeval/tasks/lm_eval/resume.py).

    A sequential run (qeval/analysis/sequential_run.py) gives `order`, per leaf its documents in
    the seeded order (cut at the cap) chunk by chunk (`leaf_chunks`: a group member's share of each
    of its group's chunks, possibly none), and `stop`, asked after each chunk with every leaf's new
    records (on resume, with all each has), names the leaves whose gate is decided (a group's: all
    its members): they score no further. `until`: per leaf, the pass's horizon (a multiple of
    `chunk_docs`): a leaf scores no further than its first `until[leaf] // chunk_docs` chunks; one
    stopped there is stored as it stands and keeps its saved state (and spools), and the next pass,
    under the same keys, carries on from it (qeval/run/passes.py). A sequential run scores each
    ordered leaf in an `evaluate()` group of its own (`together`: leaf -> its unit, a group cell's
    members one unit), so that its state's key does not depend on which other tasks a pass still
    scores."""
    assert all(h % chunk_docs == 0 for h in (until or {}).values()), (
        "a horizon falls at a look: a multiple of chunk_docs"
    )
    counts = requests if requests is not None else leaf_requests(session, leaves)
    ordered = {leaf for leaf in leaves if order is not None and leaf in order}
    refs = _References(
        {
            # a sequential leaf pairs with the baseline's prefix of the same order: it may hold fewer requests
            leaf: _leaf_references(session, leaf, (references or {}).get(leaf), counts[leaf], leaf in ordered)
            for leaf in leaves
        }
    )
    lm = make_lm(backend, refs, progress, {leaf: session.infos[leaf].think_end_token for leaf in leaves})
    call = _Call(session, lm, refs, counts, progress, chunk_docs, scratch, keep_topk, resume_keys, stop, ordered)
    results: dict[str, TaskResult] = {}
    for group in _groups(session, leaves, ordered, together):
        chunks = {
            leaf: order[leaf]
            if order is not None and leaf in order
            else _in_chunks(session.infos[leaf].n_docs, chunk_docs)
            for leaf in group
        }
        # where each leaf stops this call, in chunks: all of them, or an ordered leaf's horizon
        end = {
            leaf: min(len(c), until[leaf] // chunk_docs) if until and leaf in until else len(c)
            for leaf, c in chunks.items()
        }
        results |= _score_group(call, group, chunks, end)
    return {leaf: results[leaf] for leaf in leaves}


@dataclass
class _Call:
    """What every `evaluate()` group of one score_lm_eval call shares (its arguments there)."""

    session: LmEvalSession
    lm: Any
    refs: _References
    counts: dict[str, int]
    progress: Progress
    chunk_docs: int
    scratch: Path | None
    keep_topk: bool
    resume_keys: Mapping[str, str] | None
    stop: Callable[[dict[str, list[SampleRecord]]], set[str]] | None
    ordered: set[str]


def _groups(
    session: LmEvalSession, leaves: list[str], ordered: set[str], together: Mapping[str, str] | None
) -> list[list[str]]:
    """The leaves of each `evaluate()` group: one per chat settings, and per ordered leaf's unit
    (score_lm_eval's docstring)."""
    by_chat: dict[tuple[str | None, str | None], list[str]] = defaultdict(list)
    for leaf in leaves:
        chat = session.chats.get(leaf)
        unit = (together or {}).get(leaf, leaf) if leaf in ordered else None
        by_chat[(chat.sha256 if chat is not None else None, unit)].append(leaf)
    return list(by_chat.values())


def _group_key(call: _Call, group: list[str], chunks: dict[str, list[list[int]]], chat: Chat | None) -> str | None:
    """The group's resume key (qeval/tasks/lm_eval/resume.py), or None where it is not resumable
    (no scratch folder, or a leaf without a resume key)."""
    keys = call.resume_keys
    if call.scratch is None or keys is None or not all(leaf in keys for leaf in group):
        return None
    n_docs = {leaf: sum(len(c) for c in chunks[leaf]) for leaf in group}
    return resume.group_key(
        {
            "leaves": {
                leaf: [keys[leaf], n_docs[leaf], call.counts[leaf], call.refs.per_task.get(leaf) is not None]
                for leaf in group
            },
            "chunk_docs": call.chunk_docs,
            "fewshot_seed": call.session.spec.fewshot_seed,
            "keep_topk": call.keep_topk,
            "chat": chat.sha256 if chat is not None else None,
        }
    )


def _score_group(
    call: _Call, group: list[str], chunks: dict[str, list[list[int]]], end: dict[str, int]
) -> dict[str, TaskResult]:
    """One `evaluate()` group scored chunk by chunk, from its saved state where it has one; each
    leaf stops at `end[leaf]` chunks, or once `stop` names it."""
    session, chunk_docs, scratch = call.session, call.chunk_docs, call.scratch
    chat = session.chats.get(group[0])
    call.lm.chat = chat
    for leaf in group:  # once per task: its sampler then carries on from chunk to chunk
        session.tasks[leaf].set_fewshot_seed(session.spec.fewshot_seed)
    key = _group_key(call, group, chunks, chat)
    built, first = _resumed(session, group, scratch, key, call.keep_topk, call.refs, call.progress)
    stop = call.stop
    stopped = stop({leaf: _records_so_far(built[leaf]) for leaf in group}) if first and stop is not None else set()
    # `start`: the chunk's first position (what a saved state's next_start counts in)
    for start in range(first, chunk_docs * max(end.values(), default=0), chunk_docs):
        # never an empty list: lm-eval reads `samples=[]` as "every document"; ascending, as
        # lm-eval maps its own numbering back to `samples` in the set's order
        j = start // chunk_docs
        samples = {leaf: sorted(c[j]) for leaf, c in chunks.items() if j < end[leaf] and c[j] and leaf not in stopped}
        if not samples:
            if not any(leaf not in stopped and any(c[j : end[leaf]]) for leaf, c in chunks.items()):
                break  # every leaf decided, or at its cap or horizon
            continue  # (a group member's empty share, its group's other members decided elsewhere)
        added = _evaluate_chunk(call, chat, samples, built)
        if stop is not None:  # after the whole chunk: a group's cell looks at every member's share
            stopped |= stop(added)
        if key is not None and scratch is not None:  # the chunk is on disk: a rerun carries on after it
            key = key if _save(scratch, key, start + chunk_docs, session, built, call.refs) else None
        release_free_memory()  # else glibc keeps what the chunk freed, and the RSS climbs chunk by chunk
    # stopped at the horizon, undecided, short of its documents: stored as it stands, its state kept
    paused = {leaf for leaf in group if end[leaf] < len(chunks[leaf]) and leaf not in stopped}
    results = {leaf: built[leaf].result(session, paused=leaf in paused) for leaf in group}
    if key is not None and scratch is not None and call.ordered.issuperset(group) and not paused:
        resume.discard(scratch, key)  # a sequential task done (decided, or at the cap): no pass takes it up
    return results


def _evaluate_chunk(
    call: _Call, chat: Chat | None, samples: dict[str, list[int]], built: dict[str, _LeafResult]
) -> dict[str, list[SampleRecord]]:
    """One chunk (`samples`: per leaf, its documents) through lm-eval's `evaluate()`, added to
    each leaf's result; returns each leaf's new records."""
    from lm_eval.evaluator import evaluate

    lm, session = call.lm, call.session
    templated = chat is not None and chat.template is not None
    lm.chunk_ids = samples
    out = evaluate(
        lm=lm,
        task_dict={"tasks": {leaf: session.tasks[leaf] for leaf in samples}, "groups": {}, "group_map": {}},
        samples=samples,
        log_samples=True,
        bootstrap_iters=0,
        verbosity="ERROR",
        apply_chat_template=templated,
        fewshot_as_multiturn=chat is not None and templated and chat.fewshot_as_multiturn,
        system_instruction=chat.system_prompt if chat is not None else None,
    )
    requests = Counter(k[0] for k in lm.raw)  # the chunk's requests per task, counted once
    added = {}
    for leaf in samples:
        added[leaf] = built[leaf].add(session, out["samples"][leaf], lm.raw, lm.refs)
        built[leaf].requests_done += requests[leaf]
    lm.raw.clear()  # the chunk's per-request results and lm-eval's own go here
    lm.refs.clear()
    return added


def _in_chunks(n_docs: int, chunk_docs: int) -> list[list[int]]:
    """The first `n_docs` documents in the set's own order, `chunk_docs` a chunk."""
    return [list(range(s, min(s + chunk_docs, n_docs))) for s in range(0, n_docs, chunk_docs)]


def _records_so_far(built: _LeafResult) -> list[SampleRecord]:
    """A leaf's records so far, its spool read through a handle of its own (the spool stays open
    for the chunks to come)."""
    if not isinstance(built.records, RecordSpool):
        return list(built.records)
    with open(built.records.path, "rb") as f:
        return [read_record(json.loads(line)) for line in f]


def _resumed(
    session: LmEvalSession,
    group: list[str],
    scratch: Path | None,
    key: str | None,
    keep_topk: bool,
    refs: _References,
    progress: Progress,
) -> tuple[dict[str, _LeafResult], int]:
    """The group's results so far and the first document still to score: a saved state's (its
    spools reopened, the samplers and references where it left them, the progress bar advanced),
    or fresh ones from document 0 where there is none or it cannot be taken up."""
    saved = resume.load(scratch, key) if scratch is not None and key is not None else None
    if saved is not None and scratch is not None and set(saved.leaves) == set(group):
        try:
            built = {leaf: _LeafResult.restore(leaf, scratch, keep_topk, saved.leaves[leaf]) for leaf in group}
            for leaf in group:
                resume.set_rng_state(session.tasks[leaf], saved.leaves[leaf].rng)
        except Exception:  # noqa: BLE001 - a spool gone or a state damaged in any way: score again from document 0
            for leaf in group:
                session.tasks[leaf].set_fewshot_seed(session.spec.fewshot_seed)
        else:
            for leaf in group:
                refs.skip(leaf, saved.leaves[leaf].references_taken)
                progress(saved.leaves[leaf].requests_done)
            print(
                f"lm-eval {', '.join(group)}: carrying on from document {saved.next_start} (the chunks before it "
                "were scored by an interrupted run, or an earlier pass of a sequential run)",
                file=sys.stderr,
                flush=True,
            )
            return built, saved.next_start
    return {leaf: _LeafResult.start(leaf, scratch, keep_topk) for leaf in group}, 0


def _save(
    scratch: Path, key: str, next_start: int, session: LmEvalSession, built: dict[str, _LeafResult], refs: _References
) -> bool:
    """The group's state after a chunk (qeval/tasks/lm_eval/resume.py); False where it cannot be
    written (a metric value JSON cannot hold): the scoring goes on, and is not resumable."""
    states = {leaf: b.state(resume.rng_state(session.tasks[leaf]), refs.taken[leaf]) for leaf, b in built.items()}
    try:
        resume.save(scratch, key, next_start, states)
    except (TypeError, ValueError) as exc:
        resume.discard(scratch, key)
        print(f"lm-eval {', '.join(built)}: not saving chunks to resume from ({exc})", file=sys.stderr, flush=True)
        return False
    return True


@dataclass
class _LeafResult:
    """One leaf's result built chunk by chunk: its records, lm-eval's per-document metric values
    (aggregated once at the end), its top-k and its token-level divergence from the baseline.
    Records and top-k go to spools in the run directory where the worker gives a scratch folder,
    so that neither grows in memory with the documents."""

    leaf: str
    records: list[SampleRecord] | RecordSpool
    #: the top-k packs, chunk by chunk (None: not kept, a setup that is not the baseline)
    packs: list[dict[str, np.ndarray]] | TopkSpool | None
    #: (metric, filter) -> per-document values in document order: what evaluate() aggregates
    raw_metrics: dict[tuple[str, str], list[Any]] = field(default_factory=lambda: defaultdict(list))
    #: False once a chunk's results carry no top-k (a backend without it): the task keeps none
    topk_ok: bool = True
    tokens: TokenDivergence = field(default_factory=TokenDivergence)
    #: the requests scored so far (the progress bar's share of this task, on resume)
    requests_done: int = 0

    @classmethod
    def start(cls, leaf: str, scratch: Path | None, keep_topk: bool) -> _LeafResult:
        if scratch is None:
            return cls(leaf, [], [] if keep_topk else None)
        return cls(leaf, RecordSpool(scratch, leaf), TopkSpool(scratch, leaf) if keep_topk else None)

    @classmethod
    def restore(cls, leaf: str, scratch: Path, keep_topk: bool, saved: resume.SavedLeaf) -> _LeafResult:
        """The result as `state()` saved it after a chunk, its spools reopened and cut back."""
        if keep_topk != (saved.topk is not None):
            raise ValueError("the saved state kept top-k where this scoring does not, or the reverse")
        packs = (
            TopkSpool(scratch, leaf, resume=saved.topk, lengths=saved.topk_lengths) if saved.topk is not None else None
        )
        out = cls(
            leaf,
            RecordSpool(scratch, leaf, resume=saved.records),
            packs,
            topk_ok=saved.topk_ok,
            requests_done=saved.requests_done,
        )
        for metric, filt, values in saved.raw_metrics:
            out.raw_metrics[(metric, filt)] = values
        out.tokens.restore({"kl": saved.kl, "top1": saved.top1, "dp": saved.dp}, saved.dp_missing)
        return out

    def state(self, rng: dict[str, Any], references_taken: int) -> resume.SavedLeaf:
        """What `restore` needs, after a chunk (with the samplers' random state and the baseline
        references taken so far): spools' sizes, lm-eval's metric values so far, the top-k's
        request lengths and the divergence per scored token."""
        assert isinstance(self.records, RecordSpool), "a state is saved only for spooled results"
        tokens = self.tokens.arrays()
        topk, lengths = self.packs.state() if isinstance(self.packs, TopkSpool) else (None, None)
        return resume.SavedLeaf(
            records=self.records.state(),
            topk=topk,
            topk_lengths=lengths,
            raw_metrics=[(m, f, v) for (m, f), v in self.raw_metrics.items()],
            topk_ok=self.topk_ok,
            requests_done=self.requests_done,
            references_taken=references_taken,
            rng=rng,
            kl=tokens.get("kl"),
            top1=tokens.get("top1"),
            dp=tokens.get("dp"),
            dp_missing=self.tokens.dp_missing,
        )

    def add(
        self,
        session: LmEvalSession,
        samples: list[dict[str, Any]],
        raw: dict[tuple[str, int, int], Any],
        refs: dict[tuple[str, int, int], Reference],
    ) -> list[SampleRecord]:
        """One chunk: lm-eval's logged samples of this leaf and the backend's per-request results;
        returns the chunk's records."""
        info, leaf = session.infos[self.leaf], self.leaf
        by_doc: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for s in samples:  # lm-eval logs filter by filter, each in document order, as it aggregates
            by_doc[int(s["doc_id"])].append(s)
            for m in s["metrics"]:
                self.raw_metrics[(m, s.get("filter", "none"))].append(s[m])
        doc_ids = sorted(by_doc)
        records = [_record(leaf, info.output_type, info.compared_metric, d, by_doc[d], raw) for d in doc_ids]
        topk: dict[str, np.ndarray] = {}
        if info.output_type == "loglikelihood_rolling":
            results = [raw[(leaf, d, 0)] for d in doc_ids]
            topk = pack_topk(results)
            for d, rec, res in zip(doc_ids, records, results, strict=True):
                doc_ref = refs.get((leaf, d, 0))
                if doc_ref is not None and res.ref_logprobs is not None:
                    document_divergence(rec, doc_ref, res, self.tokens)
        elif info.output_type in ("multiple_choice", "loglikelihood"):  # KL on the scored tokens of every choice
            keys = [
                [(leaf, d, i) for i in range(len(r.loglikelihoods or [None]))]
                for d, r in zip(doc_ids, records, strict=True)
            ]
            choices = [[raw[k] for k in doc] for doc in keys]
            chosen = [refs.get(k) for doc in keys for k in doc]
            full = None if any(c is None for c in chosen) else [c for c in chosen if c is not None]
            topk, _ = continuation_divergence(choices, full, records, self.tokens)
            self.topk_ok = self.topk_ok and bool(topk)
        if topk and self.topk_ok and self.packs is not None:
            self.packs.append(topk)
        self.records.extend(records)
        return records

    def result(self, session: LmEvalSession, paused: bool = False) -> TaskResult:
        """The leaf's TaskResult over every chunk: lm-eval's aggregation of every document's values.
        `paused`: stopped at a sequential pass's horizon: its spools stay as its saved state names
        them (the next pass appends to them) and the result holds copies, which the store takes."""
        # lm-eval 0.4.13: what evaluate() aggregates a task's per-document values with
        from lm_eval.evaluator_utils import _compute_task_aggregations

        aggregated, _ = _compute_task_aggregations(session.tasks[self.leaf], self.raw_metrics, 0)
        metrics: dict[str, dict[str, float | None]] = {}
        for key, value in aggregated.items():
            if "," not in key or "_stderr," in key or not isinstance(value, (int, float)):
                continue
            name, filt = key.split(",", 1)
            qname = name if filt == "none" else key
            stderr = aggregated.get(f"{name}_stderr,{filt}")
            if not isinstance(stderr, (int, float)):  # bootstrap_iters=0 leaves it out; a mean's is closed form
                stderr = _mean_stderr([_scalar(v) for v in self.raw_metrics.get((name, filt), [])])
            metrics[qname] = {"value": float(value), "stderr": float(stderr) if stderr is not None else None}
        records = self.records
        if isinstance(records, RecordSpool):
            records.finish()
            records = records.copy() if paused else records
        output_type = session.infos[self.leaf].output_type
        packs = self.packs if self.topk_ok and output_type in KL_OUTPUT_TYPES else None
        if isinstance(self.packs, TopkSpool) and packs is None and not paused:
            self.packs.discard()
        topk: dict[str, np.ndarray] | TopkSpool = {}
        if isinstance(packs, TopkSpool):
            topk = (packs.copy() if paused else packs) if packs else {}
        elif packs:
            topk = concat_topk(packs)
        if output_type not in KL_OUTPUT_TYPES:
            return TaskResult(records, metrics, {})
        return TaskResult(records, metrics, topk, self.tokens.summary())


def _record(
    leaf: str,
    output_type: str,
    compared: str,
    doc_id: int,
    entries: list[dict[str, Any]],
    raw: dict[tuple[str, int, int], Any],
) -> SampleRecord:
    """One document's record: lm-eval's doc id and per-document metric values (every filter),
    plus what qeval's comparison and drill-down read (correct, prediction, nll...)."""
    first = entries[0]
    scores: dict[str, Any] = {}
    filtered: dict[str, Any] = {}
    for e in entries:
        filt = e.get("filter", "none")
        for m in e.get("metrics", []):
            scores[m if filt == "none" else f"{m},{filt}"] = e.get(m)
        filtered[filt] = e["filtered_resps"]
    rec = SampleRecord(
        sample_id=str(doc_id),
        doc_id=doc_id,
        prompt=first["arguments"][0][0],
        target=_plain(first["target"]),
        doc_hash=first.get("doc_hash"),
        prompt_hash=first.get("prompt_hash"),
        metrics=_scalars(scores),
        loglikelihoods=None,
        nll=None,
        n_tokens=None,
    )
    _set_outcome(rec, (leaf, doc_id), output_type, compared, entries, filtered, scores, raw)
    value = scores.get(compared)
    is_flag = isinstance(value, (int, float)) and not isinstance(value, bool) and value in (0, 1, 0.0, 1.0)
    rec.correct = bool(value) if is_flag else None
    return rec


def _set_outcome(
    rec: SampleRecord,
    doc: tuple[str, int],
    output_type: str,
    compared: str,
    entries: list[dict[str, Any]],
    filtered: dict[str, Any],
    scores: dict[str, Any],
    raw: dict[tuple[str, int, int], Any],
) -> None:
    """The record's prediction and what its output type scores (log-likelihoods, the generation,
    nll and token counts), from lm-eval's logged sample and the backend's results. `doc`: (leaf, doc id)."""
    (leaf, doc_id), first = doc, entries[0]
    if output_type == "multiple_choice":
        lls = [float(resp[0][0]) for resp in first["resps"]]
        pred = int(np.argmax(lls))
        rec.loglikelihoods = lls
        rec.prediction = first["arguments"][pred][1].strip()
        rec.n_tokens = [raw[(leaf, doc_id, i)].n_tokens for i in range(len(lls))]
    elif output_type == "generate_until":
        filt = compared.split(",", 1)[1] if "," in compared else "none"
        answer = filtered.get(filt, first["filtered_resps"])
        whole = raw.get((leaf, doc_id, 0), first["resps"][0][0])
        rec.prediction = _plain(answer[0] if isinstance(answer, list) and answer else answer)
        rec.raw_output = str(whole)
        rec.generated_tokens = generated_tokens(whole)
        rec.filtered = {k: _plain(v) for k, v in filtered.items()}
        if first["resps"][0][0] != whole:  # a reasoning block stripped: what lm-eval scored
            rec.response = first["resps"][0][0]
    elif output_type == "loglikelihood_rolling":
        ll = float(first["resps"][0][0])
        bytes_ = scores.get("bits_per_byte") or scores.get("byte_perplexity")
        words = scores.get("word_perplexity")
        rec.prediction = None
        rec.nll = -ll
        rec.n_tokens = raw[(leaf, doc_id, 0)].n_tokens
        rec.n_bytes = int(bytes_[1]) if isinstance(bytes_, (list, tuple)) else None
        rec.n_words = int(words[1]) if isinstance(words, (list, tuple)) else None
    else:  # loglikelihood: one continuation (lambada-style)
        ll, greedy = first["resps"][0][0]
        rec.prediction, rec.nll, rec.is_greedy = None, -float(ll), bool(greedy)


def _mean_stderr(values: list[float | None]) -> float | None:
    """Standard error of a per-document mean (sample std / sqrt(n), as lm-eval's mean_stderr);
    None for metrics that are not per-document means (perplexities)."""
    xs = [v for v in values if v is not None]
    if len(xs) < 2 or len(xs) != len(values):
        return None
    return float(np.std(xs, ddof=1) / math.sqrt(len(xs)))


def _scalars(scores: dict[str, Any]) -> dict[str, float]:
    """Per-document metric values that are numbers (perplexity ones are (ll, count) pairs)."""
    return {k: x for k, v in scores.items() if (x := _scalar(v)) is not None}


def _scalar(value: Any) -> float | None:
    """A per-document metric value as a float, or None where it is no finite number."""
    if isinstance(value, (bool, np.bool_)):  # lm-eval metrics return numpy's as often as Python's
        return float(value)
    if isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(float(value)):
        return float(value)
    return None


def _plain(value: Any) -> Any:
    """JSON-able: tuples and numpy values made plain."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)
