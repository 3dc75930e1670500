"""Long sequences on the transformers backend: chunked prefill, batch 1, logits only where
scored (docs/backends.md, "Long prompts").

A long document goes through the model `chunk` tokens at a time into one cache. Under a
quantized KV cache that cache is the round-trip cache (scoring) or the quantized cache
(generation; both in kv_cache.py), so every chunk attends to K/V of the earlier chunks that came out of the cache,
as before, and the memory of one forward pass is bounded by the chunk: the attention scores
of a chunk against the whole prefix, and the full-vocabulary logits of the scored positions
of one chunk only (an 8k window's logits are 1.6 GB on a 49k vocabulary; a 1024-token chunk's
are 200 MB). Without padding, SDPA takes its causal path. Decoding an 8k prompt token by token
would cost 8k forward passes; chunking costs about one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from qeval.backends.hf import kv_cache
from qeval.config.setups import Setup

#: stats of one run of scored positions: (logits [n, vocab], first scored index) -> arrays
WindowStats = Callable[[torch.Tensor, int], tuple[np.ndarray, ...]]


def score_chunked(
    model: Any, setup: Setup, inputs: list[int], n_scored: int, chunk: int, stats: WindowStats, device: str
) -> list[tuple[np.ndarray, ...]]:
    """Run `inputs` (one window) through the model `chunk` tokens at a time; for the last
    `n_scored` positions, call `stats(logits, offset)` on each chunk's scored logits (offset:
    index of the first of them among the scored positions) and return the pieces in order."""
    cache = (
        kv_cache.round_trip_cache(model.config, setup)
        if setup.quantizes_kv
        else kv_cache.new_cache(model.config, setup)
    )
    first_scored = len(inputs) - n_scored
    pieces = []
    for start in range(0, len(inputs), chunk):
        ids = inputs[start : start + chunk]
        keep = start + len(ids) - max(first_scored, start)  # scored positions are a suffix of each chunk
        out = model(
            input_ids=torch.tensor([ids], device=device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=max(keep, 1),
        )
        if keep > 0:
            pieces.append(stats(out.logits[0, -keep:], max(first_scored, start) - first_scored))
        del out
    return pieces


def prefill_chunked(model: Any, setup: Setup, prefix: list[int], chunk: int, device: str) -> tuple[Any, Any]:
    """Prefill `prefix` into a fresh generation cache (QuantizedCache under a quantized KV
    cache) `chunk` tokens at a time: the cache and the logits of the last position."""
    cache = kv_cache.new_cache(model.config, setup)
    last = None
    for start in range(0, len(prefix), chunk):
        ids = torch.tensor([prefix[start : start + chunk]], device=device)
        last = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
    return cache, last


def greedy_chunked(
    model: Any,
    setup: Setup,
    from_cache: bool,
    ctx: list[int],
    max_new: int,
    chunk: int,
    device: str,
    stops: Callable[[list[int], int], bool],
) -> list[int]:
    """Greedy decoding of one long prompt, as the batched path decodes: in a run without a KV
    setup, the prefill's last position gives the first token; `from_cache` (every setup of a run
    with a KV setup), all but the last context token are prefilled and that token is fed from the
    cache like every later one, so each generated token is predicted from K/V that came out of the
    cache."""
    fresh = not from_cache
    cache, last = prefill_chunked(model, setup, ctx if fresh else ctx[:-1], chunk, device)
    step = None if fresh else ctx[-1]
    generated: list[int] = []
    for _ in range(max_new):
        if step is not None:
            last = model(input_ids=torch.tensor([[step]], device=device), past_key_values=cache, use_cache=True).logits[
                :, -1
            ]
        assert last is not None
        token = int(last[0].argmax())
        generated.append(token)
        if stops(generated, token):
            break
        step = token
    return generated
