"""The performance measurement on transformers (the `hf` backend's `performance()`).

A wave of `level` requests is one batch: one prefill forward over level x input_len tokens
(logits of the last position only, as generation computes them), then output_len - 1 greedy
decode steps from the prefilled cache (the setup's own cache: DynamicCache, or its
QuantizedCache), end of sequence ignored so every request generates exactly output_len
tokens. Times are wall clock (`time.perf_counter`), the device synchronized before each read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from qeval.backends.workload import Measurement, Pass, Wave, Workload, random_prompt_ids, timed_waves

SOURCES = {
    "requests_per_s": "requests / wall time of the level's waves (each wave one batch: a prefill forward, then "
    "output_len - 1 greedy decode steps, EOS ignored; time.perf_counter, device synchronized)",
    "output_tokens_per_s": "generated tokens / wall time of the level's waves (as requests_per_s)",
    "prefill_tokens_per_s": "prompt tokens / wall time of the prefill forwards (the whole batch's prompts in one "
    "forward, last-position logits and the first token included)",
    "decode_tokens_per_s": "tokens generated after the first / wall time of the decode steps (batch x steps)",
    "ttft": "time to first token: the wave's prefill forward and first greedy token (one batch: every request "
    "of a wave shares it); percentile over the level's requests",
    "tpot": "time per output token after the first: the wave's decode time / (output_len - 1); percentile over "
    "the level's requests",
    "e2e": "request latency, submission to last token: the wave's wall time; percentile over the level's requests",
}


def _sync(device: str) -> Callable[[], None]:
    if device == "cuda":
        return torch.cuda.synchronize
    return lambda: None


#: a measurement whose requests follow the config's workload (performance.from_workload)
WORKLOAD_NOTE = (
    "request lengths from the workload ({source}): each wave is one batch padded to its longest prompt "
    "(every prompt is computed at that length, as padding computes it) and decoded to its longest "
    "output; a request's latency ends at its own last token. Static batches, no continuous batching "
    "and no arrivals: goodput under an SLO is not measured on hf (the serving phase serves vLLM)"
)


@torch.no_grad()  # not inference_mode: quanto's packed int4 weights fail on inference tensors
def measure(model: Any, tok: Any, new_cache: Callable[[], Any], device: str, workload: Workload) -> Measurement:
    """Every level of `workload`: warm-up passes (prompts of seed + 1), then timed repeats (prompts
    of seed) in alternating order."""
    special = set(getattr(tok, "all_special_ids", []) or [])
    sync = _sync(device)
    head = list(tok("").input_ids)  # the special tokens the tokenizer adds itself (BOS, or none)

    def serve(p: Pass) -> list[Wave]:
        sizes = workload.request_lengths(0, p.n)
        prompts = random_prompt_ids(model.config.vocab_size, special, p.n, max(i for i, _ in sizes), p.seed, head)
        return [
            _wave(model, new_cache, prompts[i : i + p.level], sizes[i : i + p.level], device, sync)
            for i in range(0, p.n, p.level)
        ]

    waves = timed_waves(workload, serve)
    notes = [WORKLOAD_NOTE.format(source=workload.lengths_source)] if workload.lengths else []
    return Measurement(waves, dict(SOURCES), notes)


def _wave(
    model: Any,
    new_cache: Callable[[], Any],
    prompts: list[list[int]],
    sizes: list[tuple[int, int]],
    device: str,
    sync: Callable[[], None],
) -> Wave:
    """One batch: every prompt at the wave's longest prompt length (the compute of a padded batch),
    decode steps to the wave's longest output; each request done at its own last token."""
    width = max(i for i, _ in sizes)
    ids = torch.tensor([p[:width] for p in prompts], device=device)
    cache = new_cache()
    sync()
    t0 = time.perf_counter()
    logits = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
    nxt = logits.argmax(-1)
    sync()
    t1 = time.perf_counter()
    outs = [o for _, o in sizes]
    done_at = {1: t1}  # tokens generated -> when (the first comes with the prefill)
    for step in range(2, max(outs) + 1):
        nxt = model(input_ids=nxt[:, None], past_key_values=cache, use_cache=True).logits[:, -1].argmax(-1)
        if step in outs:
            sync()
            done_at[step] = time.perf_counter()
    sync()
    t2 = time.perf_counter()
    c, steps = len(prompts), max(outs) - 1
    return Wave(
        elapsed_s=t2 - t0,
        prompt_tokens=sum(i for i, _ in sizes),
        output_tokens=sum(outs),
        prefill_s=t1 - t0,
        decode_tokens_per_s=sum(o - 1 for o in outs) / (t2 - t1) if steps else 0.0,
        ttft_s=[t1 - t0] * c,
        tpot_s=[(done_at[o] - t1) / (o - 1) for o in outs],
        e2e_s=[done_at[o] - t0 for o in outs],
    )
