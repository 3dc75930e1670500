"""`qeval run`: the main loop, top to bottom.

    plan      validate config, tasks, setups and device (no model loaded)
    for each setup, baseline first:
        skip it if every (setup, task) pair is stored under the same key (resume)
        else run a worker process: load, score pending tasks, measure, write
    assemble  results.json from what the workers stored, compare with the baseline
    report    report.md and the summary table
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qeval import __version__
from qeval.backends import worker_python
from qeval.plan import RunPlan, make_plan
from qeval.config import RunConfig
from qeval.setups import Setup
from qeval.provenance import git_commit, now_iso
from qeval.results import assemble_results
from qeval.report import print_summary, write_report
from qeval.store import RunStore, atomic_write_json, task_key


@dataclass
class RunOptions:
    output: Path
    setups: list[str] | None = None
    tasks: list[str] | None = None
    limit: int | None = None
    force: bool = False


def run(cfg: RunConfig, opts: RunOptions) -> dict[str, Any]:
    """Run every setup of `cfg` and write RUN_DIR; returns the assembled results."""
    if opts.limit:  # --limit overrides the config's, in the workers and the resume keys alike
        cfg = cfg.model_copy(update={"limit": opts.limit})
    plan = make_plan(cfg, opts.setups, opts.tasks)
    started = now_iso()
    store = RunStore(opts.output)
    baseline = cfg.baseline.name
    for setup in sorted(plan.setups, key=lambda s: s.name != baseline):
        keys = {t.name: _key(plan, setup.id, t.fingerprint, opts) for t in plan.tasks if t.name in plan.run_tasks}
        pending = {n: k for n, k in keys.items() if opts.force or not store.is_done(setup.name, n, k)}
        if not pending and store.setup_path(setup.name).is_file():
            print(f"{setup.name}: all {len(keys)} tasks stored, skipped (use --force to recompute)", file=sys.stderr)
            continue
        _run_worker(plan, store, setup, pending, baseline)
    results = assemble_results(plan, store, _run_info(plan, opts) | {"started": started})
    atomic_write_json(store.results_path, results)
    write_report(store.root, results)
    print_summary(results)
    return results


def _key(plan: RunPlan, setup_id: str, task_fp: str, opts: RunOptions) -> str:
    m = plan.cfg.model
    return task_key(plan.model_sha256, setup_id, task_fp, __version__, plan.cfg.backend, plan.device,
                    m.dtype, str(m.max_context), str(plan.cfg.limit))


def _run_worker(plan: RunPlan, store: RunStore, spec: Setup, tasks: dict[str, str], baseline: str) -> None:
    """One setup in a fresh process; a crash is recorded, never raised."""
    setup = spec.name
    ref = {t.name: [baseline, t.name] for t in plan.tasks
           if t.spec.output_type == "loglikelihood_rolling" and setup != baseline}
    job = {"config": plan.cfg.model_dump(mode="json"), "setup": setup, "device": plan.device,
           "run_dir": str(store.root), "tasks": tasks, "reference": ref, "baseline": baseline}
    job_path = store.root / "jobs" / f"{setup}.json"
    atomic_write_json(job_path, job)
    env = os.environ | {"TOKENIZERS_PARALLELISM": "false"}
    before = store.setup_path(setup).stat().st_mtime_ns if store.setup_path(setup).is_file() else None
    proc = subprocess.run([worker_python(plan.cfg), "-m", "qeval.worker", str(job_path)], env=env, check=False)
    path = store.setup_path(setup)
    if not path.is_file() or path.stat().st_mtime_ns == before:  # died without writing: killed, segfault, OOM
        how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exited with code {proc.returncode}"
        error = f"worker process {how} before writing its result"
        if proc.returncode in (-9, 137):
            error = "out of memory (worker killed by SIGKILL, likely the OOM killer)"
        elif spec.memory_limit_mib:
            error = f"out of memory: {error}, under memory_limit_mib={spec.memory_limit_mib}"
        atomic_write_json(store.setup_path(setup), {"name": setup, "status": "failed", "error": error, "timings": {}})


def _run_info(plan: RunPlan, opts: RunOptions) -> dict[str, Any]:
    return {"name": plan.cfg.name, "config_hash": plan.cfg.config_hash(), "qeval_version": __version__,
            "git_commit": git_commit(), "finished": now_iso(), "device": plan.device,
            "backend": plan.cfg.backend, "model_sha256": plan.model_sha256,
            "limit": plan.cfg.limit, "output": str(opts.output)}
