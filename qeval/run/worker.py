"""One setup in its own process: load, score each pending task, measure, write, exit.

    python -m qeval.run.worker JOB.json

The runner starts one of these per setup, so memory is measured cleanly, device memory
is really returned between setups, and a crash or out-of-memory ends only this setup.
Every outcome, failures included, is written to RUN_DIR/setups/<setup>.json.
"""

from __future__ import annotations

import json
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from qeval.config import RunConfig
from qeval.files.atomic import atomic_write_json
from qeval.run.progress import progress_bar
from qeval.run.store import RunStore
from qeval.setups import Setup

_OOM_SIGNS = ("out of memory", "can't allocate memory", "cannot allocate memory", "failed to map")


def _limit_memory(mib: int) -> None:
    """Cap the address space at what is mapped now plus `mib`: allocations past it fail
    the way they would on a device that small."""
    import psutil

    vms = psutil.Process().memory_info().vms
    cap = vms + mib * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def run_job(job: dict[str, Any]) -> int:
    """Serve one setup as the runner's job file says; write its outcome; 0 if it is ok."""
    cfg = RunConfig.model_validate(job["config"])
    setup = next(s for s in cfg.setups if s.name == job["setup"])
    store = RunStore(Path(job["run_dir"]))
    previous = store.read_outcome(setup.name) or {}
    # a partial rerun (--tasks) keeps the timings of the tasks it did not touch
    timings = previous.get("timings", {}) if previous.get("key") == job["key"] else {}
    outcome: dict[str, Any] = {"name": setup.name, "status": "failed", "error": None, "timings": timings,
                               "key": job["key"], "key_parts": job["key_parts"]}
    t0 = time.time()
    try:
        outcome |= _serve(cfg, setup, store, job, outcome["timings"])
        outcome["status"] = "ok"
        if not job["tasks"] and previous.get("key") == job["key"] and previous.get("memory"):
            # a rerun for the performance phase alone scored nothing: its peak is not the scoring peak
            outcome["memory"] = previous["memory"]
        if "performance" not in outcome and previous.get("key") == job["key"] and previous.get("performance"):
            outcome["performance"] = previous["performance"]  # current (the runner asked for none): kept
    except Exception as exc:  # noqa: BLE001 - any failure (MemoryError included) is this setup's result
        outcome["error"] = _failure(exc, setup)
        outcome["traceback"] = traceback.format_exc(limit=8)
    outcome["timings"]["total_s"] = round(time.time() - t0, 2)
    atomic_write_json(store.setup_path(setup.name), outcome)
    return 0 if outcome["status"] == "ok" else 1


def _serve(cfg: RunConfig, setup: Setup, store: RunStore, job: dict[str, Any],
           timings: dict[str, float]) -> dict[str, Any]:
    """Load, score each pending task (each stored as soon as it is done), measure memory."""
    # import the engine's stack first (creating the backend imports its module), so that a
    # memory cap bites on the model, not on imports
    import torch  # noqa: F401
    import transformers.models.llama.modeling_llama  # noqa: F401

    from qeval.backends import backend_entry
    from qeval.tasks import load_task
    from qeval.tasks.longctx.hooks import worker_tasks
    from qeval.tasks.scoring import n_requests, score_task

    t0 = time.time()
    backend = backend_entry(cfg.backend).create(cfg, setup, job["device"])
    if setup.memory_limit_mib:
        _limit_memory(setup.memory_limit_mib)
    try:
        with progress_bar(f"{setup.name}: loading model", total=None) as bar:
            backend.load()
            bar.advance(1)
        timings["load_s"] = round(time.time() - t0, 2)
        native = [n for n in job["tasks"] if n in cfg.tasks]
        generated = worker_tasks(cfg, {n: job["task_key_parts"][n] for n in job["tasks"]})  # long context
        for name in native + list(generated):
            task = generated[name] if name in generated else load_task(name, Path(cfg.tasks_dir), cfg.limit)
            t1 = time.time()
            with progress_bar(f"{setup.name}: {name}", total=n_requests(task)) as bar:
                result = score_task(backend, task, bar.advance, _reference(store, job, name))
            _store(store, setup, job, name, result, round(time.time() - t1, 2), task.sha256, timings)
        harness = [n for n in job["tasks"] if n not in native and n not in generated]
        if harness and cfg.lm_eval:
            _serve_harness(backend, cfg, setup, store, job, harness, timings)
        memory = {k: vars(v) for k, v in backend.memory().items()}
        out: dict[str, Any] = {"memory": memory}
        if job.get("performance"):  # after scoring and memory: its larger batches must not show in either
            from qeval.perf.phase import run_phase

            with progress_bar(f"{setup.name}: performance", total=None) as bar:
                out["performance"] = run_phase(backend, cfg, setup, job["device"], memory, job["performance"])
                bar.advance(1)
            timings["performance_s"] = out["performance"]["seconds"]
        return out | {"quantization": backend.quant_info,  # read last: engines log some of it late
                      "library_versions": backend.library_versions()}
    finally:
        backend.close()


def _serve_harness(backend: Any, cfg: RunConfig, setup: Setup, store: RunStore, job: dict[str, Any],
                   names: list[str], timings: dict[str, float]) -> None:
    """The setup's pending lm-eval tasks in one lm-eval evaluate() call: one batched backend
    call per request type for all of them."""
    from qeval.tasks.harness.scoring import n_requests, score_harness
    from qeval.tasks.harness.session import open_session

    assert cfg.lm_eval is not None
    session = open_session(cfg.lm_eval, Path.cwd(), cfg.limit)
    try:
        refs = {n: ref for n in names if (ref := _reference(store, job, n)) is not None}
        t1 = time.time()
        with progress_bar(f"{setup.name}: {len(names)} lm-eval tasks", total=n_requests(session, names)) as bar:
            results = score_harness(backend, session, names, bar.advance, refs)
        seconds = round((time.time() - t1) / len(names), 2)  # one evaluate() call: its time shared out
        for name, result in results.items():
            _store(store, setup, job, name, result, seconds, session.infos[name].sha256, timings)
    finally:
        session.close()


def _reference(store: RunStore, job: dict[str, Any], task: str) -> Any:
    """The baseline's stored top-k for a perplexity task (KL reference), if this setup needs it."""
    ref = job["reference"].get(task)
    return store.read_topk(*ref) if ref else None


def _store(store: RunStore, setup: Setup, job: dict[str, Any], name: str, result: Any, seconds: float,
           sha256: str, timings: dict[str, float]) -> None:
    """One task's records and metrics, under its key; the baseline keeps its perplexity top-k."""
    timings[f"{name}_s"] = seconds
    topk = result.topk if (setup.name == job["baseline"] and result.topk) else None
    store.write_task(setup.name, name, job["tasks"][name], result.records, result.metrics,
                     {"seconds": seconds, "task_sha256": sha256, "key_parts": job["task_key_parts"][name]}, topk)


def _failure(exc: BaseException, setup: Setup) -> str:
    """One line for a failed setup; allocation failures named as out of memory."""
    if isinstance(exc, MemoryError):
        error = f"out of memory: {exc or 'MemoryError'}"
    else:
        msg = str(exc).strip().splitlines()
        oom = any(s in str(exc).lower() for s in _OOM_SIGNS) or (
            setup.memory_limit_mib is not None and isinstance(exc, (OSError, ImportError)) and "map" in str(exc))
        error = ("out of memory: " if oom else "") + f"{type(exc).__name__}: {msg[0] if msg else ''}"
    if setup.memory_limit_mib:  # say so: odd errors are how allocation failures often surface
        error = f"under memory_limit_mib={setup.memory_limit_mib}: {error}"
    return error


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    try:
        sys.exit(run_job(job))
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
