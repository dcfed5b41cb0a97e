"""Claims through a real PgBouncer in transaction pool mode (Debian's): the sync and async
clients and a plain SQL claim work with more client connections than PgBouncer's server
pool, and a claim's statement_timeout stays in its own transaction (docs/claiming-ids.md,
PgBouncer).

Rules: the superuser stocks the pool and holds locks straight on PostgreSQL; everything
else goes through PgBouncer as the fixture's consumer role. PgBouncer's server pool is one
connection (tests/fixtures/pgbouncer.py), so every transaction through it runs on that one
server connection, one after the other: what a claim left behind, the next one would see.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import psycopg
import pytest

from allocator.client import AsyncIdClient, IdClient, PostgresClaimer
from allocator.core.errors import DatabaseUnavailableError
from tests.fixtures.pg import cut, take_fence
from tests.fixtures.pgbouncer import SERVER_POOL_SIZE, Bouncer

pytestmark = pytest.mark.integration

EPOCH = 3
FIRST = 1 << 22
SIZE = 8
CLAIMS_LOCK = (1095520067, 4)
"""The advisory lock ``claim_blocks`` takes shared (migration 0010): held exclusively, it
makes every claim wait."""


def stock(url: str, count: int) -> None:
    ranges = [(FIRST + i * SIZE, FIRST + (i + 1) * SIZE - 1) for i in range(count)]
    with psycopg.connect(url, autocommit=True) as admin:
        take_fence(admin, EPOCH)
        cut(admin, EPOCH, ranges)


def claimed_by(url: str) -> dict[str, set[int]]:
    result: dict[str, set[int]] = {}
    with psycopg.connect(url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT claimed_by, first_id, last_id FROM allocator.block_ledger"
            " WHERE claimed_by IS NOT NULL"
        ).fetchall()
    for consumer, first, last in rows:
        result.setdefault(consumer, set()).update(range(first, last + 1))
    return result


def through(bouncer: Bouncer) -> psycopg.Connection[tuple[Any, ...]]:
    """A plain connection through PgBouncer, as a non-Python client should make one:
    autocommit, no server-side prepared statements."""
    return psycopg.connect(bouncer.url(), autocommit=True, prepare_threshold=None)


def test_claims_through_pgbouncer_share_its_server_connections(
    db_url: str, pgbouncer: Bouncer
) -> None:
    stock(db_url, count=70)
    url = pgbouncer.url()
    with contextlib.ExitStack() as stack:
        # Four sync clients (one block per claim: their prefetches go out from the caller's
        # thread, pipelined), each with a connection of its own, all open at once.
        clients = [
            stack.enter_context(IdClient(url, f"sync-{i}", refill_at=1.0, wait_timeout_s=10))
            for i in range(4)
        ]
        taken: dict[str, list[int]] = {}
        for _ in range(3):
            for i, client in enumerate(clients):
                taken.setdefault(f"sync-{i}", []).extend(client.take(SIZE))
        # Two claimers' blocking claims, more than psycopg's automatic prepare threshold (5)
        # each: prepared server-side, both would name theirs _pg3_0 on the one server
        # connection (PgBouncer 1.18 does not track prepared statements).
        claimers = [PostgresClaimer(url, statement_timeout_ms=2000) for _ in range(2)]
        for claimer in claimers:
            stack.callback(claimer.close)
        for _ in range(7):
            for i, claimer in enumerate(claimers):
                block = claimer.claim(f"direct-{i}", 1)[0]
                got = range(block.first_id, block.last_id + 1)
                taken.setdefault(f"direct-{i}", []).extend(got)
        # Plain SQL claims (docs/sql.md), two connections.
        plain = [stack.enter_context(through(pgbouncer)) for _ in range(2)]
        for _ in range(3):
            for i, conn in enumerate(plain):
                rows = conn.execute(
                    "SELECT first_id, last_id FROM allocator.claim_blocks(%s, 1)", (f"sql-{i}",)
                ).fetchall()
                for first, last in rows:
                    taken.setdefault(f"sql-{i}", []).extend(range(int(first), int(last) + 1))

        async def two_async_clients() -> dict[str, list[int]]:
            async with (
                AsyncIdClient(url, "async-0", wait_timeout_s=10) as first,
                AsyncIdClient(url, "async-1", wait_timeout_s=10) as second,
            ):
                return {
                    "async-0": await first.take(2 * SIZE),
                    "async-1": await second.take(2 * SIZE),
                }

        taken.update(asyncio.run(two_async_clients()))
        with psycopg.connect(db_url, autocommit=True) as admin:
            servers = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = %s", (pgbouncer.role,)
            ).fetchone()
    # Ten client connections were open at once at the end (four sync clients, two claimers,
    # two plain ones, two async clients); PostgreSQL saw PgBouncer's server pool of the role.
    assert servers is not None
    assert 1 <= servers[0] <= SERVER_POOL_SIZE
    ledger = claimed_by(db_url)
    all_ids = [i for ids in taken.values() for i in ids]
    assert len(all_ids) == len(set(all_ids))  # nothing handed out twice
    for consumer, ids in taken.items():
        assert set(ids) <= ledger[consumer], consumer
    assert len(taken["direct-0"]) == len(taken["direct-1"]) == 7 * SIZE


def test_a_claims_statement_timeout_stays_in_its_transaction(
    db_url: str, pgbouncer: Bouncer
) -> None:
    stock(db_url, count=4)
    with through(pgbouncer) as other:
        default = other.execute("SHOW statement_timeout").fetchone()
        # Control: a session SET through PgBouncer does leak into the next client's
        # transaction on the shared server connection, so the check below can see a leak.
        with through(pgbouncer) as careless:
            careless.execute("SET statement_timeout = '4321ms'")
        assert other.execute("SHOW statement_timeout").fetchone() == ("4321ms",)
        other.execute("RESET statement_timeout")

        claimer = PostgresClaimer(pgbouncer.url(), statement_timeout_ms=250)
        try:
            assert len(claimer.claim("timed", 1)) == 1  # blocking: psycopg's pipeline
            assert claimer.begin("timed", 1)  # non-blocking: libpq's pipeline
            assert len(claimer.finish()) == 1
            assert other.execute("SHOW statement_timeout").fetchone() == default

            # The claim's timeout is in force in its transaction: a claim held up by the
            # claims lock is cancelled by it, and the client says so.
            with psycopg.connect(db_url) as holder:
                holder.execute("SELECT pg_advisory_xact_lock(%s, %s)", CLAIMS_LOCK)
                with pytest.raises(DatabaseUnavailableError, match="statement_timeout"):
                    claimer.claim("timed", 1)
                holder.rollback()
        finally:
            claimer.close()
        assert other.execute("SHOW statement_timeout").fetchone() == default
