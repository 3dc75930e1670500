"""The long-context documents, generated offline and deterministically: passkey retrieval
(Mohtashami & Jaggi 2023), a RULER-style multi-key needle (Hsieh et al. 2024) and long prose
for perplexity by position. Every document is sized with the model's own tokenizer (as the
backends encode it) to fit its length, and records where its needle landed, in tokens."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from itertools import cycle, islice
from typing import Any

from qeval.errors import UserError
from qeval.tasks.long_context import words as w
from qeval.tasks.long_context.prose import chronicle

Encode = Callable[[str], list[int]]


def _fit(build: Callable[[int], str], encode: Encode, budget: int, what: str) -> tuple[int, str, int]:
    """The most filler units `n` for which `build(n)` encodes to at most `budget` tokens
    (doubling, then bisection: a few dozen encodes, never one per unit): n, text, tokens."""
    empty = len(encode(build(0)))
    if empty > budget:
        raise UserError(
            f"long_context: {what} needs {empty} tokens before any filler, more than its "
            f"{budget}-token budget: use a longer length"
        )
    lo, hi = 0, 16
    while len(encode(build(hi))) <= budget:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if len(encode(build(mid))) <= budget else (lo, mid)
    text = build(lo)
    return lo, text, len(encode(text))


class _Sentences:
    """The first n sentences (or words) of a stream, drawn once and kept."""

    def __init__(self, stream: Iterator[str]) -> None:
        self._stream, self._seen = stream, []  # type: tuple[Iterator[str], list[str]]

    def __getitem__(self, n: slice) -> list[str]:
        stop = n.stop or 0
        if stop > len(self._seen):
            self._seen += list(islice(self._stream, stop - len(self._seen)))
        return self._seen[n]


def _join(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def passkey_doc(encode: Encode, budget: int, depth: float, rng: random.Random) -> dict[str, Any]:
    """A passkey prompt of at most `budget` tokens: the header, the filler with the needle after
    `round(depth x sentences)` of its sentences, and the question. `needle_token` is the index,
    in the encoded prompt, of the first token after the text before the needle (the needle's
    first word on a BPE tokenizer, the space before it on a character-level one)."""
    key = str(rng.randint(10000, 99999))
    needle = w.PASSKEY_NEEDLE.format(key=key)
    filler = _Sentences(cycle(w.PASSKEY_FILLER))

    def build(n: int, upto_needle: bool = False) -> str:
        k = round(depth * n)
        before = _join(w.PASSKEY_HEADER, *filler[:k])
        return before if upto_needle else _join(before, needle, *filler[k:n], w.PASSKEY_QUESTION)

    n, text, tokens = _fit(build, encode, budget, "passkey")
    return {
        "text": text,
        "answer": key,
        "depth": depth,
        "needle_token": len(encode(build(n, True))),
        "filler_sentences": n,
        "prompt_tokens": tokens,
        "header_tokens": len(encode(w.PASSKEY_HEADER)),
    }


def multikey_doc(encode: Encode, budget: int, depth: float, rng: random.Random, keys: int) -> dict[str, Any]:
    """A RULER multi-key needle prompt: `keys` needles ("One of the special magic numbers for
    <key> is: <7 digits>.") in generated prose; the first key is asked, its needle after
    `round(depth x sentences)` sentences of the prose, the others at random places."""
    names = rng.sample([f"{a}-{b}" for a in w.ADJECTIVES for b in w.NOUNS], keys)
    values = [str(v) for v in rng.sample(range(1_000_000, 10_000_000), keys)]
    others = [rng.random() for _ in range(keys - 1)]
    prose = _Sentences(chronicle(random.Random(rng.random())))
    header, question = w.MULTIKEY_HEADER, w.MULTIKEY_QUESTION.format(key=names[0])

    def body(n: int) -> tuple[list[str], int]:
        sentences = list(prose[:n])
        spots = sorted(((round(d * n), i) for i, d in enumerate([depth, *others])), reverse=True)
        for pos, i in spots:  # from the end, so earlier positions stay put
            sentences.insert(pos, w.MULTIKEY_NEEDLE.format(key=names[i], value=values[i]))
        asked = next(j for j, s in enumerate(sentences) if f" for {names[0]} is:" in s)
        return sentences, asked

    def build(n: int) -> str:
        sentences, _ = body(n)
        return header + "\n" + " ".join(sentences) + "\n" + question

    n, text, tokens = _fit(build, encode, budget, "multikey")
    sentences, asked = body(n)
    before = header + "\n" + " ".join(sentences[:asked])
    return {
        "text": text,
        "answer": values[0],
        "key": names[0],
        "depth": depth,
        "needle_token": len(encode(before)),
        "keys": keys,
        "prose_sentences": n,
        "prompt_tokens": tokens,
    }


def prose_doc(encode: Encode, budget: int, rng: random.Random) -> dict[str, Any]:
    """A chronicle of at most `budget` tokens: as many words as fit (the last sentence may stop
    short: every token is scored, none is left over)."""
    prose = _Sentences(word for sentence in chronicle(random.Random(rng.random())) for word in sentence.split())
    n, text, tokens = _fit(lambda k: " ".join(prose[:k]), encode, budget, "position_ppl")
    if n == 0:
        raise UserError(f"long_context: position_ppl at {budget} tokens holds no word: use a longer length")
    return {"text": text, "words": n, "tokens": tokens}
