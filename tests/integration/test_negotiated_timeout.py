"""The session timeout the server grants reaches the node: kazoo keeps it nowhere, so
:func:`allocator.zookeeper.negotiated.track_granted_timeout` reads it from the Connect answer.
The embedded cluster's servers grant 400 ms to 20 s (allocator/local/zookeeper.py)."""

from __future__ import annotations

import urllib.request

import pytest
from kazoo.client import KazooClient

from allocator.local.zookeeper import DEFAULT_TICK_MS, MAX_SESSION_TICKS, MIN_SESSION_TICKS
from allocator.zookeeper.negotiated import granted_timeout_ms, track_granted_timeout
from tests.fixtures.nodes import MakeNode, wait_for
from tests.fixtures.zk import ZK_AUTH

pytestmark = pytest.mark.integration

CONNECT_TIMEOUT_S = 15
MAX_MS = MAX_SESSION_TICKS * DEFAULT_TICK_MS
MIN_MS = MIN_SESSION_TICKS * DEFAULT_TICK_MS


@pytest.mark.parametrize(
    ("asked_ms", "granted_ms"),
    [(10_000, 10_000), (3 * MAX_MS, MAX_MS), (MIN_MS // 2, MIN_MS)],
    ids=["within", "above-max", "below-min"],
)
def test_the_granted_timeout_is_reported_at_connect(
    zk_hosts: str, asked_ms: int, granted_ms: int
) -> None:
    client = KazooClient(hosts=zk_hosts, timeout=asked_ms / 1000, auth_data=[("digest", ZK_AUTH)])
    track_granted_timeout(client)
    assert granted_timeout_ms(client) is None  # no session yet
    client.start(timeout=CONNECT_TIMEOUT_S)
    try:
        assert granted_timeout_ms(client) == granted_ms
    finally:
        client.stop()
        client.close()


def test_a_node_asking_more_than_the_server_grants_exports_the_grant(make_node: MakeNode) -> None:
    """A real node asking 30 s of servers that grant at most 20 s exports 20 s (and times
    its self-stop with it: tests/unit/test_node_machine.py shows the timer)."""
    node = make_node(
        "asks-30s", **{"zookeeper.session_timeout_ms": 3 * MAX_MS // 2, "pool.max_block_age_s": 600}
    )
    wanted = f"allocator_zookeeper_session_timeout_seconds {MAX_MS / 1000}".encode()

    def exported() -> bool:
        with urllib.request.urlopen(f"{node.admin_url}/metrics", timeout=5) as response:  # noqa: S310
            return wanted in response.read()

    wait_for(exported, "the node to export the granted timeout")
