"""Chaos: the ZooKeeper ensemble fails (one server killed; quorum lost, then restored).

Rules: one embedded cluster per test with three ZooKeeper servers (the point is the
ensemble), three supervised nodes, consumers claiming throughout; every test ends with the
checker (I1-I5) finding nothing. Servers are killed with SIGKILL (a crash) by the cluster
manager and restarted on their recorded ports with their data.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from allocator.core.errors import ZooKeeperUnavailableError
from allocator.node import EXIT_SESSION_LOST
from tests.chaos.harness import (
    SESSION_TIMEOUT_S,
    ChaosCluster,
    chaos_consumers,
    http_json,
    now_utc,
    wait_for,
)

pytestmark = pytest.mark.integration

CLAIMS = 20


def test_one_zookeeper_server_killed_the_cluster_keeps_a_leader_and_keeps_cutting() -> None:
    """Breaks: the ZooKeeper ensemble's own leader crashes (SIGKILL), the harshest single
    server failure: the two survivors elect a new ZooKeeper leader, and every client of
    the dead server must move to a survivor.

    Must hold: the ensemble keeps quorum; the cluster has an allocator leader that may
    write and cuts blocks after the ensemble recovered; consumers keep claiming; the killed
    server rejoins as a follower when restarted; no violation. Cost: ~5 s.
    """
    with ChaosCluster(zk=3, nodes=3) as chaos:
        old = chaos.wait_leader()
        chaos.wait_pool(300)
        victim = wait_for(
            lambda: next((s for s in chaos.info().zk_servers if s.mode == "leader"), None),
            "the ZooKeeper ensemble's leader",
        )
        consumers = chaos_consumers(chaos.info().consumer_database_url).start()
        try:
            wait_for(lambda: consumers.count() >= CLAIMS, "claims before the fault")
            chaos.cluster.stop_zk(victim.id)
            wait_for(
                lambda: any(s.mode == "leader" for s in chaos.info().zk_servers),
                "the surviving ZooKeeper servers to elect a leader",
            )
            recovered = now_utc()
            leader = chaos.wait_leader()
            chaos.wait_cutting(leader.epoch, after=recovered)
            status = http_json(f"{chaos.node(leader.name).admin_url}/status")
            assert status["role"] == "leader"
            assert status["may_write"]
            since = time.time()
            wait_for(lambda: consumers.count(since=since) >= CLAIMS, "claims after the kill")
            chaos.cluster.start_zk(victim.id)
            rejoined = wait_for(
                lambda: next(s for s in chaos.info().zk_servers if s.id == victim.id).mode,
                f"ZooKeeper server {victim.id} to serve again",
            )
            assert rejoined == "follower"
            chaos.assert_clean(consumers)
        finally:
            consumers.stop()
        # Reported, not asserted: a 2 s session may or may not outlive the ZooKeeper election.
        print(f"allocator leader before: {old}, after: {leader}; {consumers.describe()}")


def test_quorum_lost_nothing_is_written_then_restored_cutting_resumes() -> None:
    """Breaks: two of the three ZooKeeper servers crash; the survivor has no quorum and
    serves nobody, so no node can prove it leads. Later both come back.

    Must hold: no block is cut from the moment quorum was lost plus one session timeout
    (the longest a leader may take to notice) until quorum is back; the leader stops itself
    (exit 3, restarted by the supervisor); consumers keep claiming from the pool during the
    outage; the restarted leader process cannot start without quorum (exit 75); after the
    restore a leader with a newer epoch cuts again; no violation. Cost: ~15 s
    (the outage lasts until a node restart gave up: ~7 s).
    """
    with ChaosCluster(zk=3, nodes=3) as chaos:
        old = chaos.wait_leader()
        info = chaos.info()
        consumers = chaos_consumers(info.consumer_database_url).start()
        try:
            wait_for(lambda: consumers.count() >= CLAIMS, "claims before the fault")
            chaos.wait_pool(1000)
            restarts = chaos.node(old.name).restarts
            first, second = (s.id for s in info.zk_servers[:2])
            chaos.cluster.stop_zk(first)
            lost_at = now_utc()  # quorum goes with the second server, an instant later
            chaos.cluster.stop_zk(second)
            quiet_from = lost_at + timedelta(seconds=SESSION_TIMEOUT_S)
            victim = chaos.wait_exit(old.name, restarts_above=restarts)
            assert victim.last_exit_code == EXIT_SESSION_LOST
            # Restarted, it cannot even begin without a ZooKeeper that serves: it gives up
            # after its connect timeout (3 s here) and is restarted again.
            again = chaos.wait_exit(old.name, restarts_above=victim.restarts)
            assert again.last_exit_code == ZooKeeperUnavailableError.exit_code
            restored_at = now_utc()
            served = consumers.count(since=quiet_from.timestamp(), until=restored_at.timestamp())
            assert served >= CLAIMS, "the pool did not serve while ZooKeeper had no quorum"
            chaos.cluster.start_zk(first)
            chaos.cluster.start_zk(second)
            assert restored_at > quiet_from, "the outage ended before the leader had to notice"
            new = chaos.wait_leader(newer_than=old.epoch)
            chaos.wait_cutting(new.epoch, after=restored_at)
            chaos.assert_clean(consumers)
        finally:
            consumers.stop()
        written = [r for r in chaos.ledger() if quiet_from <= r.cut_at < restored_at]
        assert not written, f"{len(written)} blocks cut without quorum, first: {written[0]}"
