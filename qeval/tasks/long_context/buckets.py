"""Perplexity by token position: one document's loss (and KL to the baseline) summed over
buckets of token position, stored with its sample record so that the comparison can pair
documents bucket by bucket (qeval/tasks/long_context/results.py), and the comparison of one bucket
that both long context's prompt positions and the generation's positions use."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from qeval.analysis.stats import paired_ratio
from qeval.results.long_context import NllBucket
from qeval.results.samples import BucketSums, PositionSums

B = TypeVar("B", bound=NllBucket)


def bucket_sums(
    edges: list[int], token_logprobs: np.ndarray, kl: np.ndarray | None, top1: np.ndarray | None
) -> list[PositionSums]:
    """Per bucket [edges[i], edges[i+1]) of predicted-token positions (0 = the document's first
    token): tokens, summed NLL (nats) and, against a baseline, summed KL and top-1 agreements.
    Tokens past the last edge count in the last bucket."""
    n = len(token_logprobs)
    out = []
    for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        hi = max(hi, n) if i == len(edges) - 2 else hi
        sl = slice(min(lo, n), min(hi, n))
        rec = PositionSums(
            start=lo, end=hi, tokens=sl.stop - sl.start, nll=float(-token_logprobs[sl].sum(dtype=np.float64))
        )
        if kl is not None and top1 is not None:
            rec.kl, rec.top1 = float(kl[sl].sum(dtype=np.float64)), int(top1[sl].sum())
        out.append(rec)
    return out


def bucket_comparison(
    tok: np.ndarray, nll: np.ndarray, base_nll: np.ndarray | None, sums: Sequence[BucketSums], seed: int
) -> dict[str, Any]:
    """The fields a position bucket adds against the baseline (an update for its model): the
    baseline's token-weighted mean NLL and the paired difference with a t-interval over documents
    (stats.paired_ratio), when `base_nll` is given; and the KL and top-1 agreement per token, when
    every document's bucket sums (`sums`) carry them."""
    update: dict[str, Any] = {}
    if base_nll is not None:
        cmp = paired_ratio(base_nll, nll, tok, "nll", seed)
        update |= {
            "baseline_nll": float(base_nll.sum() / tok.sum()),
            "delta": cmp.delta,
            "ci": cmp.ci,
            "ci_method": "t",
            "p_value": cmp.p_value,
        }
    kl = [s.kl for s in sums if s.kl is not None]
    top1 = [s.top1 for s in sums if s.top1 is not None]
    if len(kl) == len(top1) == len(sums):
        update |= {"kl": float(sum(kl) / tok.sum()), "top1_agreement": float(sum(top1) / tok.sum())}
    return update


def compared_bucket(
    model: type[B], sums: Sequence[BucketSums], nll: np.ndarray, base_nll: np.ndarray | None, seed: int
) -> B:
    """One position bucket over the documents whose bucket sums are `sums` (each document's
    tokens there, `nll` its summed NLL, `base_nll` the baseline's on the same tokens or None): its
    span (the first document's), documents, tokens and token-weighted mean NLL, and against the
    baseline what `bucket_comparison` adds."""
    tok = np.array([s.tokens for s in sums], dtype=float)
    first = sums[0]
    bucket = model(
        start=first.start, end=first.end, documents=len(sums), tokens=int(tok.sum()), nll=float(nll.sum() / tok.sum())
    )
    return bucket.model_copy(update=bucket_comparison(tok, nll, base_nll, sums, seed))
