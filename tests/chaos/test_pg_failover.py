"""Chaos: PostgreSQL fails over to its standby while consumers claim and the leader refills.

Rules: one embedded cluster started with a streaming standby (one ZooKeeper server, two
nodes); nodes and consumers use the cluster's multi-host URL
(``target_session_attrs=read-write``) and are told nothing about the failover.

- Synchronous (the embedded cluster's standby): the checker (I1-I5) finds nothing; I4
  across the failover is the point: every claim the primary acknowledged before it was
  killed is on the promoted standby, claimed by the same consumer.
- Asynchronous (``synchronous_standby_names`` emptied with ALTER SYSTEM; nodes allowed to
  cut with ``postgres.allow_async_replication``): made deterministic by pausing the
  standby's WAL receiver (SIGSTOP) before claims that only the primary then has, and
  killing it (SIGKILL, its unread socket data gone with it) once the primary is dead. The
  checker must find those claims lost and handed out again: the reason nodes refuse to cut
  on such a database by default.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import psycopg
import pytest

from allocator.local import pg_sql, postgres
from tests.chaos.harness import ChaosCluster, chaos_consumers, now_utc, wait_for

pytestmark = pytest.mark.integration

CLAIMS = 20
ONLY_ON_THE_PRIMARY = 100
"""Claims made while the standby receives nothing: more than the 32 sequence values
PostgreSQL logs ahead, so the promoted standby's claim tickets start among them."""


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
        consumers = chaos_consumers(
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


def wal_receiver_pid(port: int, superuser: str) -> int:
    url = postgres.database_url(superuser, port, "postgres")
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pid FROM pg_stat_wal_receiver").fetchone()
    assert row is not None, "the standby has no WAL receiver"
    assert row[0], "the standby's WAL receiver has no pid"
    return int(row[0])


def test_failover_to_an_asynchronous_standby_loses_acknowledged_claims() -> None:
    """Breaks: replication is made asynchronous, the standby's WAL receiver paused, claims
    go on (acknowledged by the primary alone), then the primary is killed, the receiver
    killed and the standby promoted.

    Must hold: the checker names the damage: claims acknowledged while the receiver was
    paused are gone from the promoted server's ledger (unclaimed, or claimed by someone
    else) and blocks are handed out twice. Cost: ~10 s.
    """
    allow = {"ALLOCATOR_POSTGRES_ALLOW_ASYNC_REPLICATION": "true"}
    with ChaosCluster(zk=1, nodes=2, pg_standby=True, node_env=allow) as chaos:
        chaos.wait_leader()
        chaos.wait_pool(300)
        info = chaos.info()
        primary, standby = info.pg_servers
        superuser = info.postgres.superuser
        url = postgres.database_url(superuser, primary.port)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = ''")
            conn.execute("SELECT pg_reload_conf()")
        wait_for(
            lambda: pg_sql.sync_state(primary.port, superuser) == "async",
            "replication to turn asynchronous",
        )
        consumers = chaos_consumers(
            info.consumer_database_url, {"chaos-one": 1, "chaos-three": 3}
        ).start()
        try:
            wait_for(lambda: consumers.count() >= CLAIMS, "claims the standby has too")
            receiver = wal_receiver_pid(standby.port, superuser)
            os.kill(receiver, signal.SIGSTOP)
            paused = time.time()
            wait_for(
                lambda: consumers.count(since=paused) >= ONLY_ON_THE_PRIMARY,
                "claims only the primary has",
            )
            killed = time.time()
            chaos.cluster.stop_postgres(mode="immediate")
            os.kill(receiver, signal.SIGKILL)
            wait_for(
                lambda: pg_sql.in_recovery(standby.port, superuser) is True,
                "the standby to restart its recovery",
            )
            chaos.cluster.pg_failover()
            resumed = time.time()
            wait_for(
                lambda: consumers.count(since=resumed) >= 2 * ONLY_ON_THE_PRIMARY,
                "claims on the promoted standby",
            )
        finally:
            records = consumers.stop()
        violations = chaos.check(records)
        claimed = {row.block_id: row.claimed_by for row in chaos.ledger()}
    only_on_primary = [r for r in records if paused <= r.returned_at < killed]
    lost = [r for r in only_on_primary if claimed.get(r.block_id) != r.consumer]
    kinds = sorted({v.message.split(" ")[0] + " " + v.invariant for v in violations})
    print(
        f"asynchronous failover: {len(lost)} of {len(only_on_primary)} claims acknowledged "
        f"while the receiver was paused are not their consumer's in the promoted ledger; "
        f"{len(violations)} violations ({kinds[:4]})"
    )
    assert lost, "no acknowledged claim was lost: the standby was not behind"
    twice = [v for v in violations if v.invariant == "I1" and "twice" in v.message]
    assert twice, f"no block handed out twice; violations: {[str(v) for v in violations[:5]]}"
