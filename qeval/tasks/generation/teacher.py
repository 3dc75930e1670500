"""Divergence along the generation (docs/tasks.md, "Divergence along the generation").

The baseline's own generation of each document is teacher-forced through every setup: one
forward pass over prompt + generation (`loglikelihood_rolling`, the path perplexity takes), so
that under a quantized KV cache every generated token attends to K/V that went through the
cache's quantizer (the hf backend's round-trip cache; vLLM's prompt_logprobs and an
OpenAI-compatible server's prompt log-probs as those engines compute them). Per generated-token
position: the actual token's log-prob, and against the baseline's top-k at that position the KL
and top-1 agreement (qeval/tasks/divergence.py `kl_top1`), summed per position bucket into the
document's record (`teacher_forced`) for the results block (results.py) to pair by document.

The baseline keeps its top-k over its generations as the task's top-k file, with the generated
texts beside it (the `generation` member: JSON as bytes), so a setup reads everything it needs
from the one reference file the runner already hands it (records/job.py `reference`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import numpy as np

from qeval.backends.base import TOPK, RollingRequest, RollingResult
from qeval.backends.tokens import Conventions, conventions
from qeval.results.samples import GeneratedPositionSums, SampleRecord, TeacherForced
from qeval.tasks.divergence import kl_top1

if TYPE_CHECKING:
    from qeval.backends.base import Backend
    from qeval.config import RunConfig
    from qeval.tasks.scoring import TaskResult

#: the member of the baseline's top-k file that holds its generated texts
TEXTS_KEY = "generation"

Store = Callable[[str, Any, float, str], None]


def position_sums(
    edges: list[int], logprobs: np.ndarray, kl: np.ndarray | None, top1: np.ndarray | None
) -> list[GeneratedPositionSums]:
    """Per bucket of generated positions (lower `edges`, the last open-ended) that the document
    reaches: tokens, summed log-prob of the actual tokens and, against the baseline, summed KL
    and top-1 agreements."""
    n = len(logprobs)
    out = []
    for i, lo in enumerate(edges):
        if lo >= n:
            break
        hi = edges[i + 1] if i + 1 < len(edges) else None
        sl = slice(lo, n if hi is None else min(hi, n))
        rec = GeneratedPositionSums(
            start=lo, end=hi, tokens=sl.stop - sl.start, logprob=float(logprobs[sl].sum(dtype=np.float64))
        )
        if kl is not None and top1 is not None:
            rec.kl, rec.top1 = float(kl[sl].sum(dtype=np.float64)), int(top1[sl].sum())
        out.append(rec)
    return out


def teacher_forcing(
    store: Store,
    backend: Backend,
    cfg: RunConfig,
    is_baseline: bool,
    reference: Callable[[str], dict[str, np.ndarray] | None],
    progress: Callable[[str, int | None], AbstractContextManager[Any]],
) -> Store:
    """`store` (the worker's: task, result, seconds, sha256) with a generation task's records
    given their teacher-forced divergence first (and the baseline's result its top-k); any other
    task passes through untouched."""
    spec = cfg.generation_divergence
    assert spec is not None
    conv: list[Conventions] = []

    def tokens() -> Conventions:
        if not conv:  # the tokenizer once per worker, as the long-context tasks load it
            from qeval.tasks.long_context.tasks import load_tokenizer

            m = cfg.model
            conv.append(conventions(load_tokenizer(m.path, m.revision, m.trust_remote_code)))
        return conv[0]

    def wrapped(name: str, result: TaskResult, seconds: float, sha256: str) -> None:
        records = list(result.records)
        if records and all(r.raw_output is not None and r.prompt is not None for r in records):
            with progress(
                f"{cfg.baseline.name if is_baseline else 'setup'}: {name} teacher-forced", len(records)
            ) as bar:
                if is_baseline:
                    result.topk = baseline_pass(
                        backend, tokens(), records, spec.position_buckets, cfg.model.max_context, bar.advance
                    )
                else:
                    setup_pass(backend, tokens(), records, reference(name), spec.position_buckets, bar.advance)
            result.records = records
        store(name, result, seconds, sha256)

    return wrapped


def _split(conv: Conventions, prompt: str, text: str) -> tuple[int, int]:
    """(tokens of prompt + text as the rolling pass encodes it, tokens of the generation): the
    generation is what follows the prompt's own tokens, as the model generated after them
    (a prompt's trailing space stays the prompt's); (0, 0) where the prompt's tokens are not a
    prefix of the whole text's (a token merged across the boundary: no position is the
    generation's first)."""
    head, whole = conv.encode(prompt), conv.encode(prompt + text)
    if whole[: len(head)] != head:
        return 0, 0
    return len(whole), len(whole) - len(head)


def _tail(res: RollingResult, n: int) -> RollingResult:
    """The last `n` scored positions of a rolling result: the generated tokens."""
    return RollingResult(
        res.token_logprobs[-n:],
        res.topk_indices[-n:],
        res.topk_logprobs[-n:],
        None if res.ref_logprobs is None else res.ref_logprobs[-n:],
    )


def baseline_pass(
    backend: Backend,
    conv: Conventions,
    records: list[SampleRecord],
    edges: list[int],
    max_context: int,
    advance: Callable[[int], None],
) -> dict[str, np.ndarray]:
    """The baseline's own generations scored: each record's log-prob sums by position bucket,
    and the top-k pack the setups read (empty where no generation could be scored)."""
    kept: list[tuple[SampleRecord, int, int]] = []
    for r in records:
        text = str(r.raw_output)
        if not text:
            continue
        total, n_gen = _split(conv, str(r.prompt), text)
        # one window: a text past the context would be scored in windows that lose the prompt (the
        # vllm and openai backends' windows are two tokens shorter than the context)
        if 0 < n_gen <= total and total <= max_context - 2:
            kept.append((r, total, n_gen))
    results = (
        backend.loglikelihood_rolling([RollingRequest(str(r.prompt) + str(r.raw_output)) for r, _, _ in kept], advance)
        if kept
        else []
    )
    tails, ids, texts = [], [], []
    for (r, total, n_gen), res in zip(kept, results, strict=True):
        if res.n_tokens != total:  # tokenized otherwise than expected: no divergence, never a wrong one
            continue
        tail = _tail(res, n_gen)
        r.teacher_forced = TeacherForced(tokens=n_gen, buckets=position_sums(edges, tail.token_logprobs, None, None))
        tails.append(tail)
        ids.append(r.sample_id)
        texts.append(str(r.raw_output))
    if not tails:
        return {}
    lengths = np.array([t.n_tokens for t in tails], dtype=np.int64)
    blob = json.dumps({"sample_ids": ids, "texts": texts}).encode()
    return {
        "offsets": np.concatenate([[0], np.cumsum(lengths)]),
        "indices": np.concatenate([t.topk_indices for t in tails]).astype(np.int32),
        "logprobs": np.concatenate([t.topk_logprobs for t in tails]).astype(np.float32),
        "token_logprobs": np.concatenate([t.token_logprobs for t in tails]).astype(np.float32),
        TEXTS_KEY: np.frombuffer(blob, dtype=np.uint8),
    }


def setup_pass(
    backend: Backend,
    conv: Conventions,
    records: list[SampleRecord],
    ref: dict[str, np.ndarray] | None,
    edges: list[int],
    advance: Callable[[int], None],
) -> None:
    """The baseline's generations teacher-forced through this setup: each record whose document
    the baseline scored gets its sums by position bucket, KL and top-1 against the baseline's."""
    if ref is None or TEXTS_KEY not in ref:
        return
    meta = json.loads(bytes(ref[TEXTS_KEY]).decode())
    offsets = ref["offsets"]
    where = {sid: k for k, sid in enumerate(meta["sample_ids"])}
    jobs: list[tuple[SampleRecord, int, int]] = []
    reqs: list[RollingRequest] = []
    for r in records:
        k = where.get(r.sample_id)
        if k is None:
            continue
        text = meta["texts"][k]
        total, n_gen = _split(conv, str(r.prompt), text)
        if n_gen != int(offsets[k + 1] - offsets[k]):  # another prompt than the baseline's: not paired
            continue
        width = ref["indices"].shape[1] if ref["indices"].ndim == 2 else TOPK
        ids = np.zeros((total, width), dtype=np.int64)  # prompt positions: any ids, never read
        ids[total - n_gen :] = ref["indices"][offsets[k] : offsets[k + 1]]
        jobs.append((r, k, n_gen))
        reqs.append(RollingRequest(str(r.prompt) + text, ids))
    results = backend.loglikelihood_rolling(reqs, advance) if reqs else []
    for (r, k, n_gen), res in zip(jobs, results, strict=True):
        if res.ref_logprobs is None or res.n_tokens < n_gen:
            continue
        tail = _tail(res, n_gen)
        sl = slice(int(offsets[k]), int(offsets[k + 1]))
        kl, top1 = kl_top1((ref["indices"][sl], ref["logprobs"][sl], ref["token_logprobs"][sl]), tail)
        r.teacher_forced = TeacherForced(tokens=n_gen, buckets=position_sums(edges, tail.token_logprobs, kl, top1))
