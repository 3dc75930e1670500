"""The datasets `vllm bench serve` replays for `qeval goodput` (docs/performance.md, "Serving the
workload"): the custom dataset (one JSON line per request, its prompt text of exactly its token
count, its group's shared prefix first, its output_tokens) for Poisson arrivals, and the
timed_trace dataset (each request's own time, lengths and prefix hash ids) for the workload's
own arrival times."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from qeval.errors import UserError

if TYPE_CHECKING:
    from qeval.workload.trace import Request, Trace

#: tokens per hash id of vLLM's timed_trace dataset (its --timed-trace-chunk-hash-size default)
TIMED_CHUNK = 16


def word_ids(tok: Any) -> list[int]:
    """Token ids a prompt is written from: whole words with their leading space (a byte-level
    BPE does not merge across a space), or, for a tokenizer of characters, single letters; each
    re-encodes to itself. The prompt's length is checked as the bench counts it all the same."""
    words, letters = [], []
    for tid in range(min(len(tok), 60_000)):
        text = tok.decode([tid])
        if not text.strip().isalpha() or not text.isascii():
            continue
        if len(text) >= 4 and text[0] == " " and text[1:].isalpha():
            words.append(tid)
        elif len(text) == 1 and tok(text, add_special_tokens=False).input_ids == [tid]:
            letters.append(tid)
    out = words if len(words) >= 100 else letters
    if len(out) < 20:
        raise UserError("the tokenizer has too few whole-word or letter tokens to write prompts of exact lengths")
    return out


def exact_prompt(tok: Any, words: list[int], rng: np.random.Generator, n: int, head: str = "") -> str:
    """`head` followed by words, `n` tokens in all as the tokenizer counts the text (`len(
    tokenizer(text).input_ids)`, as the bench counts it): adjusted word by word, as vLLM's
    gen_prompt_decode_to_target_len adjusts its random prompts (vllm/benchmarks/datasets)."""
    count = len(tok(head).input_ids) if head else 0
    ids = [int(x) for x in rng.choice(words, size=max(n - count, 0))]
    for _ in range(10):
        text = head + tok.decode(ids)
        got = len(tok(text).input_ids)
        if got == n:
            return text
        if got > n and ids:
            ids = ids[: max(len(ids) - (got - n), 0)]
        else:
            ids += [int(x) for x in rng.choice(words, size=max(n - got, 1))]
    raise UserError(f"cannot write a prompt of exactly {n} tokens with this tokenizer")


def shared_prefix(tok: Any, words: list[int], rng: np.random.Generator, stream: list[int], n: int) -> str:
    """The first `n` tokens (as the bench counts them) of a group's shared `stream` of words, as
    text; the stream is grown with fresh words where `n` reaches past it. Every request of a
    group (a conversation's turns, each with its own prefix_tokens) starts with the stream, so
    any two share the shorter of their prefixes, and a later turn's longer prefix extends an
    earlier one's."""
    k = n - len(tok("").input_ids)  # the tokenizer's special tokens count towards n
    for _ in range(10):
        k = max(k, 0)
        if k > len(stream):
            stream += [int(x) for x in rng.choice(words, size=k - len(stream))]
        text = tok.decode(stream[:k])
        got = len(tok(text).input_ids)
        if got == n:
            return text
        k += n - got
    raise UserError(f"cannot write a shared prefix of exactly {n} tokens with this tokenizer")


def dataset(trace: Trace, tok: Any, n: int, max_model_len: int, seed: int) -> tuple[list[dict[str, Any]], int]:
    """`n` requests of the trace in order (cycled), those max-model-len admits, as the custom
    dataset's lines; and how many of the first pass were refused (longer than max-model-len)."""
    admitted = [r for r in trace.requests if r.total <= max_model_len]
    refused = len(trace.requests) - len(admitted)
    if not admitted:
        raise UserError(f"no request of the workload fits max-model-len {max_model_len}")
    words = word_ids(tok)
    rng = np.random.default_rng(seed)
    streams: dict[str, list[int]] = {}  # each group's shared words, grown as its requests need them
    lines = []
    for i in range(n):
        r: Request = admitted[i % len(admitted)]
        head = ""
        if r.group is not None and r.prefix_tokens:
            head = shared_prefix(tok, words, rng, streams.setdefault(r.group, []), r.prefix_tokens)
        lines.append({"prompt": exact_prompt(tok, words, rng, r.input_tokens, head), "output_tokens": r.output_tokens})
    return lines, refused


#: tokens per hash id of vLLM's timed_trace dataset (its --timed-trace-chunk-hash-size default)
TIMED_CHUNK = 16


def _timed_admitted(trace: Trace, max_model_len: int) -> tuple[list[Request], float, float, float]:
    """The requests max-model-len admits, with their first time, the span of their times and the
    gap between two passes over them (their mean spacing); one line for a trace whose times
    cannot be replayed at a rate."""
    admitted = [r for r in trace.requests if r.total <= max_model_len]
    if not admitted:
        raise UserError(f"no request of the workload fits max-model-len {max_model_len}")
    times = [r.arrival_s for r in admitted]
    if any(t is None for t in times):
        raise UserError(
            "serving.arrivals trace: the workload has no arrival times (a trace's arrival_s on every "
            "line, or a drawn workload's arrival_rate); use arrivals: poisson"
        )
    t0 = float(times[0] or 0.0)
    span = float(times[-1] or 0.0) - t0
    if len(admitted) > 1 and span <= 0:  # scaled to any rate, the times stay one burst
        raise UserError(
            f"serving.arrivals trace: every request of the workload arrives at {t0:g} s, so every rate "
            "would replay the same burst; give arrival times that differ, or use arrivals: poisson"
        )
    gap = span / (len(admitted) - 1) if len(admitted) > 1 and span > 0 else 1.0
    return admitted, t0, span, gap


class _HashIds:
    """timed_trace's hash ids: a group's shared prefix the same ids in every request of the
    group (so prefix caching sees the same tokens), the rest ids of their own."""

    def __init__(self) -> None:
        self.groups: dict[str, list[int]] = {}
        self.next_id = 1 << 40  # distinct from every group's ids

    def _fresh(self, n: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        return ids

    def of(self, r: Request) -> list[int]:
        chunks = math.ceil(r.input_tokens / TIMED_CHUNK)
        shared = min(r.prefix_tokens // TIMED_CHUNK, chunks) if r.group is not None else 0
        ids = self.groups.setdefault(r.group or "", [])
        if shared and len(ids) < shared:
            ids += self._fresh(shared - len(ids))
        return ids[:shared] + self._fresh(chunks - shared)


def timed_dataset(trace: Trace, n: int, max_model_len: int) -> tuple[list[dict[str, Any]], float]:
    """`n` requests of the trace in order (cycled, each pass after the last), those max-model-len
    admits, as lines of vLLM's timed_trace dataset (vllm/benchmarks/datasets/datasets.py
    TimedTrace, vLLM 0.32.0): `timestamp` (seconds from the first request), `input_length`,
    `output_length`, and `hash_ids`, one per 16 prompt tokens (`_HashIds`). And the requests'
    own mean rate (requests/s), which each level's rate scales."""
    admitted, t0, span, gap = _timed_admitted(trace, max_model_len)
    ids = _HashIds()
    lines = []
    at = 0.0
    for i in range(n):
        r = admitted[i % len(admitted)]
        at = float(r.arrival_s or 0.0) - t0 + (i // len(admitted)) * (span + gap)
        lines.append(
            {
                "timestamp": round(at, 6),
                "input_length": r.input_tokens,
                "output_length": r.output_tokens,
                "hash_ids": ids.of(r),
            }
        )
    rate = (len(lines) - 1) / at if len(lines) > 1 and at > 0 else float(len(lines))
    return lines, rate
