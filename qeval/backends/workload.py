"""The workload of the performance phase: prompt and output lengths, requests per level, and
the concurrency levels, `max` resolved from the setup's memory budget (the one capacity
formula, qeval/memory/capacity.py, as the setup's `memory.max_concurrency` reports it)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from qeval.config.performance import PerfSpec


@dataclass(frozen=True)
class Workload:
    """What a backend's `performance()` serves: every level's requests in waves of `level`
    requests submitted at once, `warmup` untimed passes then `repeats` timed ones."""

    input_len: int
    output_len: int
    num_requests: int
    levels: tuple[int, ...]
    repeats: int
    warmup: int
    seed: int
    #: how each level was chosen (e.g. "max: the budget allows 24.3 sequences")
    levels_source: str = ""
    #: per request (prompt tokens, output tokens), cycled, from the config's workload
    #: (`performance.from_workload`); empty: every request is input_len / output_len
    lengths: tuple[tuple[int, int], ...] = ()
    #: where `lengths` came from (the workload's source)
    lengths_source: str = ""

    def request_lengths(self, first: int, n: int) -> list[tuple[int, int]]:
        """Requests first .. first + n - 1: their (prompt, output) lengths."""
        if not self.lengths:
            return [(self.input_len, self.output_len)] * n
        return [self.lengths[(first + i) % len(self.lengths)] for i in range(n)]

    def requests_at(self, level: int) -> int:
        """Requests served at `level`: num_requests, at least one wave, rounded up to whole waves."""
        return math.ceil(max(self.num_requests, level) / level) * level

    def order(self, repeat: int) -> list[int]:
        """Levels in the order of one pass: ascending, then descending on the next (ABBA), so a
        drift in the machine's load does not favour one level."""
        return list(self.levels) if repeat % 2 == 0 else list(reversed(self.levels))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"levels": list(self.levels), "lengths": [list(x) for x in self.lengths]}


@dataclass
class Wave:
    """One wave: `len(ttft_s)` requests submitted at once and served to their last token."""

    elapsed_s: float  # wall time from submission to the last token of the wave
    prompt_tokens: int
    output_tokens: int
    prefill_s: float  # time in which the wave's prompts were prefilled (see the backend's sources)
    decode_tokens_per_s: float  # the wave's decode rate: sum over its requests of 1 / time per output token
    ttft_s: list[float] = field(default_factory=list)  # per request: time to first token
    tpot_s: list[float] = field(default_factory=list)  # per request: time per output token after the first
    e2e_s: list[float] = field(default_factory=list)  # per request: submission to last token


@dataclass
class Measurement:
    """A backend's raw timings: per level, per timed repeat, the waves; and how each figure
    was taken (`sources`, by figure name), plus anything a reader must know (`notes`)."""

    waves: dict[int, list[list[Wave]]]
    sources: dict[str, str]
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Pass:
    """One level served once: `n` requests in waves of `level`, on prompts drawn with `seed`."""

    level: int
    n: int
    timed: bool
    seed: int


def schedule(workload: Workload) -> Iterator[Pass]:
    """The measurement schedule every backend follows: `warmup` untimed passes (prompts of seed +
    1), then `repeats` timed ones (prompts of seed), the levels of each pass in alternating order."""
    for rep in range(workload.warmup + workload.repeats):
        timed = rep >= workload.warmup
        for level in workload.order(rep):
            yield Pass(level, workload.requests_at(level), timed, workload.seed if timed else workload.seed + 1)


def timed_waves(workload: Workload, serve: Callable[[Pass], list[Wave]]) -> dict[int, list[list[Wave]]]:
    """Run `serve` on every pass of the schedule; the timed passes' waves, by level."""
    waves: dict[int, list[list[Wave]]] = {level: [] for level in workload.levels}
    for p in schedule(workload):
        done = serve(p)
        if p.timed:
            waves[p.level].append(done)
    return waves


def resolve_levels(spec: PerfSpec, budget_concurrency: float | None, engine_limit: int | None) -> tuple[list[int], str]:
    """The concurrency levels, `max` resolved: floor(the budget's max_concurrency), capped at
    spec.max_concurrency and at the engine's own limit; and one line saying how."""
    why = []
    if budget_concurrency is None:
        top, why = 1, ["max: no memory figures to size the budget, so 1"]
    else:
        top = max(int(math.floor(budget_concurrency)), 1)
        why.append(
            f"max: the budget allows {budget_concurrency:g} sequences"
            + (" (less than one: 1 is timed)" if budget_concurrency < 1 else "")
        )
        if top > spec.max_concurrency:
            top = spec.max_concurrency
            why.append(f"capped at performance.max_concurrency = {spec.max_concurrency}")
    if engine_limit is not None and top > engine_limit:
        top = engine_limit
        why.append(f"capped at the engine's max_num_seqs = {engine_limit}")
    levels = sorted({top if x == "max" else int(x) for x in spec.concurrency})
    if engine_limit is not None and levels[-1] > engine_limit:
        raise ValueError(
            f"concurrency {levels[-1]} exceeds the engine's max_num_seqs ({engine_limit}): "
            "raise engine.max_num_seqs or lower performance.concurrency"
        )
    return levels, "; ".join(why) if "max" in spec.concurrency else "as configured"


def workload_for(
    spec: PerfSpec,
    levels: list[int],
    levels_source: str,
    seed: int,
    lengths: tuple[tuple[int, int], ...] = (),
    lengths_source: str = "",
) -> Workload:
    return Workload(
        spec.input_len,
        spec.output_len,
        spec.num_requests,
        tuple(levels),
        spec.repeats,
        spec.warmup,
        seed,
        levels_source,
        lengths,
        lengths_source,
    )


def random_prompt_ids(
    vocab_size: int, special_ids: set[int], n: int, length: int, seed: int, head: list[int]
) -> list[list[int]]:
    """n prompts of exactly `length` ids: `head` (the special tokens the tokenizer adds itself,
    e.g. BOS), then ids drawn uniformly from the vocabulary without special tokens, as vLLM's
    random benchmark dataset draws them (the engine then adds the same special tokens)."""
    allowed = np.array([i for i in range(vocab_size) if i not in special_ids])
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, len(allowed), size=(n, length - len(head)))
    return [list(head) + allowed[r].tolist() for r in rows]
