"""Which Ray cluster a run uses: the config's `executor.address`, else RAY_ADDRESS, else a
local Ray started for the run. A given address is checked with one TCP connection first:
`ray.init` on an address where nothing answers retries for minutes before it gives up."""

from __future__ import annotations

import os
import socket

from qeval.errors import UserError

#: seconds to wait for a cluster's GCS port to accept a connection
CONNECT_TIMEOUT_S = 3.0


def cluster_address(configured: str | None) -> str | None:
    """The address to connect to, or None: start a local Ray."""
    address = configured or os.environ.get("RAY_ADDRESS") or None
    return address.strip() if address else None


def check_address(address: str) -> None:
    """One line for an address qeval cannot use; returns when something answers there."""
    where = f"Ray cluster address {address!r}"
    if address.startswith("ray://"):
        raise UserError(
            f"{where}: Ray Client addresses (ray://) are not supported; run qeval on a node of the "
            "cluster and give its GCS address, host:port"
        )
    if address in ("auto", "local"):
        return  # Ray itself finds (auto) or starts (local) the cluster on this machine
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UserError(f"{where}: expected host:port (the head node's GCS port, 6379 by default), or auto")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise UserError(
            f"{where}: nothing answers there ({exc.strerror or type(exc).__name__}); is the cluster "
            "up (`ray start --head`)?"
        ) from None
