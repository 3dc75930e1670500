"""The cost of qeval's long-context path under a quantized KV cache, against plain prefill
(docs/benchmarks.md, "Long context").

    .venv/bin/python bench/longctx_prefill.py [--model models/smollm2-135m] [--tokens 8192]
        [--kv int4] [--chunk 1024] [--threads 1] [--max-ratio 2.0] [--json OUT]      (make bench-longctx)

One model, loaded once, one process; the same token count on each side, all measured in this run:
(a) plain prefill: one forward pass of the tokens into a DynamicCache, logits of the last
    position only (what a serving engine's prefill costs, with no KV quantization);
(b) scoring: qeval's `loglikelihood_rolling` of a document of that many tokens under the
    quantized KV cache (chunked through the round-trip cache, every position's log-prob,
    top-16 and KL inputs against reference ids);
(c) generation: qeval's `generate` of a passkey prompt of that many tokens minus 10 under the
    quantized KV cache (chunked prefill into QuantizedCache, then up to 10 decoded tokens).
Prints the wall times and the ratios (b)/(a) and (c)/(a); exits 1 when a ratio exceeds
--max-ratio, so the bound is checked where it is measured.

One torch thread by default: on a CPU shared with another process, two threads on two cores
are oversubscribed, and the chunked path's many small operations slow down far more than one
large forward pass does (measured on the 2-core dev machine at 8192 tokens: generation x5.55
with 2 threads beside another benchmark, x1.44 with 1 thread), so the ratio would measure the
neighbour, not qeval. The bound, x2.0, is stated for 8192 tokens (measured x1.27 scoring, x1.44
generation; docs/benchmarks.md). At short lengths the 10 decoded tokens weigh more against the
prefill (x2.19 at 1024 tokens), so tests/e2e/test_longctx_e2e.py checks 1024 tokens against x3.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's qeval, whichever one the environment installed
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "smollm2-135m")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--dtype", default="auto", help="auto: bfloat16 where this CPU runs it natively, else float32")
    ap.add_argument("--kv", default="int4")
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (see above)")
    ap.add_argument("--max-ratio", type=float, default=2.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from qeval.backends.device import dtype_for

    args.dtype = dtype_for(args.dtype, Path(args.model))  # `auto` as a run resolves it on this CPU

    import numpy as np
    import torch

    torch.set_num_threads(args.threads)

    from qeval.backends.base import GenerateRequest, RollingRequest
    from qeval.backends.hf.backend import HFBackend
    from qeval.backends.hf.kv_cache import new_cache
    from qeval.config import ModelSpec, RunConfig
    from qeval.config.long_context import LongContextSpec
    from qeval.config.setups import Setup
    from qeval.tasks.long_context.generate import passkey_doc, prose_doc

    setup = Setup(name=f"kv-{args.kv}", kv_cache=args.kv)
    cfg = RunConfig(
        name="bench",
        model=ModelSpec(path=str(args.model), dtype=args.dtype, max_context=args.tokens),
        setups=[setup],
        long_context=LongContextSpec(chunk_tokens=args.chunk),
    )
    b = HFBackend(cfg, setup, "cpu")
    b.load()
    encode = b.conv.encode
    doc = prose_doc(encode, args.tokens, random.Random(1))["text"]
    tokens = encode(doc)
    inputs = [b.conv.prefix_token_id] + tokens[:-1]  # exactly what the rolling scorer feeds the model
    prompt = passkey_doc(encode, args.tokens - 10, 0.5, random.Random(2))["text"]
    ref = np.tile(np.arange(16, dtype=np.int64), (len(tokens), 1))
    noop = lambda n: None  # noqa: E731

    def timed(fn) -> float:  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    # warm-up: first calls load kernels (quanto's among them); not part of any figure
    short = doc[: len(doc) // 8]
    b.loglikelihood_rolling([RollingRequest(short)], noop)
    b.generate([GenerateRequest(short, ("\n",), 2)], noop)
    with torch.no_grad():
        b.model(input_ids=torch.tensor([inputs[: args.chunk]]), logits_to_keep=1)
        plain = timed(
            lambda: b.model(
                input_ids=torch.tensor([inputs]),
                past_key_values=new_cache(b.model.config, Setup(name="plain")),
                use_cache=True,
                logits_to_keep=1,
            )
        )
    scoring = timed(lambda: b.loglikelihood_rolling([RollingRequest(doc, ref)], noop))
    generation = timed(lambda: b.generate([GenerateRequest(prompt, ("\n",), 10)], noop))
    figures = {
        "model": args.model.name,
        "dtype": args.dtype,
        "kv_cache": args.kv,
        "tokens": len(inputs),
        "prompt_tokens": len(encode(prompt)),
        "chunk": args.chunk,
        "threads": torch.get_num_threads(),
        "plain_prefill_s": round(plain, 2),
        "scoring_s": round(scoring, 2),
        "generation_s": round(generation, 2),
        "scoring_ratio": round(scoring / plain, 3),
        "generation_ratio": round(generation / plain, 3),
        "max_ratio": args.max_ratio,
    }
    print(
        f"{args.model.name}, {args.dtype}, {len(inputs)} tokens, KV {args.kv}, chunks of {args.chunk}, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"plain prefill (DynamicCache, last logits):       {plain:8.2f} s")
    print(f"scoring (round-trip cache, chunked, all logits): {scoring:8.2f} s  x{scoring / plain:.2f}")
    print(f"generation (QuantizedCache chunked prefill + 10): {generation:7.2f} s  x{generation / plain:.2f}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    worst = max(figures["scoring_ratio"], figures["generation_ratio"])
    if worst > args.max_ratio:
        print(f"FAIL: the long-context path costs x{worst:.2f} plain prefill, over the bound x{args.max_ratio}")
        return 1
    print(f"ok: within x{args.max_ratio} of plain prefill")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
