"""Issue 12, item 9: nodes logging JSON through a leader's death; every line they wrote parses.

Rules: two real ``allocator run`` processes (``node.log_format = json``) on the session's
servers (a ZooKeeper chroot and a migrated database of their own), each with stdout and
stderr appended to a log file of its own, so each file holds exactly what its node wrote
(kazoo's, APScheduler's and psycopg's records included). No supervisor: it would add its
own ``--- starting`` marker lines to the files.
"""

from __future__ import annotations

import json
import secrets
import signal
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from allocator.local import nodes as nodes_mod
from allocator.local.tcp_ports import pick_free_ports
from tests.chaos.harness import ExtraNode, http_json, wait_for
from tests.fixtures import zk

pytestmark = pytest.mark.integration

LEVELS = {"debug", "info", "warning", "error", "critical"}
OURS = ("allocator.", "jobs.")
SESSION_TIMEOUT_MS = 2000
SETTINGS = {
    "ALLOCATOR_NODE_LOG_FORMAT": "json",
    "ALLOCATOR_POOL_MIN_BLOCKS": "40",
    "ALLOCATOR_POOL_LOW_WATERMARK_BLOCKS": "10",
    "ALLOCATOR_POOL_REFILL_INTERVAL_S": "0.2",
    "ALLOCATOR_POOL_SAMPLE_INTERVAL_S": "0.5",
    "ALLOCATOR_ZOOKEEPER_MAX_RECONNECT_DELAY_S": "0.5",
    "ALLOCATOR_NODE_SHUTDOWN_TIMEOUT_S": "5",
}


class Nodes:
    """Starts ``allocator run`` processes on one chroot and database; stops them all."""

    def __init__(self, zk_hosts: str, db_url: str, folder: Path) -> None:
        self.zk_hosts, self.db_url, self.folder = zk_hosts, db_url, folder
        self.token = secrets.token_hex(16)
        self.started: list[ExtraNode] = []

    def start(self, name: str) -> ExtraNode:
        env = nodes_mod.node_env(
            name=name,
            zk_hosts=self.zk_hosts,
            postgres_url=self.db_url,
            admin_port=pick_free_ports(1)[0],
            admin_token=self.token,
            zk_auth=zk.ZK_AUTH,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            state_dir=self.folder / name,
            extra=SETTINGS,
        )
        node = ExtraNode(name, env, self.folder / f"{name}.log", self.folder)
        self.started.append(node)
        return node

    def leader(self) -> tuple[int, str | None]:
        with psycopg.connect(self.db_url, connect_timeout=3) as conn:
            row = conn.execute("SELECT epoch, holder FROM allocator.fence").fetchone()
        assert row is not None
        return int(row[0]), row[1]

    def wait_leader(self, newer_than: int = 0) -> tuple[int, str]:
        def newer() -> tuple[int, str] | None:
            epoch, holder = self.leader()
            return (epoch, holder) if holder is not None and epoch > newer_than else None

        return wait_for(newer, f"a leader with an epoch above {newer_than}")


@pytest.fixture
def nodes(zk_hosts: str, db_url: str, tmp_path: Path) -> Iterator[Nodes]:
    started = Nodes(zk_hosts, db_url, tmp_path)
    try:
        yield started
    finally:
        for node in started.started:
            node.stop()
        left = [n.pid for n in started.started if n.exit_code is None]
        assert not left, f"nodes left running: {left}"


def parse_log(path: Path) -> list[dict[str, Any]]:
    """Every line of ``path`` as a JSON object with the keys every line carries."""
    events: list[dict[str, Any]] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            event = json.loads(line)
        except ValueError as exc:
            raise AssertionError(f"{path.name}:{number} is not JSON: {line!r}") from exc
        assert isinstance(event, dict), (path.name, number, line)
        assert {"timestamp", "level", "logger", "event"} <= event.keys(), (path.name, line)
        assert str(event["timestamp"]).endswith("Z"), line
        assert datetime.fromisoformat(event["timestamp"]).utcoffset() == timedelta(0), line
        assert event["level"] in LEVELS, line
        assert isinstance(event["event"], str), line
        assert event["event"], line
        events.append(event)
    assert events, f"{path.name} is empty"
    return events


def named(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """Our events called ``name`` (a library's message never counts)."""
    return [e for e in events if e["event"] == name and e["logger"].startswith(OURS)]


def test_every_line_of_json_logs_parses_through_a_handover(nodes: Nodes) -> None:
    """Breaks: SIGKILL of the leader, then the dead node started again under its name (it
    reaps its predecessor's session, so the other node takes over at once), then both
    stopped with SIGTERM (the leader hands over on its way out).

    Must hold: every line both nodes wrote is a JSON object with a UTC ISO-8601
    ``timestamp``, a ``level``, a ``logger`` and an ``event``; the stable event names are
    there (``elected``, ``fence_taken``, ``refill``, ``session_reaped``, ``stepped_down``,
    ``stopped``) with typed fields (epochs and block counts are ints) and the reaper's
    reason with its spaces (``pid <n> no longer holds the state folder's lock``)."""
    first_node = nodes.start("json-a")
    first_epoch, holder = nodes.wait_leader()
    assert holder == "json-a"
    other = nodes.start("json-b")
    wait_for(
        lambda: http_json(f"{other.admin_url}/status")["role"] == "follower",
        "json-b to queue",
        ignore=(OSError,),
    )
    killed_pid = first_node.pid
    first_node.signal(signal.SIGKILL)
    wait_for(lambda: first_node.exit_code is not None, "json-a to die")
    restarted = nodes.start("json-a")  # reaps the dead one's session at start
    second_epoch, holder = nodes.wait_leader(newer_than=first_epoch)
    assert holder == "json-b"
    wait_for(
        lambda: http_json(f"{restarted.admin_url}/status")["role"] == "follower",
        "the restarted json-a to queue",
        ignore=(OSError,),
    )
    assert other.stop() == 0
    assert restarted.stop() == 0
    a_events = parse_log(restarted.log_path)
    b_events = parse_log(other.log_path)

    elected = named(a_events, "elected")[0]
    assert elected["epoch"] == first_epoch  # an int, not "1"
    assert isinstance(elected["generation"], int)
    assert named(a_events, "fence_taken")
    (reaped,) = named(a_events, "session_reaped")
    assert reaped["name"] == "json-a"
    assert reaped["reason"].startswith(
        f"pid {killed_pid} no longer holds the state folder's lock"
    ), reaped
    assert named(b_events, "elected")[0]["epoch"] == second_epoch
    refills = named(a_events, "refill")  # the first leader filled the pool
    assert refills
    assert all(isinstance(e["blocks"], int) and e["blocks"] > 0 for e in refills)
    assert named(b_events, "stepped_down")[-1]["reason"] == "shutdown"
    assert named(a_events, "stopped")
    assert named(b_events, "stopped")
