"""`qeval run`: the main loop, top to bottom.

    plan      validate config, tasks, setups, model and device (no model loaded)
    take      the output directory: refuse another run's folder, lock it against a second qeval
    for each setup, baseline first:
        skip it if its outcome is ok and every (setup, task) pair is stored under this run's key
        else run a worker process: load, score the missing tasks, measure, write
    assemble  results.json from the stored results whose keys match this run (others dropped, listed)
    report    report.md, report.html and the summary table
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qeval import __version__
from qeval.backends import worker_python
from qeval.config import RunConfig
from qeval.plan import RunPlan, make_plan
from qeval.provenance import git_commit, now_iso
from qeval.report import print_summary, write_report
from qeval.results import assemble_results
from qeval.rundir import take_run_dir
from qeval.setups import Setup
from qeval.store import RunStore, atomic_write_json, key_of


@dataclass
class RunOptions:
    output: Path
    setups: list[str] | None = None
    tasks: list[str] | None = None
    limit: int | None = None
    force: bool = False


@dataclass(frozen=True)
class SetupKeys:
    """The resume keys of one setup in this run: its outcome's, and each task's, with the
    parts they hash (stored beside them, so a mismatch can say what changed)."""

    parts: dict[str, str]
    tasks: dict[str, dict[str, str]]

    @property
    def key(self) -> str:
        return key_of(self.parts)

    def task_key(self, task: str) -> str:
        return key_of(self.tasks[task])


def run(cfg: RunConfig, opts: RunOptions) -> dict[str, Any]:
    """Run every setup of `cfg` and write RUN_DIR; returns the assembled results."""
    if opts.limit:  # --limit overrides the config's, in the workers and the resume keys alike
        cfg = cfg.model_copy(update={"limit": opts.limit})
    plan = make_plan(cfg, opts.setups, opts.tasks)
    lock = take_run_dir(opts.output, cfg.name, opts.force)
    try:
        started = now_iso()
        store = RunStore(opts.output)
        keys = {s.name: setup_keys(plan, s) for s in plan.cfg.setups}
        baseline = plan.cfg.baseline.name
        for setup in sorted(plan.setups, key=lambda s: s.name != baseline):
            k = keys[setup.name]
            pending = {t: k.task_key(t) for t in plan.run_tasks
                       if opts.force or not store.is_done(setup.name, t, k.task_key(t))}
            outcome = store.read_outcome(setup.name)
            if not pending and outcome and outcome.get("status") == "ok" and outcome.get("key") == k.key:
                print(f"{setup.name}: all {len(plan.run_tasks)} tasks stored, skipped (use --force to recompute)",
                      file=sys.stderr)
                continue
            _run_worker(plan, store, setup, pending, k, baseline)
        results = assemble_results(plan, store, keys, _run_info(plan, opts) | {"started": started})
        atomic_write_json(store.results_path, results)
        write_report(store.root, results)
    finally:
        lock.release()
    print_summary(results)
    return results


def setup_keys(plan: RunPlan, setup: Setup) -> SetupKeys:
    """Everything that changes a setup's numbers: the model's content, the setup, qeval, the
    backend and device, the dtype and context, the sample limit, and how requests are batched
    (padding changes the numerics: up to 0.067 nats per document under a quantized KV cache)."""
    cfg, m = plan.cfg, plan.cfg.model
    parts = {"model_sha256": plan.model_sha256, "setup": setup.id, "qeval": __version__, "backend": cfg.backend,
             "device": plan.device, "dtype": m.dtype, "max_context": str(m.max_context), "limit": str(cfg.limit),
             "batch_size": str(cfg.batch_size)}
    if cfg.backend == "vllm":  # the engine's scheduler decides the batching there
        parts["engine"] = json.dumps(cfg.engine.model_dump(mode="json"), sort_keys=True)
    return SetupKeys(parts, {t.name: parts | {"task": t.fingerprint} for t in plan.tasks})


def _die_with_parent() -> None:
    """In the worker, before exec: SIGKILL it when the runner dies (Linux prctl
    PR_SET_PDEATHSIG), so a killed `qeval run` leaves no worker computing on its own."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except OSError:  # not glibc Linux: the worker then outlives a killed parent, as before
        pass


def _run_worker(plan: RunPlan, store: RunStore, spec: Setup, tasks: dict[str, str], keys: SetupKeys,
                baseline: str) -> None:
    """One setup in a fresh process; a crash is recorded, never raised."""
    setup = spec.name
    ref = {t.name: [baseline, t.name] for t in plan.tasks
           if t.spec.output_type == "loglikelihood_rolling" and setup != baseline}
    job = {"config": plan.cfg.model_dump(mode="json"), "setup": setup, "device": plan.device,
           "run_dir": str(store.root), "tasks": tasks, "task_key_parts": {t: keys.tasks[t] for t in tasks},
           "reference": ref, "baseline": baseline, "key": keys.key, "key_parts": keys.parts}
    job_path = store.root / "jobs" / f"{setup}.json"
    atomic_write_json(job_path, job)
    env = os.environ | {"TOKENIZERS_PARALLELISM": "false"}
    before = store.setup_path(setup).stat().st_mtime_ns if store.setup_path(setup).is_file() else None
    proc = subprocess.run([worker_python(plan.cfg), "-m", "qeval.worker", str(job_path)], env=env, check=False,
                          preexec_fn=_die_with_parent)
    if proc.returncode in (-signal.SIGINT, 130):
        raise KeyboardInterrupt
    path = store.setup_path(setup)
    if not path.is_file() or path.stat().st_mtime_ns == before:  # died without writing: killed, segfault, OOM
        how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exited with code {proc.returncode}"
        error = f"worker process {how} before writing its result"
        if proc.returncode in (-9, 137):
            error = ("worker killed by SIGKILL before writing its result (the kernel's out-of-memory killer does "
                     "this; so does kill -9)")
        if spec.memory_limit_mib:
            error = f"out of memory: {error}, under memory_limit_mib={spec.memory_limit_mib}"
        atomic_write_json(path, {"name": setup, "status": "failed", "error": error, "timings": {},
                                 "key": keys.key, "key_parts": keys.parts})


def _run_info(plan: RunPlan, opts: RunOptions) -> dict[str, Any]:
    return {"name": plan.cfg.name, "config_hash": plan.cfg.config_hash(), "qeval_version": __version__,
            "git_commit": git_commit(), "finished": now_iso(), "device": plan.device,
            "backend": plan.cfg.backend, "model_sha256": plan.model_sha256,
            "limit": plan.cfg.limit, "output": str(opts.output), "skipped_setups": plan.skipped}
