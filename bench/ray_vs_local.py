"""The `ray` executor with 2 workers against `local` on the same sweep: wall time of the same
`qeval run`, once under each executor, in this one run, on this machine.

    .venv/bin/python bench/ray_vs_local.py [--config configs/demo.yaml] [--limit 60] [--workers 2]

`local` runs the setups one after another, each worker process using every core; `ray`
starts a local Ray for the run (its start-up is inside the timed region) and runs `--workers`
jobs at a time, each reserving cores / workers CPUs (its OMP_NUM_THREADS). Prints both wall
times, their ratio, the machine's core count and load, and checks that every per-sample
record is byte-identical between the two. The ratio is the figure to read: on a machine with
few cores the workers share them, and two processes of one thread each are not twice one of two.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed_run(config: Path, out: Path, limit: int, executor: str) -> float:
    """Wall seconds of `qeval run CONFIG --executor EXECUTOR` (the whole command, as a user waits for it)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # ray: a local Ray started by the run
    # Ray starts its workers at niceness 15 (measured: state SN in ps); on a machine shared with
    # other work that alone slows them down. Both legs compete at niceness 0 here.
    env |= {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "RAY_worker_niceness": "0"}
    started = time.perf_counter()
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "qeval.cli",
            "run",
            str(config),
            "--output",
            str(out),
            "--limit",
            str(limit),
            "--executor",
            executor,
            "--no-performance",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - started
    if res.returncode != 0:
        raise SystemExit(f"{executor} run failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return seconds


def worker_seconds(run: Path) -> float:
    """The setups' own times (their worker processes' total_s), summed."""
    outcomes = [json.loads(p.read_text()) for p in (run / "setups").glob("*.json")]
    return float(sum(o.get("timings", {}).get("total_s", 0.0) for o in outcomes))


def samples(run: Path) -> dict[str, bytes]:
    return {p.relative_to(run).as_posix(): p.read_bytes() for p in sorted((run / "samples").rglob("*.jsonl"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "demo.yaml")
    ap.add_argument("--limit", type=int, default=60)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="pairs of runs (local, then ray), each reported")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    per_job = max(1, cores // args.workers)
    with tempfile.TemporaryDirectory(prefix="qeval-bench-ray-") as tmp:
        config = Path(tmp) / args.config.name
        text = args.config.read_text().replace("path: models/", f"path: {ROOT}/models/")
        config.write_text(
            text + f"\ntasks_dir: {ROOT / 'tasks'}\nexecutor: {{kind: ray, max_parallel: {args.workers}, "
            f"num_cpus_per_job: {per_job}}}\n"
        )
        # untimed: one-time costs (kernel builds such as quanto's C++ extension, the disk cache) paid once
        timed_run(config, Path(tmp) / "warm-up", 1, "local")
        print(
            f"config {args.config.name}, --limit {args.limit}; machine: {cores} cores (os.cpu_count); "
            f"local: one setup at a time, {cores} threads; ray: {args.workers} workers x {per_job} CPU, "
            "a local Ray started inside the timed run",
            flush=True,
        )
        for i in range(args.repeat):
            load = os.getloadavg()[0]
            local = timed_run(config, Path(tmp) / f"local{i}", args.limit, "local")
            ray = timed_run(config, Path(tmp) / f"ray{i}", args.limit, "ray")
            load = max(load, os.getloadavg()[0])
            same = samples(Path(tmp) / f"local{i}") == samples(Path(tmp) / f"ray{i}")
            own = {leg: worker_seconds(Path(tmp) / f"{leg}{i}") for leg in ("local", "ray")}
            print(
                f"local {local:6.1f} s, ray {ray:6.1f} s: ratio local / ray {local / ray:.2f}x "
                f"(setups' own times: {own['local']:.0f} s / {own['ray']:.0f} s; highest 1-minute load "
                f"average seen {load:.1f}; per-sample records identical: {same})",
                flush=True,
            )
            if not same:
                raise SystemExit("the two executors' per-sample records differ")


if __name__ == "__main__":
    main()
