"""`qeval run`: the main loop, top to bottom.

    preflight validate config, tasks, setups, model and device (no model loaded)
    take      the output directory: refuse another run's folder, lock it against a second qeval
    ceilings  the device's copy bandwidth and matmul peak, once per run (performance phase on)
    for each setup, baseline first:
        skip it if its outcome is ok and every (setup, task) pair is stored under this run's key
        else run a worker process: load, score the missing tasks, measure memory, time the
        performance workload (when not stored under this run's key), write
    assemble  results.json from the stored results whose keys match this run (others dropped, listed)
    report    report.md, report.html and the summary table
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from qeval import __version__
from qeval.analysis.assemble import assemble_results
from qeval.backends import backend_entry
from qeval.config import RunConfig
from qeval.files.atomic import atomic_write_bytes, atomic_write_json
from qeval.perf.ceilings import ensure_ceilings
from qeval.perf.phase import perf_key
from qeval.report import print_summary, write_report
from qeval.results.schema import Results, read_results
from qeval.run.keys import SetupKeys, setup_keys
from qeval.run.preflight import Preflight, preflight
from qeval.run.provenance import git_commit, now_iso
from qeval.run.rundir import take_run_dir
from qeval.run.store import RunStore
from qeval.setups import Setup


@dataclass
class RunOptions:
    output: Path
    setups: list[str] | None = None
    tasks: list[str] | None = None
    limit: int | None = None
    force: bool = False


def run(cfg: RunConfig, opts: RunOptions) -> Results:
    """Run every setup of `cfg` and write RUN_DIR; returns the assembled results."""
    if opts.limit:  # --limit overrides the config's, in the workers and the resume keys alike
        cfg = cfg.model_copy(update={"limit": opts.limit})
    pre = preflight(cfg, opts.setups, opts.tasks)
    lock = take_run_dir(opts.output, cfg.name, opts.force)
    try:
        started = now_iso()
        store = RunStore(opts.output)
        keys = {s.name: setup_keys(pre, s) for s in pre.cfg.setups}
        baseline = pre.cfg.baseline.name
        # the device's ceilings, once per run, before any setup (docs/performance.md)
        ensure_ceilings(pre, store, backend_entry(pre.cfg.backend).worker_python(pre.cfg))
        for setup in sorted(pre.setups, key=lambda s: s.name != baseline):
            k = keys[setup.name]
            pending = {t: k.task_key(t) for t in pre.run_tasks
                       if opts.force or not store.is_done(setup.name, t, k.task_key(t))}
            outcome = store.read_outcome(setup.name)
            perf = perf_key(k.parts, pre.cfg) if pre.cfg.performance.enabled else None
            perf_stored = (outcome or {}).get("performance") or {}
            perf_pending = perf is not None and (opts.force or perf_stored.get("key") != perf
                                                 or perf_stored.get("status") != "ok")
            if (not pending and not perf_pending and outcome and outcome.get("status") == "ok"
                    and outcome.get("key") == k.key):
                print(f"{setup.name}: all {len(pre.run_tasks)} tasks stored, skipped (use --force to recompute)",
                      file=sys.stderr)
                continue
            _run_worker(pre, store, setup, pending, k, baseline, perf if perf_pending else None)
        assembled = assemble_results(pre, store, keys, _run_info(pre, opts) | {"started": started})
        atomic_write_bytes(store.results_path, (assembled.model_dump_json(indent=2) + "\n").encode())
        # the report is rendered from the file just written, as `qeval report` renders it: same bytes
        results = read_results(store.results_path)
        write_report(store.root, results)
    finally:
        lock.release()
    print_summary(results)
    return results


def _die_with_parent() -> None:
    """In the worker, before exec: SIGKILL it when the runner dies (Linux prctl
    PR_SET_PDEATHSIG), so a killed `qeval run` leaves no worker computing on its own."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except OSError:  # not glibc Linux: the worker then outlives a killed parent, as before
        pass


def _run_worker(pre: Preflight, store: RunStore, spec: Setup, tasks: dict[str, str], keys: SetupKeys,
                baseline: str, perf: str | None = None) -> None:
    """One setup in a fresh process; a crash is recorded, never raised."""
    setup = spec.name
    ref = {t.name: [baseline, t.name] for t in pre.tasks
           if t.spec.output_type == "loglikelihood_rolling" and setup != baseline}
    job = {"config": pre.cfg.model_dump(mode="json"), "setup": setup, "device": pre.device,
           "run_dir": str(store.root), "tasks": tasks, "task_key_parts": {t: keys.tasks[t] for t in tasks},
           "reference": ref, "baseline": baseline, "key": keys.key, "key_parts": keys.parts,
           # the performance phase, when its figures are not stored under this key yet
           "performance": {"key": perf, "shape": asdict(pre.shape) if pre.shape else None} if perf else None}
    job_path = store.root / "jobs" / f"{setup}.json"
    atomic_write_json(job_path, job)
    env = os.environ | {"TOKENIZERS_PARALLELISM": "false"}
    before = store.setup_path(setup).stat().st_mtime_ns if store.setup_path(setup).is_file() else None
    python = backend_entry(pre.cfg.backend).worker_python(pre.cfg)
    proc = subprocess.run([python, "-m", "qeval.run.worker", str(job_path)], env=env, check=False,
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


def _run_info(pre: Preflight, opts: RunOptions) -> dict[str, Any]:
    return {"name": pre.cfg.name, "config_hash": pre.cfg.config_hash(), "qeval_version": __version__,
            "git_commit": git_commit(), "finished": now_iso(), "device": pre.device,
            "backend": pre.cfg.backend, "model_sha256": pre.model_sha256,
            "limit": pre.cfg.limit, "output": str(opts.output), "skipped_setups": pre.skipped}
