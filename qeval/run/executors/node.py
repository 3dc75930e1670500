"""The node side of the `ray` executor: one job inside a Ray task's fresh worker process.

The task recreates, in a temporary run directory on its own node, what the worker reads (the
job file, the setup's previous outcome, the baseline's top-k for KL), runs the same worker
process the local executor runs, and returns every file that worker wrote for its setup as
bytes. It never touches the driver's run directory: the driver writes what comes back.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from qeval.files.atomic import atomic_write_bytes, atomic_write_json
from qeval.files.names import inside
from qeval.files.processes import pid_alive
from qeval.records.job import Job
from qeval.run.executors.worker_job import run_worker_process, worker_python

#: scratch folders are named qeval-ray-<Ray worker PID>-<random> under the node's temp dir
SCRATCH_PREFIX = "qeval-ray-"
_SCRATCH = re.compile(rf"^{SCRATCH_PREFIX}(\d+)-")
#: the driver's environment variables a worker on another node needs to behave the same
FORWARDED_ENV = re.compile(r"^(HF_|QEVAL_|TRANSFORMERS_|TOKENIZERS_PARALLELISM$)")
LOG_TAIL = 4000


def forwarded_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The driver's variables that decide how a worker behaves (hub offline, caches, qeval's
    interpreters): Ray workers inherit their node's environment, not the driver's."""
    return {k: v for k, v in environ.items() if FORWARDED_ENV.match(k)}


def run_on_node(payload: dict[str, Any]) -> dict[str, Any]:
    """Run one job (see the module docstring); returns the worker's return code, whether it
    wrote its outcome, and its files as {path relative to the run directory: bytes}."""
    from qeval.version import __version__

    if payload["qeval_version"] != __version__:
        raise RuntimeError(
            f"node {socket.gethostname()} runs qeval {__version__}, the driver qeval "
            f"{payload['qeval_version']}: install the same qeval on every node"
        )
    clear_stale_scratch()
    scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-"))
    try:
        return _run(payload, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run(payload: dict[str, Any], scratch: Path) -> dict[str, Any]:
    setup, root = payload["setup"], scratch / "run"
    for rel, data in payload["inputs"].items():
        atomic_write_bytes(inside(root, *PurePosixPath(rel).parts), data)
    job = Job.model_validate(payload["job"]).model_copy(update={"run_dir": str(root)})
    cfg = job.config
    if payload["driver_host"] != socket.gethostname():
        verify_inputs(cfg, job)
    job_path = inside(root, "jobs", f"{setup}.json")
    atomic_write_json(job_path, job.model_dump(mode="json"))
    outcome = inside(root, "setups", f"{setup}.json")
    before = _stamp(outcome)
    started = time.monotonic()
    log = scratch / "worker.log"
    stop = threading.Event()
    tail = threading.Thread(target=_forward_progress, args=(log, setup, payload, stop), daemon=True)
    tail.start()
    try:
        returncode = run_worker_process(worker_python(cfg, setup), job_path, worker_env(payload), log)
    finally:
        stop.set()
        tail.join(timeout=5)
    written = outcome.is_file() and _stamp(outcome) != before
    files = {}
    samples = root / "samples" / setup
    if samples.is_dir():  # dot files are half-written temporaries of an interrupted write
        files = {
            f"samples/{setup}/{p.name}": p.read_bytes()
            for p in sorted(samples.iterdir())
            if p.is_file() and not p.name.startswith(".")
        }
    if written:
        files[f"setups/{setup}.json"] = outcome.read_bytes()
    text = log.read_bytes()[-LOG_TAIL:].decode("utf-8", "replace") if log.is_file() else ""
    return {
        "returncode": returncode,
        "outcome_written": written,
        "files": files,
        "node": _node(),
        "pid": os.getpid(),
        "seconds": round(time.monotonic() - started, 2),
        "log_tail": text,
    }


def _forward_progress(log: Path, setup: str, payload: dict[str, Any], stop: threading.Event) -> None:
    """Send the worker's progress lines (`<setup>: <task> …` / `done`) to the driver's queue as
    the worker writes them, once a second and at the end."""
    queue = payload.get("progress")
    if queue is None:
        return
    offset, pending = 0, b""
    while True:
        finished = stop.wait(1.0)
        if log.is_file():
            with log.open("rb") as f:
                f.seek(offset)
                chunk = f.read()
            offset += len(chunk)
            *lines, pending = (pending + chunk).replace(b"\r", b"\n").split(b"\n")
            prefix = f"{setup}: "
            texts = [line.decode("utf-8", "replace") for line in lines]
            for item in [(payload["job_id"], t[len(prefix) :]) for t in texts if t.startswith(prefix)]:
                try:
                    queue.put_nowait(item)
                except Exception:  # noqa: BLE001 - the driver's queue is gone: progress is best effort
                    return
        if finished:
            return


def worker_env(payload: dict[str, Any]) -> dict[str, str]:
    """The worker process's environment: this node's, the driver's forwarded variables, and
    the thread count of the CPUs the job reserved."""
    env = (
        dict(os.environ)
        | payload["env"]
        | {"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(payload["threads"])}
    )
    if not payload["gpus"] and not payload["engine_gpus"]:
        # Ray leaves CUDA_VISIBLE_DEVICES alone for a job that reserved no GPU: hide them all,
        # or a CPU job on a GPU node would take one
        env["CUDA_VISIBLE_DEVICES"] = ""
    if payload["engine_gpus"]:
        import ray

        # vLLM's Ray backend joins this cluster from the worker process to place its workers
        env["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    return env


def verify_inputs(cfg: Any, job: Job) -> None:
    """On a node other than the driver's machine: the model and task data this node would
    read must be what the driver checksummed, or the results would be keyed to other inputs."""
    from qeval.model.source import resolve_model
    from qeval.tasks.kinds import task_kind

    expected = job.key_parts["model_sha256"]
    try:
        found = resolve_model(cfg.model.path, cfg.model.revision).checksum
    except Exception as exc:  # noqa: BLE001 - one line in the setup's outcome, whatever went wrong
        raise RuntimeError(f"model {cfg.model.path} on node {socket.gethostname()}: {exc}") from None
    if found != expected:
        raise RuntimeError(
            f"model {cfg.model.path} on node {socket.gethostname()} differs from the driver's "
            f"(sha256 {found[:12]}… against {expected[:12]}…)"
        )
    for name, parts in job.task_key_parts.items():
        # a kind whose tasks are made where they load (generated, lm-eval's) checks them in the worker
        local = task_kind(job.task_kinds[name]).fingerprint
        if local is not None and local(cfg, name) != parts["task"]:
            raise RuntimeError(f"task {name} on node {socket.gethostname()} differs from the driver's copy")


def clear_stale_scratch() -> None:
    """Remove scratch folders of Ray workers that died (a SIGKILL skips their cleanup)."""
    base = Path(tempfile.gettempdir())
    for path in base.glob(f"{SCRATCH_PREFIX}*"):
        match = _SCRATCH.match(path.name)
        if match and path.is_dir() and not pid_alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)


def _stamp(path: Path) -> tuple[int, int] | None:
    """(inode, mtime): an atomic rewrite changes the inode even within one clock tick."""
    if not path.is_file():
        return None
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


def _node() -> str:
    try:
        import ray

        return str(ray.util.get_node_ip_address())
    except Exception:  # noqa: BLE001 - a name for messages only
        return socket.gethostname()
