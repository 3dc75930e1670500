"""Sampled decoding on transformers, one random stream per row.

Each sampled row draws from its own `torch.Generator` seeded with its request's seed, one draw
per generated token, so a row's text depends on its seed and its own logits only, not on which
rows share its batch or in what order. What batching can still change: the logits themselves
differ in the last bits between batch shapes (left padding changes the matmul shapes), and a
draw that falls within that difference of a token boundary picks another token; from there the
texts differ. Same seed, same setup, same batch composition (a rerun) gives the same text.
Filtering follows transformers' warpers: temperature, then top-k, then top-p (nucleus, the
most likely token always kept).
"""

from __future__ import annotations

import torch

from qeval.backends.base import Sampling


def generator(sampling: Sampling | None) -> torch.Generator | None:
    """The row's own random stream (CPU: the same draws on every device)."""
    return None if sampling is None else torch.Generator().manual_seed(sampling.seed)


def filtered_probs(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Next-token probabilities of one row after temperature, top-k and top-p."""
    scores = logits.float().cpu() / s.temperature
    if 0 < s.top_k < scores.shape[-1]:
        kth = torch.topk(scores, s.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if s.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=True)
        cumulative = sorted_scores.softmax(-1).cumsum(-1)
        drop = cumulative - sorted_scores.softmax(-1) >= s.top_p  # the mass before a token already reaches top_p
        scores = scores.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return scores.softmax(-1)


def next_tokens(
    last: torch.Tensor, sampling: list[Sampling | None], generators: list[torch.Generator | None]
) -> torch.Tensor:
    """The next token of each row: argmax for greedy rows, one draw from its own stream for sampled ones."""
    nxt = last.argmax(-1).cpu()
    for b, (s, g) in enumerate(zip(sampling, generators, strict=True)):
        if s is not None:
            nxt[b] = int(torch.multinomial(filtered_probs(last[b], s), 1, generator=g))
    return nxt
