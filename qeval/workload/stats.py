"""What a workload's lengths imply before any engine starts (docs/performance.md, "The workload
and the plan"):

- percentiles by nearest rank: the p-th percentile of n values is the ceil(p x n / 100)-th smallest,
  an actual request's length, so at most (100 - p)% of requests are longer than it;
- max-model-len: the chosen percentile of prompt + output, rounded up to a whole number of KV
  blocks (never above the model's context); the share of requests longer than it is refused
  (vLLM refuses a request whose prompt + max_tokens exceeds max-model-len);
- KV blocks per request from its actual length, as paged attention allocates them:
  ceil((prompt + output) / block_size), over the requests max-model-len admits;
- prefix sharing: within a group (one prefix_id or conversation_id), the first request in the
  trace's order computes the prefix; every later one reuses floor(prefix_tokens / block_size)
  blocks (vLLM's prefix cache shares whole blocks only).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

from qeval.workload.trace import Request, Trace

#: the percentiles every length summary shows
SHOWN = (50, 90, 95, 99)


def nearest_rank(sorted_values: list[int], p: float) -> int:
    """The p-th percentile of `sorted_values` (ascending, not empty) by nearest rank, computed in
    exact fractions (0.57 x 100 must be rank 57, not 56.99...)."""
    rank = math.ceil(Fraction(str(p)) * len(sorted_values) / 100)
    return sorted_values[min(max(rank, 1), len(sorted_values)) - 1]


@dataclass(frozen=True)
class Lengths:
    """A length distribution in tokens: nearest-rank percentiles, the maximum and the mean."""

    p50: int
    p90: int
    p95: int
    p99: int
    max: int
    mean: float

    @classmethod
    def of(cls, values: list[int]) -> Lengths:
        s = sorted(values)
        p50, p90, p95, p99 = (nearest_rank(s, p) for p in SHOWN)
        return cls(p50, p90, p95, p99, s[-1], round(sum(s) / len(s), 2))


@dataclass(frozen=True)
class Blocks:
    """KV blocks per admitted request: the mean, at the chosen percentile, and the most."""

    mean: float
    at_percentile: int
    max: int


@dataclass(frozen=True)
class PrefixSharing:
    """What prefix caching saves over the admitted requests."""

    groups: int
    #: requests that reuse a prefix an earlier request of their group computed
    requests_sharing: int
    blocks_saved: int
    #: blocks_saved over all the admitted requests' blocks
    share_saved: float
    #: mean blocks per admitted request once shared blocks are counted once
    mean_blocks_with_cache: float


@dataclass(frozen=True)
class WorkloadStats:
    """The workload's plan, engine-free: lengths, max-model-len and what it refuses, blocks, sharing."""

    requests: int
    prompt: Lengths
    output: Lengths
    total: Lengths
    percentile: float
    block_size: int
    #: the percentile of prompt + output, before rounding
    percentile_tokens: int
    max_model_len: int
    refused: int
    refused_share: float
    blocks: Blocks
    prefix: PrefixSharing | None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def blocks_of(tokens: int, block_size: int) -> int:
    """Blocks paged attention holds for `tokens` tokens."""
    return -(-tokens // block_size)


def max_model_len(totals: list[int], percentile: float, block_size: int, context: int | None) -> tuple[int, int]:
    """(the percentile of `totals`, it rounded up to whole blocks and held to `context`)."""
    at = nearest_rank(sorted(totals), percentile)
    rounded = blocks_of(at, block_size) * block_size
    return at, min(rounded, context) if context is not None else rounded


def prefix_sharing(requests: list[Request], block_size: int) -> PrefixSharing | None:
    """Blocks the prefix cache saves (module docstring); None when no request names a group."""
    seen: set[str] = set()
    sharing = saved = 0
    for r in requests:
        if r.group is None:
            continue
        if r.group in seen:
            sharing += 1
            saved += r.prefix_tokens // block_size
        seen.add(r.group)
    if not seen:
        return None
    total = sum(blocks_of(r.total, block_size) for r in requests)
    return PrefixSharing(len(seen), sharing, saved, round(saved / total, 4), round((total - saved) / len(requests), 2))


def summarize(trace: Trace, percentile: float, block_size: int, context: int | None = None) -> WorkloadStats:
    """The plan of `trace` at `percentile` with KV blocks of `block_size` tokens."""
    reqs = trace.requests
    totals = [r.total for r in reqs]
    at, mml = max_model_len(totals, percentile, block_size, context)
    admitted = [r for r in reqs if r.total <= mml]
    refused = len(reqs) - len(admitted)
    blocks = sorted(blocks_of(r.total, block_size) for r in admitted)
    return WorkloadStats(
        requests=len(reqs),
        prompt=Lengths.of([r.input_tokens for r in reqs]),
        output=Lengths.of([r.output_tokens for r in reqs]),
        total=Lengths.of(totals),
        percentile=percentile,
        block_size=block_size,
        percentile_tokens=at,
        max_model_len=mml,
        refused=refused,
        refused_share=round(refused / len(reqs), 4),
        blocks=Blocks(round(sum(blocks) / len(blocks), 2), nearest_rank(blocks, percentile), blocks[-1]),
        prefix=prefix_sharing(admitted, block_size),
    )
