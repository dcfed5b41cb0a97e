"""Chaos: PostgreSQL crashes (``stop -m immediate``: no shutdown checkpoint) while the leader
refills, and comes back after crash recovery.

Rules: one embedded cluster (one ZooKeeper server, two nodes), consumers claiming
throughout and reconnecting after errors; the checker (I1-I5) finds nothing. I4 is the
point: every claim that returned before the crash is still claimed by the same consumer.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from tests.chaos.harness import ChaosCluster, chaos_consumers, now_utc, wait_for

pytestmark = pytest.mark.integration

CLAIMS = 20
ASYNC_COMMIT = "-c synchronous_commit=off"
"""One consumer's sessions ask for asynchronous commit: claim_blocks must override it (I4)."""


def test_postgres_crash_during_refill_loses_no_returned_claim_and_writes_resume() -> None:
    """Breaks: the database dies without a checkpoint (SIGQUIT to the postmaster) while the
    leader is cutting and consumers are claiming; it restarts and replays its WAL.

    Must hold: every claim that returned before the crash is in the ledger, claimed by the
    consumer that got it (I4: claims commit synchronously, also for the consumer whose
    session sets ``synchronous_commit = off``); consumers see errors, then
    claim again; the node survives and cuts again after the restart (no ZooKeeper fault, so
    the same leader keeps its term); no violation. Cost: ~4 s.
    """
    with ChaosCluster(zk=1, nodes=2) as chaos:
        old = chaos.wait_leader()
        chaos.wait_pool(300)
        consumers = chaos_consumers(
            chaos.info().consumer_database_url,
            {"chaos-sync": 1, "chaos-async": 3},
            options={"chaos-async": ASYNC_COMMIT},
        ).start()
        try:
            wait_for(lambda: consumers.count() >= CLAIMS, "claims before the crash")
            wait_for(
                lambda: chaos.blocks_cut(after=now_utc() - timedelta(seconds=0.3)),
                "the leader to be refilling",
            )
            chaos.cluster.stop_postgres(mode="immediate")
            crashed = time.time()
            wait_for(lambda: consumers.totals().errors, "the consumers to notice the crash")
            restarted_at = now_utc()
            chaos.cluster.start_postgres()
            chaos.wait_cutting(old.epoch, after=restarted_at)
            resumed = time.time()
            wait_for(lambda: consumers.count(since=resumed) >= CLAIMS, "claims after the restart")
            records = chaos.assert_clean(consumers)
        finally:
            consumers.stop()
        before = [r for r in records if r.returned_at < crashed]
        assert {r.consumer for r in before} == {"chaos-sync", "chaos-async"}
        claimed = {row.block_id: row.claimed_by for row in chaos.ledger()}
        assert all(claimed.get(r.block_id) == r.consumer for r in before)
        leader = chaos.leader()
        assert leader is not None
        assert (leader.epoch, leader.name) == (old.epoch, old.name)
        assert chaos.node(old.name).restarts == 0
