"""A server qeval starts itself for one setup: on 127.0.0.1 at a free port, its output in a log
file, healthy once GET /health answers; stopped when the setup ends, and dead with the worker.

Two guards keep no server computing after qeval: the server runs in its own process group,
which `stop()` kills whole (vLLM's API server, its engine core and their workers), and every
process of it gets PR_SET_PDEATHSIG: the server's own process from `preexec_fn`, vLLM's engine
processes from qeval's vLLM plugin (QEVAL_WORKER=1 in its environment,
qeval/backends/vllm/plugin.py), so a killed worker takes its server with it.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from qeval.backends.openai.client import REDACTED, _key_forms
from qeval.files.processes import die_with_parent

HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class ServerDied(RuntimeError):
    """The launched server exited: its exit status and the last lines of its log."""


class LaunchedServer:
    """One server process (group) started from `argv`, with `env` added to this environment."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.argv, self.log_path = argv, log_path
        #: what the server was handed in `env` (the API key): scrubbed from the log lines an error quotes
        #: (a server may log its environment or a refused request's header; the error lands in results.json)
        self._secrets = [v for v in env.values() if v]
        self._stopped = False
        #: set when it never answered /health: its log is kept, as for a server that died
        self.failed = False
        self._log: IO[bytes] = log_path.open("wb")
        # a VLLM_API_KEY from the user's shell would make the server demand a key the client never sends
        inherited = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
        self.proc = subprocess.Popen(
            argv,
            env=inherited | env | {"QEVAL_WORKER": "1"},
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=functools.partial(die_with_parent, os.getpid()),
        )

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def check_alive(self) -> None:
        """Raise ServerDied, naming the exit status and the log's last lines, if the server exited."""
        code = self.proc.poll()
        if code is None:
            return
        lines = [line for line in self.log_text().strip().splitlines() if line.strip()]
        # the engine's own error where it logged one (an EngineDeadError ends in shutdown noise), else the end
        errors = [line for line in lines if re.search(r"\b\w*(Error|Exception): ", line)]
        tail = [self._scrub(t) for t in (errors[-2:] if errors else lines[-3:])]  # scrubbed before cut to 200
        how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        raise ServerDied(
            f"the launched server ({self.argv[0]} ... pid {self.pid}) died, {how}"
            + (f"; its log: {' | '.join(t.strip()[:200] for t in tail)}" if tail else "")
            + f" (the whole log: {self.log_path})"
        )

    def _scrub(self, line: str) -> str:
        """`line` of the server's log with every form of the secrets it was handed replaced (as the client does)."""
        for secret in self._secrets:
            for form in _key_forms(secret):
                line = line.replace(form, REDACTED)
        return line

    @property
    def died(self) -> bool:
        """Whether the server exited before qeval stopped it."""
        return self.proc.poll() is not None and not self._stopped

    def wait_exit(self, timeout_s: float) -> None:
        """Give a server that stopped answering up to timeout_s to exit (it may be shutting down)."""
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass

    def wait_healthy(self, healthy: Callable[[], bool], timeout_s: float) -> float:
        """Poll `healthy()` until True; seconds it took. ServerDied if it exits, TimeoutError after timeout_s."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            self.check_alive()
            if healthy():
                return time.monotonic() - t0
            time.sleep(0.5)
        self.failed = True
        self.stop()
        raise TimeoutError(
            f"the launched server did not answer GET /health within {timeout_s:g} s (its log: {self.log_path})"
        )

    def listens_on(self, port: int) -> bool:
        """Whether the server's own process tree holds the listening socket on `port`: between
        free_port() and the server's bind another process may take the port, and its /health 200
        would otherwise be trusted (its answers scored, the key sent to it)."""
        import psutil

        try:
            root = psutil.Process(self.pid)
            family = [root, *root.children(recursive=True)]
        except psutil.Error:
            return False
        for proc in family:
            try:
                if any(
                    c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                    for c in proc.net_connections(kind="tcp")
                ):
                    return True
            except psutil.Error:  # it ended, or is not ours to read
                continue
        return False

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the server's process group, SIGKILL what is left after grace_s."""
        if self.proc.poll() is None:
            self._stopped = True
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(self.proc.pid, signal.SIGKILL)  # the engine processes, even when the server exited
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        if not self._log.closed:
            self._log.close()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
