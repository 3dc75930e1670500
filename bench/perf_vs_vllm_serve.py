"""The openai backend's performance measurement against `vllm bench serve`, on one launched
server, with the same prompts, in one run.

    .venv-vllm/bin/python bench/perf_vs_vllm_serve.py [--model models/qeval-tiny] [--num-prompts 32]
        [--input-len 64] [--output-len 32] [--concurrency 4] [--repeats 3] [--json OUT]

One `vllm serve`, launched as the openai backend launches it for a setup (the vllm backend's
translation table, 127.0.0.1, a free port; qeval/backends/openai/support.py). Then, ABBA over
--repeats after one warm-up of each side:

- `vllm bench serve --backend vllm --endpoint /v1/completions --dataset-name random
  --random-input-len I --random-output-len O --num-prompts N --max-concurrency C
  --request-rate inf --ignore-eos --temperature 0 --seed S` (vllm.benchmarks.serve.main, the
  code the subcommand runs: the console script dies on a version lookup in the CPU build);
- qeval's measurement (qeval.backends.openai.perf.run_wave) on the *same prompts*: the
  bench's random-dataset samples for that seed, tokenised as the server tokenises a text
  prompt, sent in waves of C streaming requests.

Compared: requests/s, output tokens/s, and the medians of TTFT, TPOT and request latency.
Each figure is the median of the repeats with its range. Agreement: the medians within 5%;
where they are not, but either side's own spread (max / min - 1) exceeds 5%, "inconclusive"
(the machine's noise is larger than the difference), else "disagree". The bench keeps C
requests in flight (a new one as soon as one finishes), qeval's waves wait for their slowest
request; with `ignore_eos` every request has the same length, so the two schedules match up
to the stragglers of each wave.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from perf_vs_vllm_bench import summary, verdict  # noqa: E402 - bench/ is this script's folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "qeval-tiny")
    ap.add_argument("--dtype", default="auto", help="auto: bfloat16 where this CPU runs it natively, else float32")
    ap.add_argument("--max-context", type=int, default=256)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--fail-on-disagree", action="store_true", help="exit 1 when a figure disagrees (beyond noise)")
    args = ap.parse_args()

    import vllm.benchmarks.serve as S
    from transformers import AutoTokenizer
    from vllm.benchmarks.datasets import get_samples
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from qeval.backends.device import dtype_for
    from qeval.backends.openai import perf
    from qeval.backends.openai.client import Client
    from qeval.backends.openai.launch import HOST, LaunchedServer, free_port
    from qeval.backends.openai.support import serve_argv
    from qeval.config import ModelSpec, RunConfig
    from qeval.config.server import ServerSpec
    from qeval.config.setups import Setup

    dtype = dtype_for(args.dtype, Path(args.model))
    setup = Setup(name="bench")
    cfg = RunConfig(
        name="bench",
        model=ModelSpec(path=str(args.model), dtype=dtype, max_context=args.max_context),
        backend="openai",
        server=ServerSpec(mode="launch", model="qeval"),
        setups=[setup],
        tasks=["x"],
        seed=args.seed,
    )
    port = free_port()
    argv, _ = serve_argv(cfg, setup, "cpu", port, HOST)
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"qeval-bench-serve-{port}.log"
    t0 = time.perf_counter()
    server = LaunchedServer(argv, {}, log)
    client = Client(f"http://{HOST}:{port}/v1", timeout_s=600)
    try:
        server.wait_healthy(client.healthy, 900)
        start_s = time.perf_counter() - t0
        n, c = args.num_prompts, args.concurrency
        bench_argv = [
            "--backend",
            "vllm",
            "--base-url",
            f"http://{HOST}:{port}",
            "--endpoint",
            "/v1/completions",
            "--model",
            str(args.model),
            "--served-model-name",
            "qeval",
            "--dataset-name",
            "random",
            "--random-input-len",
            str(args.input_len),
            "--random-output-len",
            str(args.output_len),
            "--num-prompts",
            str(n),
            "--max-concurrency",
            str(c),
            "--request-rate",
            "inf",
            "--ignore-eos",
            "--temperature",
            "0",
            "--seed",
            str(args.seed),
            "--disable-tqdm",
            "--percentile-metrics",
            "ttft,tpot,itl,e2el",
            "--metric-percentiles",
            "50",
        ]
        parser = FlexibleArgumentParser()
        S.add_cli_args(parser)
        tok = AutoTokenizer.from_pretrained(str(args.model))
        # the bench's own prompts for this seed, as token ids the server makes of a text prompt
        texts = [r.prompt for r in get_samples(parser.parse_args(bench_argv), tok)]
        prompts = [list(tok(t).input_ids) for t in texts]

        def bench() -> dict[str, float]:
            out = S.main(parser.parse_args(bench_argv))
            return {
                "requests_per_s": out["request_throughput"],
                "output_tokens_per_s": out["output_throughput"],
                "ttft_p50_s": out["median_ttft_ms"] / 1e3,
                "tpot_p50_s": out["median_tpot_ms"] / 1e3,
                "e2e_p50_s": out["median_e2el_ms"] / 1e3,
            }

        def ours() -> dict[str, float]:
            waves = [perf.run_wave(client, "qeval", prompts[i : i + c], args.output_len)[0] for i in range(0, n, c)]
            elapsed = sum(w.elapsed_s for w in waves)
            return {
                "requests_per_s": n / elapsed,
                "output_tokens_per_s": sum(w.output_tokens for w in waves) / elapsed,
                "ttft_p50_s": statistics.median(x for w in waves for x in w.ttft_s),
                "tpot_p50_s": statistics.median(x for w in waves for x in w.tpot_s),
                "e2e_p50_s": statistics.median(x for w in waves for x in w.e2e_s),
            }

        ours(), bench()  # warm-up of each side
        raw: dict[str, list[dict[str, float]]] = {"qeval": [], "vllm bench serve": []}
        for rep in range(args.repeats):
            order = [("qeval", ours), ("vllm bench serve", bench)]
            for side, fn in order if rep % 2 == 0 else order[::-1]:  # ABBA
                raw[side].append(fn())
    finally:
        server.stop()
    rows = []
    for figure in ("requests_per_s", "output_tokens_per_s", "ttft_p50_s", "tpot_p50_s", "e2e_p50_s"):
        q = summary([r[figure] for r in raw["qeval"]])
        b = summary([r[figure] for r in raw["vllm bench serve"]])
        ratio, word = verdict(q, b)
        rows.append({"figure": figure, "qeval": q, "vllm_bench_serve": b, "ratio": ratio, "verdict": word})
    print(
        f"model {args.model.name}, {dtype}, vllm serve (CPU build), {os.cpu_count()} CPUs; server start "
        f"{start_s:.0f} s, whole run {time.perf_counter() - t0:.0f} s; {n} prompts of {args.input_len} + "
        f"{args.output_len} tokens at concurrency {c}, seed {args.seed}; median of {args.repeats} repeats (ABBA)"
    )
    print(f"{'figure':<22} {'vllm bench serve':>28} {'qeval':>28} {'qeval / bench':>14}  verdict")
    for r in rows:

        def fmt(s: dict[str, Any]) -> str:
            return f"{s['median']:.4g} [{s['min']:.4g}-{s['max']:.4g}]"

        print(
            f"{r['figure']:<22} {fmt(r['vllm_bench_serve']):>28} {fmt(r['qeval']):>28} {r['ratio']:>14.3f}  "
            f"{r['verdict']} (spreads {r['vllm_bench_serve']['spread']:.1%} / {r['qeval']['spread']:.1%})"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "model": str(args.model),
                    "dtype": dtype,
                    "num_prompts": n,
                    "concurrency": c,
                    "input_len": args.input_len,
                    "output_len": args.output_len,
                    "repeats": args.repeats,
                    "rows": rows,
                },
                indent=1,
            )
        )
    if args.fail_on_disagree and any(r["verdict"] == "disagree" for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
