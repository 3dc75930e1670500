"""qeval's own overhead over the raw vLLM engine, on the same requests.

    .venv-vllm/bin/python bench/vllm_overhead.py [--model models/qeval-tiny] [--tasks compare_mc,ppl] [--repeat 3]

One engine, loaded once. For each task, best of --repeat after a warm-up:
(a) qeval's scoring of the task through its vLLM backend (tokenisation, the `generate`
call, turning prompt log-probs into results), and the engine's share of it (the time
inside `LLM.generate` during that same scoring): overhead = (a - engine) / engine;
(b) as a cross-check, `LLM.generate` alone on the exact token prompts and sampling
parameters qeval sends. All measured in this one run on this machine.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "qeval-tiny")
    ap.add_argument("--tasks", default="compare_mc,ppl")
    ap.add_argument("--dtype", default="auto", help="auto: bfloat16 where this CPU runs it natively, else float32")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from qeval.backends.device import dtype_for

    args.dtype = dtype_for(args.dtype, Path(args.model))  # `auto` as a run resolves it on this CPU

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from qeval.backends.tokens import encode_pair, rolling_windows, truncate
    from qeval.backends.vllm import backend as qv
    from qeval.config import ModelSpec, RunConfig
    from qeval.config.setups import Setup
    from qeval.tasks import load_task
    from qeval.tasks.scoring import score_task

    setup = Setup(name="bf16")
    cfg = RunConfig(
        name="bench",
        model=ModelSpec(path=str(args.model), dtype=args.dtype, max_context=256),
        backend="vllm",
        setups=[setup],
        tasks=args.tasks.split(","),
    )
    backend = qv.VLLMBackend(cfg, setup, "cpu")
    backend.load()
    inside: list[float] = []
    generate = backend.llm.generate

    def timed_generate(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return generate(*a, **kw)
        finally:
            inside.append(time.perf_counter() - t0)

    backend.llm.generate = timed_generate
    print(f"model {args.model.name}, {args.dtype}, vLLM CPU build, {os.cpu_count()} CPUs")
    for name in args.tasks.split(","):
        task = load_task(name, ROOT / "tasks")
        if task.spec.output_type == "multiple_choice":
            reqs = [(task.text(d), task.spec.target_delimiter + c) for d in task.docs for c in task.choices(d)]
            prompts = [sum(truncate(*encode_pair(backend.conv, c, x), 256), []) for c, x in reqs]
            k, flat = 1, False
        else:
            conv = backend.conv
            prompts = [
                c + p
                for d in task.docs
                for c, p in rolling_windows(conv.encode(task.text(d)), conv.prefix_token_id, 256)
            ]
            k, flat = qv.TOPK, True
        # exactly the parameters qeval's backend sends for this kind of task
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=k, detokenize=False, flat_logprobs=flat)
        token_prompts = [TokensPrompt(prompt_token_ids=p) for p in prompts]

        def raw(token_prompts: list[Any] = token_prompts, params: Any = params) -> None:
            generate(token_prompts, params, use_tqdm=False)

        def ours(task: Any = task) -> None:
            score_task(backend, task, lambda n: None)

        raw(), ours()  # warm-up
        best_raw = min(_timed(raw) for _ in range(args.repeat))
        runs = []
        for _ in range(args.repeat):
            inside.clear()
            total = _timed(ours)
            runs.append((total, sum(inside)))
        total, engine = min(runs)
        print(
            f"  {name:<11} {len(prompts)} requests: qeval {total:6.2f} s, of which engine {engine:6.2f} s "
            f"-> overhead {100 * (total - engine) / engine:+.1f}%   (engine alone: {best_raw:6.2f} s)"
        )


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
