"""Child processes: whether one still runs (a live owner's scratch folder from a dead one's), and
making one die with its parent."""

from __future__ import annotations

import ctypes
import os
import signal


def pid_alive(pid: int) -> bool:
    """True when a process `pid` exists on this machine (it may belong to another user)."""
    try:
        os.kill(pid, 0)  # signal 0: existence and permission check only, nothing is sent
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def die_with_parent(parent: int) -> None:
    """Pass as `preexec_fn` (with the parent's pid bound): SIGKILL the child when its parent
    dies (Linux prctl PR_SET_PDEATHSIG), so a killed `qeval run` (or Ray worker) leaves no
    worker, probe, quantizer or engine server computing under PID 1."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except OSError:  # not glibc Linux: the child then outlives a killed parent
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)
