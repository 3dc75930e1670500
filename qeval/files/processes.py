"""Whether a process still runs: used to tell a live owner's scratch folder from a dead one's."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True when a process `pid` exists on this machine (it may belong to another user)."""
    try:
        os.kill(pid, 0)  # signal 0: existence and permission check only, nothing is sent
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
