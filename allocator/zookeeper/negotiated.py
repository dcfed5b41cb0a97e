"""The session timeout a ZooKeeper server grants, which kazoo keeps nowhere.

A server clamps the requested timeout to its ``minSessionTimeout..maxSessionTimeout``; a node
that timed its self-stop with the configured value would wait longer than the server does.
"""

from __future__ import annotations

from typing import Any

from kazoo.client import KazooClient
from kazoo.protocol.serialization import Connect

GRANTED_ATTRIBUTE = "granted_timeout_ms"
"""Where a tracked client keeps the last grant (the test fake sets the same attribute)."""


def track_granted_timeout(client: KazooClient) -> KazooClient:
    """Keep the timeout granted at every session (re)connect on ``client.granted_timeout_ms``.

    kazoo reads the grant from the server's answer to its Connect request, logs it at its
    BLATHER level and keeps it in no attribute; the answer is what the connection handler's
    ``_invoke`` returns. That method is wrapped on this client's handler alone (kazoo's
    private API: the pinned kazoo range, and tests/integration/test_negotiated_timeout.py
    fails if it moves). It runs on kazoo's connection thread and only stores an int.
    """
    setattr(client, GRANTED_ATTRIBUTE, None)
    connection: Any = client._connection
    invoke = connection._invoke

    def invoke_and_keep(timeout: float, request: Any, xid: int | None = None) -> Any:
        result = invoke(timeout, request, xid)
        if isinstance(request, Connect):
            answer = result[0]
            if answer.time_out > 0:
                setattr(client, GRANTED_ATTRIBUTE, int(answer.time_out))
        return result

    connection._invoke = invoke_and_keep
    return client


def granted_timeout_ms(client: object) -> int | None:
    """The last timeout a server granted ``client``; None before its first session or for a
    client nobody tracks."""
    granted = getattr(client, GRANTED_ATTRIBUTE, None)
    return granted if isinstance(granted, int) else None
