"""Attach a new kazoo client to a session another client opened.

kazoo's handshake sends the session id and password its client holds: a new client given
those of a session that still lives on the servers continues it (same id, same ephemeral
znodes, no memory of the old client's last zxid); one whose session expired gets a fresh
session instead. ``KazooClient(client_id=...)`` sets exactly these two attributes
(kazoo 2.11 ``client.py`` ~258); this does the same to a client already built, so every
client still comes from :func:`allocator.zookeeper.client.client`.
"""

from __future__ import annotations

from typing import Any


def resume(client: Any, client_id: tuple[int, bytes]) -> Any:
    """``client`` (built, not started) set to continue session ``client_id`` when started."""
    client._session_id, client._session_passwd = client_id
    return client
