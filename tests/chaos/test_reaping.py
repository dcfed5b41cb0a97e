"""Chaos: a crashed node's session is reaped (by its supervisor, or by the node itself when
it starts again), so the handover does not wait for ZooKeeper to expire it; a paused
leader is never reaped; the supervisor's reaper leaves the restarted node's own session
file alone (issue 19, item 6).

Rules: the session timeout is 20 s (the local ZooKeeper's maximum), so a handover within
half of it can only come from reaping: no timing is measured, the bound is the
behaviour (expiry could not have happened yet). The reaper's own decisions are unit-tested
(test_reaper); here the real supervisor, ZooKeeper and ``allocator reap-session`` act.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from allocator.local import nodes as nodes_mod
from allocator.session import file as session_file
from tests.chaos.harness import ChaosCluster, chaos_consumers, http_json, log_events, wait_for

pytestmark = pytest.mark.integration

SESSION_TIMEOUT_MS = 20_000
BEFORE_EXPIRY_S = SESSION_TIMEOUT_MS / 1000 / 2
"""A handover within this time cannot have come from the session's expiry."""
ALLOCATOR = str(Path(sys.executable).with_name("allocator"))


def reap_session(chaos: ChaosCluster, name: str) -> subprocess.CompletedProcess[str]:
    """``allocator reap-session`` configured as node ``name`` is (its environment)."""
    info = chaos.info()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ALLOCATOR_")},
        "ALLOCATOR_ZOOKEEPER_HOSTS": info.node_zk_hosts,
        "ALLOCATOR_ZOOKEEPER_AUTH": info.zk_auth,
        "ALLOCATOR_NODE_NAME": name,
        "ALLOCATOR_NODE_STATE_DIR": str(chaos.node_state_dir(name)),
    }
    return subprocess.run(
        [ALLOCATOR, "reap-session"], env=env, capture_output=True, text=True, timeout=60
    )


def assert_records_its_live_session(chaos: ChaosCluster, name: str) -> None:
    """Supervised node ``name`` runs again, and its session file names its process and the
    session its ``/status`` shows."""

    def recorded() -> bool:
        node = chaos.node(name)
        record = session_file.read(chaos.node_state_dir(name))
        if node.pid is None or record is None or record.pid != node.pid:
            return False
        return bool(
            http_json(f"{node.admin_url}/status")["session_id"] == f"{record.session_id:#x}"
        )

    wait_for(recorded, f"restarted {name} to record its live session", ignore=(OSError,))


def test_a_killed_leader_is_reaped_and_a_paused_one_is_not() -> None:
    """Breaks: SIGSTOP of the leader (``reap-session`` must refuse: it runs), then SIGKILL
    of that paused leader, then SIGKILL of the next leader.

    Must hold: the paused node's session file stays and nobody reaps it; each SIGKILL is
    followed by a new leader well before the session could expire, because the supervisor
    reaped the session (``event=session_reaped`` in its log); each killed node, restarted,
    keeps a session file naming its live session (the reaper removed only the dead one's);
    the checker finds nothing."""
    with ChaosCluster(zk=1, nodes=3, session_timeout_ms=SESSION_TIMEOUT_MS) as chaos:
        first = chaos.wait_leader()
        chaos.wait_pool(100)
        consumers = chaos_consumers(chaos.info().consumer_database_url).start()
        try:
            chaos.cluster.signal_node(first.name, "SIGSTOP")
            refused = reap_session(chaos, first.name)
            assert refused.returncode == 0, refused.stderr
            assert refused.stdout.startswith("alive:"), refused.stdout
            assert session_file.read(chaos.node_state_dir(first.name)) is not None

            chaos.cluster.signal_node(first.name, "SIGKILL")  # the paused one dies
            second = chaos.wait_leader(newer_than=first.epoch, timeout_s=BEFORE_EXPIRY_S)
            assert second.name != first.name

            chaos.cluster.signal_node(second.name, "SIGKILL")
            third = chaos.wait_leader(newer_than=second.epoch, timeout_s=BEFORE_EXPIRY_S)
            assert third.name != second.name

            supervisor_log = nodes_mod.supervisor_log_path(chaos.state_dir)
            reaped = wait_for(
                lambda: len(log_events(supervisor_log, "session_reaped")) >= 2 or None,
                "the supervisor to log both reapings",
            )
            assert reaped
            for name in (first.name, second.name):
                assert_records_its_live_session(chaos, name)
            chaos.assert_clean(consumers)
        finally:
            consumers.stop()


def test_a_node_restarted_by_hand_reaps_its_dead_predecessor_at_start() -> None:
    """Breaks: SIGKILL of a node that no supervisor watches (systemd without
    ``ExecStopPost=``, a node started by hand), then the same node started again.

    Must hold: the new process closes its predecessor's session before it joins (its log
    names the dead pid), and queues behind the leader."""
    with ChaosCluster(zk=1, nodes=1, session_timeout_ms=SESSION_TIMEOUT_MS) as chaos:
        chaos.wait_leader()
        old = chaos.start_extra_node("extra")
        chaos.wait_role(old.admin_url, "follower", "the extra node to queue")
        recorded = session_file.read(chaos.node_state_dir("extra"))
        assert recorded is not None
        assert recorded.pid == old.pid
        old.signal(signal.SIGKILL)
        wait_for(lambda: old.exit_code is not None, "the extra node to die")

        new = chaos.start_extra_node("extra")
        chaos.wait_role(new.admin_url, "follower", "the restarted node to queue")
        reaped = log_events(new.log_path, "session_reaped")
        assert reaped, "the restarted node did not reap its predecessor's session"
        assert f"pid {old.pid}" in reaped[-1]
        assert f"{recorded.session_id:#x}" in reaped[-1]
