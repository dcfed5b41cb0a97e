"""Chaos: PostgreSQL fails over to its synchronous standby while consumers claim and the
leader refills.

Rules: one embedded cluster started with a synchronous streaming standby (one ZooKeeper
server, two nodes); nodes and consumers use the cluster's multi-host URL
(``target_session_attrs=read-write``) and are told nothing about the failover. The checker
(I1-I5) finds nothing; I4 across the failover is the point: every claim the primary
acknowledged before it was killed is on the promoted standby, claimed by the same consumer.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from tests.chaos.harness import ChaosCluster, Consumers, now_utc, wait_for

pytestmark = pytest.mark.integration

CLAIMS = 20


def test_failover_to_a_synchronous_standby_keeps_every_acknowledged_claim() -> None:
    """Breaks: the primary dies without a checkpoint (``stop -m immediate``) while the
    leader is cutting and consumers are claiming; the standby is promoted.

    Must hold: every claim returned before the kill is in the promoted server's ledger,
    claimed by the consumer that got it; no block is handed out twice (checker: I1-I5);
    consumers claim again through the same URL and a leader cuts on the new primary.
    Cost: ~10 s.
    """
    with ChaosCluster(zk=1, nodes=2, pg_standby=True) as chaos:
        chaos.wait_leader()
        chaos.wait_pool(300)
        info = chaos.info()
        assert [s.sync_state for s in info.pg_servers] == [None, "sync"]
        consumers = Consumers(
            info.consumer_database_url, {"chaos-one": 1, "chaos-three": 3}
        ).start()
        try:
            wait_for(lambda: consumers.count() >= CLAIMS, "claims before the failover")
            wait_for(
                lambda: chaos.blocks_cut(after=now_utc() - timedelta(seconds=0.3)),
                "the leader to be refilling",
            )
            killed = time.time()
            after = chaos.cluster.pg_failover()
            promoted_at = now_utc()
            assert [s.role for s in after.pg_servers] == ["retired", "primary"]
            wait_for(
                lambda: chaos.blocks_cut(after=promoted_at), "a leader cutting on the new primary"
            )
            resumed = time.time()
            wait_for(lambda: consumers.count(since=resumed) >= CLAIMS, "claims after failover")
            records = chaos.assert_clean(consumers)
        finally:
            consumers.stop()
        before = [r for r in records if r.returned_at < killed]
        assert {r.consumer for r in before} == {"chaos-one", "chaos-three"}
        claimed = {row.block_id: row.claimed_by for row in chaos.ledger()}
        lost = [r for r in before if claimed.get(r.block_id) != r.consumer]
        assert not lost, f"{len(lost)} acknowledged claims lost in the failover: {lost[:5]}"
