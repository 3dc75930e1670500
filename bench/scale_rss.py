"""qeval at scale: one task's full set through `qeval run`, the runner's and the worker's peak
RSS at several sizes (flat in the number of documents when records are streamed, never held).

    .venv/bin/python bench/scale_rss.py [--task hellaswag_full] [--limits 2000,10042] [--int8]
                                        [--model models/smollm2-135m] [--dtype float32] [--batch-size 16]

Each size is a fresh `qeval run` (one baseline setup, `--no-performance`) of the first N
documents, in its own run directory under --out. `--int8` adds an INT8-weights setup, scored
against the baseline's stored top-k (its KL reference), so a setup's worker is measured too.
The process tree is sampled every 0.2 s (psutil): the runner is the `qeval run` process itself,
the worker its largest descendant; each setup's own peak is its ledger figure.
Printed per size: documents scored, wall time, scoring time (the worker's own figure), both
peak RSS figures and the worker's own `peak_bytes` (getrusage, as the memory ledger records it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent


def write_config(folder: Path, args: argparse.Namespace) -> Path:
    """A one-setup run config scoring `args.task` from the full sets (tasks/lm_eval_full)."""
    import yaml

    cfg = {
        "name": "scale",
        "model": {"path": str(args.model.resolve()), "dtype": args.dtype, "max_context": 1024},
        "backend": "hf",
        "device": "cpu",
        "batch_size": args.batch_size,
        "setups": [{"name": "baseline", "baseline": True}]
        + ([{"name": "int8", "weights": "int8"}] if args.int8 else []),
        "lm_eval": {"include_path": [str(args.include.resolve())], "tasks": [{"name": args.task}], "suites": []},
        "budget": {"gpu_memory_gib": 4, "utilization": 0.9, "context_len": 1024, "overhead_gib": 0.5},
    }
    path = folder / "scale.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def sample_tree(cmd: list[str], every: float = 0.2) -> tuple[int, float, int, int]:
    """Run `cmd`; its exit code, wall seconds, the peak RSS of the process itself and of its
    largest descendant (bytes)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
    )
    root = psutil.Process(proc.pid)
    runner_peak, child_peaks = 0, {}
    while proc.poll() is None:
        try:
            runner_peak = max(runner_peak, root.memory_info().rss)
            for child in root.children(recursive=True):
                try:
                    child_peaks[child.pid] = max(child_peaks.get(child.pid, 0), child.memory_info().rss)
                except psutil.Error:  # it ended between the listing and the read
                    pass
        except psutil.Error:
            pass
        time.sleep(every)
    stderr = proc.stderr.read() if proc.stderr else ""
    if proc.returncode:
        print(stderr[-2000:], file=sys.stderr)
    return proc.returncode, time.perf_counter() - t0, runner_peak, max(child_peaks.values(), default=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="hellaswag_full")
    ap.add_argument("--limits", default="2000,10042", help="comma-separated document counts (one run each)")
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "smollm2-135m")
    ap.add_argument("--include", type=Path, default=ROOT / "tasks" / "lm_eval_full")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "scale")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument(
        "--int8",
        action="store_true",
        help="add an INT8-weights setup (a worker that reads the baseline's KL reference)",
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    config = write_config(args.out, args)
    rows: list[dict[str, Any]] = []
    for limit in (int(x) for x in args.limits.split(",")):
        run_dir = args.out / f"n{limit}"
        cmd = [
            sys.executable,
            "-m",
            "qeval.cli",
            "run",
            str(config),
            "--output",
            str(run_dir),
            "--limit",
            str(limit),
            "--no-performance",
            "--force",
        ]
        rc, wall, runner, worker = sample_tree(cmd)
        setups = json.loads((run_dir / "results.json").read_text())["setups"] if rc == 0 else [{}]
        for setup in setups:
            task = setup.get("tasks", {}).get(args.task, {})
            peak = setup.get("memory", {}).get("peak_bytes", {}).get("measured")
            timings = setup.get("timings", {})
            kl = (setup.get("vs_baseline") or {}).get(args.task, {}).get("kl_distribution") or {}
            row = {
                "limit": limit,
                "setup": setup.get("name"),
                "rc": rc,
                "n": task.get("n"),
                "wall_s": wall,
                "scoring_s": timings.get(f"{args.task}_s"),
                "worker_total_s": timings.get("total_s"),
                "runner_peak_rss": runner,
                "worker_peak_rss": worker,
                "worker_peak_bytes_ledger": peak,
                "metrics": {k: v.get("value") for k, v in task.get("metrics", {}).items()},
                "kl_tokens": kl.get("tokens"),
                "load_average": os.getloadavg()[0],
            }
            rows.append(row)
            print(
                f"{args.task} {row['setup']} n={row['n']} rc={rc}: wall {wall:.1f} s, scoring {row['scoring_s']} s, "
                f"runner peak RSS {runner / 2**20:.0f} MiB, largest worker peak RSS {worker / 2**20:.0f} MiB "
                f"(this setup's ledger: {(peak or 0) / 2**20:.0f} MiB), KL tokens {row['kl_tokens']}, "
                f"load average {row['load_average']:.2f}",
                flush=True,
            )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "task": args.task,
                    "model": args.model.name,
                    "dtype": args.dtype,
                    "batch_size": args.batch_size,
                    "rows": rows,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
