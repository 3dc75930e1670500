"""A real local Ray cluster for tests: a head and worker nodes started with `ray start` on
127.0.0.1 by this process, and stopped by it (only its own processes: `ray stop` would kill
every Ray process on the machine).

Gotchas this handles (measured with Ray 2.60, see docs/cluster.md): token auth switches on for
`ray start` once any local `ray.init()` wrote ~/.ray/auth_token, so the cluster and its drivers
run with RAY_AUTH_MODE=disabled; the temp dir must be short (its plasma socket path must fit
107 bytes: a pytest tmp_path is too long); task workers get their own process group but keep
the `ray start` session id, so the cluster is stopped by session id.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

RAY = str(Path(sys.executable).parent / "ray")  # the venv's CLI: the workers then run this venv's python
ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LocalCluster:
    """A started cluster: its GCS address, temp root, and the `ray start` session ids."""

    address: str
    root: Path
    #: TMPDIR of every node: the executor's scratch folders (qeval-ray-<pid>-*) are made here
    scratch: Path
    sessions: list[int] = field(default_factory=list)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL, every process of our `ray start` sessions."""
        for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
            pids = session_pids(set(self.sessions))
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace
            while pids and time.monotonic() < deadline:
                time.sleep(0.1)
                pids = session_pids(set(self.sessions))
            if not pids:
                shutil.rmtree(self.root, ignore_errors=True)
                return
        raise RuntimeError(f"Ray processes survived SIGKILL: {pids}")


def session_pids(sessions: set[int]) -> list[int]:
    """Live (not zombie) processes whose session id is one of `sessions`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(stat[3]) in sessions and stat[0] != "Z":  # stat fields: state, ppid, pgrp, session
            found.append(int(entry))
    return found


def _ray_start(args: list[str], env: dict[str, str], cwd: Path) -> int:
    # a new session: every daemon of this `ray start` and every task worker its raylet forks
    # keeps session id == this pid, so stop() finds exactly our cluster
    proc = subprocess.Popen(
        [RAY, "start", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=env,
        cwd=cwd,
    )
    out, _ = proc.communicate(timeout=120)
    if proc.returncode:
        raise RuntimeError(f"ray start failed:\n{out}")
    return proc.pid


def start_cluster(cwd: Path, worker_nodes: int = 1, cpus_per_node: int = 1) -> LocalCluster:
    """A head and `worker_nodes` worker nodes, each with `cpus_per_node` CPUs and no GPU. Workers
    start in `cwd` (a checkout's root: `python -m qeval.run.worker` then imports its qeval)."""
    root = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: see the module docstring
    scratch = root / "scratch"
    scratch.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | ENV | {"TMPDIR": str(scratch)}
    port = free_port()
    common = [
        "--node-ip-address=127.0.0.1",
        "--disable-usage-stats",
        f"--num-cpus={cpus_per_node}",
        "--num-gpus=0",
        f"--object-store-memory={80 * 2**20}",
    ]
    cluster = LocalCluster(f"127.0.0.1:{port}", root, scratch)
    try:
        cluster.sessions.append(
            _ray_start(
                ["--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={root}/h", *common], env, cwd
            )
        )
        for i in range(worker_nodes):
            cluster.sessions.append(
                _ray_start([f"--address={cluster.address}", f"--temp-dir={root}/w{i}", *common], env, cwd)
            )
    except BaseException:
        cluster.stop()
        raise
    return cluster
