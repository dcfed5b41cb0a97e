"""Free loopback TCP ports for the embedded cluster (not :mod:`allocator.node.seams`, the node's
seams): every server listens on 127.0.0.1 only, on ports chosen at run time, never fixed.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Collection

from allocator.core.errors import PortInUseError

LOOPBACK = "127.0.0.1"


def pick_free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """Return ``count`` distinct TCP ports that are free on ``host`` right now.

    Each is what the kernel gave for ``host:0``; every socket stays open until all are read,
    so the ports are distinct. A server may still lose a port to another program before it
    binds: it then fails loudly, and :func:`ensure_free` checks a recorded port before a
    restart."""
    if count < 0:
        raise ValueError(f"count must be >= 0, not {count}")
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def pick_free_ports_except(count: int, exclude: Collection[int]) -> list[int]:
    """``count`` distinct free ports, none of them in ``exclude``."""
    picked = [p for p in pick_free_ports(count + len(exclude)) if p not in exclude]
    return picked[:count]


def is_free(port: int, host: str = LOOPBACK) -> bool:
    """True if a server could listen on ``host:port`` now.

    ``SO_REUSEADDR`` is set as the servers set it, so connections of a stopped server that
    linger in TIME_WAIT do not count as "taken", while any listening socket does.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def ensure_free(port: int, what: str, host: str = LOOPBACK) -> None:
    """Raise :class:`PortInUseError` naming ``port`` and its use if it is taken."""
    if not 0 < port < 65536:
        raise PortInUseError(f"{what}: {port} is not a valid TCP port")
    if not is_free(port, host):
        raise PortInUseError(
            f"port {port} on {host} ({what}) is already in use by another process; "
            "free it, or start with other ports (`allocator local down --purge` forgets "
            "the recorded ones)"
        )
