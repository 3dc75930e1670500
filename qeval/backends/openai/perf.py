"""The performance measurement through the API, the way users load-test a server: at each
concurrency level, waves of `level` streaming `/v1/completions` requests sent at once, every
request exactly `input_len` random token ids in (workload.random_prompt_ids: the same draw
for every setup) and `output_len` tokens out (`ignore_eos`). Times are the client's
(`time.perf_counter` at each server-sent event), as `vllm bench serve` measures them.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qeval.backends.openai.scoring import answer_bytes, completion_tokens
from qeval.backends.workload import Measurement, Pass, Wave, Workload, random_prompt_ids, timed_waves

SOURCES = {
    "requests_per_s": "requests / wall time of the level's waves (each wave `level` streaming /v1/completions "
    "requests sent at once, timed by the client from the first send to the last event)",
    "output_tokens_per_s": "generated tokens (the server's usage.completion_tokens) / wall time of the level's waves",
    "prefill_tokens_per_s": "prompt tokens / the span from the wave's send to its last first token (client "
    "clock; the server may interleave decode steps, so a lower bound)",
    "decode_tokens_per_s": "sum over the wave's requests of 1 / time per output token (they decode together)",
    "ttft": "time to first token per request: send to the first streamed token (client clock, as "
    "`vllm bench serve` takes TTFT); percentile over the level's requests",
    "tpot": "time per output token after the first per request: (last event - first token) / (tokens - 1), "
    "client clock (`vllm bench serve`'s TPOT); percentile over the level's requests",
    "e2e": "request latency per request: send to the stream's last event (client clock); percentile over the "
    "level's requests",
}


@dataclass
class Timed:
    """One streamed request: when it was sent, each token-bearing event's arrival, the tokens."""

    sent: float
    events: list[float] = field(default_factory=list)
    end: float = 0.0
    output_tokens: int = 0

    @property
    def ttft(self) -> float:
        return self.events[0] - self.sent

    @property
    def itl(self) -> list[float]:
        """Inter-token latencies: the gaps between successive token-bearing events."""
        return list(np.diff(self.events))

    @property
    def tpot(self) -> float:
        return (self.end - self.events[0]) / max(self.output_tokens - 1, 1)


def stream_one(stream: Callable[[dict[str, Any]], Any], body: dict[str, Any]) -> Timed:
    """Send one streaming request; its timings. A token count that cannot be true (below 0,
    above max_tokens) is a BadAnswer."""
    t = Timed(sent=time.perf_counter())
    for at, event in stream(body):
        choices = event.get("choices") or []
        if isinstance(choices, list) and choices and isinstance(choices[0], dict) and choices[0].get("text"):
            t.events.append(at)
        usage = event.get("usage")
        if usage:
            t.output_tokens = completion_tokens(usage, body.get("max_tokens"))
        t.end = at
    if not t.events:
        raise RuntimeError("a streamed completion returned no token")
    return t


def bench_body(model: str, prompt: list[int], output_len: int) -> dict[str, Any]:
    """One timed request: exactly output_len tokens (vLLM's ignore_eos), usage in the stream."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }


def wave_of(timed: list[Timed], started: float, prompt_tokens: int) -> Wave:
    ends = max(t.end for t in timed)
    tpot = [t.tpot for t in timed]
    return Wave(
        elapsed_s=ends - started,
        prompt_tokens=prompt_tokens,
        output_tokens=sum(t.output_tokens for t in timed),
        prefill_s=max(t.events[0] for t in timed) - started,
        decode_tokens_per_s=sum(1 / x for x in tpot if x > 0),
        ttft_s=[t.ttft for t in timed],
        tpot_s=tpot,
        e2e_s=[t.end - t.sent for t in timed],
    )


def run_wave(client: Any, model: str, prompts: list[list[int]], output_len: int) -> tuple[Wave, list[float]]:
    """One wave: every prompt sent at once as a streaming request; its figures and inter-token gaps."""
    bodies = [bench_body(model, p, output_len) for p in prompts]
    started = time.perf_counter()

    def send(body: dict[str, Any]) -> Timed:  # each stream bounded by what its request can need
        return stream_one(functools.partial(client.stream, "/completions", max_bytes=answer_bytes(body)), body)

    results = client.map(send, bodies, len(bodies))
    return wave_of(results, started, sum(len(p) for p in prompts)), [x for r in results for x in r.itl]


def measure(client: Any, model: str, tok: Any, workload: Workload) -> Measurement:
    """Every level of `workload`: warm-up passes (prompts of seed + 1), then timed repeats (seed),
    levels in alternating order."""
    special = set(getattr(tok, "all_special_ids", []) or [])
    head = list(tok("").input_ids)
    vocab = len(tok)
    itl: list[float] = []

    def serve(p: Pass) -> list[Wave]:
        prompts = random_prompt_ids(vocab, special, p.n, workload.input_len, p.seed, head)
        done = []
        for i in range(0, p.n, p.level):
            wave, gaps = run_wave(client, model, prompts[i : i + p.level], workload.output_len)
            done.append(wave)
            if p.timed:
                itl.extend(gaps)
        return done

    waves = timed_waves(workload, serve)
    notes = []
    if itl:
        notes.append(
            f"inter-token latency (client clock, between streamed events, all levels): median "
            f"{np.median(itl) * 1e3:.2f} ms, p90 {np.percentile(itl, 90) * 1e3:.2f} ms"
        )
    return Measurement(waves, dict(SOURCES), notes)
