"""The session timeout a ZooKeeper server grants, which kazoo keeps nowhere.

A server clamps the requested timeout to its ``minSessionTimeout..maxSessionTimeout``; a node
that timed its self-stop with the configured value would wait longer than the server does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.protocol.serialization import Connect


def report_granted_timeout(client: KazooClient, report: Callable[[int], None]) -> None:
    """Call ``report(milliseconds)`` with the timeout granted at every session (re)connect.

    kazoo reads the grant from the server's answer to its Connect request, logs it at its
    BLATHER level and keeps it in no attribute; the answer is what the connection handler's
    ``_invoke`` returns. That method is wrapped on this client's handler alone (kazoo's
    private API: the pinned kazoo range, and tests/integration/test_negotiated_timeout.py
    fails if it moves). ``report`` runs on kazoo's connection thread: it must not block.
    """
    connection: Any = client._connection
    invoke = connection._invoke

    def invoke_and_report(timeout: float, request: Any, xid: int | None = None) -> Any:
        result = invoke(timeout, request, xid)
        if isinstance(request, Connect):
            answer = result[0]
            if answer.time_out > 0:
                report(int(answer.time_out))
        return result

    connection._invoke = invoke_and_report
