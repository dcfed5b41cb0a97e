"""The clients' age bound against a real PostgreSQL: they claim through
``allocator.claim_blocks_expiring`` where it exists (each block with its ``expires_in_ms``),
drop a block's IDs at its local deadline, and fall back to ``allocator.claim_blocks`` where
the schema predates it.

Rules: the superuser stocks the pool with blocks of the current millisecond and writes a
leader's heartbeat with a bound of :data:`BOUND_MS` (migration 0011), so every claim comes
with an ``expires_in_ms`` of at most the bound; the schema before 0011 is stood for by
dropping the function. The clients claim as a throwaway role in ``allocator_consumer``;
deadlines run on a fake clock the test moves by the whole bound, so nothing depends on how
fast the machine is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from allocator.client import AsyncIdClient, AsyncPostgresClaimer, IdClient, PostgresClaimer
from allocator.core.layout import Layout
from tests.fixtures.pg import consumer_login, cut, take_fence

pytestmark = pytest.mark.integration

EPOCH = 7
SIZE = 16
BOUND_MS = 60_000
LAYOUT = Layout()


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def bound_in_force(url: str) -> None:
    """A leader's heartbeat (generation 0, :data:`EPOCH`) with the bound :data:`BOUND_MS`."""
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(
            "SELECT allocator.leader_heartbeat(0, %s, %s, true, 60000)", (EPOCH, BOUND_MS)
        )


def without_claim_blocks_expiring(url: str) -> None:
    """The schema as it was before migration 0011, for the clients: no such function."""
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("DROP FUNCTION allocator.claim_blocks_expiring(text, integer)")


def stock(url: str, count: int) -> int:
    """``count`` blocks of :data:`SIZE` IDs from the current millisecond; the first ID."""
    with psycopg.connect(url, autocommit=True) as admin:
        take_fence(admin, EPOCH)
        row = admin.execute("SELECT allocator.db_now_ms()").fetchone()
        assert row is not None
        first = LAYOUT.encode(int(row[0]), 0, 0, 0)
        cut(admin, EPOCH, [(first + i * SIZE, first + (i + 1) * SIZE - 1) for i in range(count)])
    return first


def claimed(url: str) -> set[int]:
    with psycopg.connect(url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT first_id, last_id FROM allocator.block_ledger WHERE claimed_by IS NOT NULL"
        ).fetchall()
    return {i for first, last in rows for i in range(first, last + 1)}


@pytest.fixture
def app_url(db_url: str) -> Iterator[str]:
    with consumer_login(db_url, "t_expiry") as url:
        yield url


def test_without_claim_blocks_expiring_the_claimers_fall_back(db_url: str, app_url: str) -> None:
    without_claim_blocks_expiring(db_url)
    stock(db_url, 4)
    own = PostgresClaimer(app_url)
    with ConnectionPool(app_url, min_size=1, max_size=1, open=True) as pool:
        pooled = PostgresClaimer(pool)
        try:
            assert [b.expires_in_ms for b in own.claim("orders", 1)] == [None]
            assert [b.expires_in_ms for b in own.claim("orders", 1)] == [None]
            # A pooled connection is not autocommit: the fallback must not reuse the
            # transaction the failed lookup aborted.
            assert [b.expires_in_ms for b in pooled.claim("orders", 1)] == [None]
        finally:
            own.close()

    async def claim_async() -> list[Any]:
        claimer = AsyncPostgresClaimer(app_url)
        try:
            return [b.expires_in_ms for b in await claimer.claim("orders", 1)]
        finally:
            await claimer.close()

    assert asyncio.run(claim_async()) == [None]
    assert len(claimed(db_url)) == 4 * SIZE


def test_the_client_drops_a_block_at_its_deadline(db_url: str, app_url: str) -> None:
    first = stock(db_url, 6)
    bound_in_force(db_url)
    clock = FakeClock()
    client = IdClient(app_url, "orders", wait_timeout_s=5.0, clock=clock)
    try:
        ids = [client.next_id(), client.next_id()]
        assert ids == [first, first + 1]
        clock.now += BOUND_MS / 1000  # block 0 reaches its deadline (at most the bound)
        ids.append(client.next_id())
        assert ids[-1] >= first + SIZE  # from a later block: block 0's rest is dropped
        ids += client.take(SIZE)  # past the next prefetch, over the non-blocking path
    finally:
        report = client.close()
    stats = client.get_stats()
    assert stats["ids_expired"] == report.expired >= SIZE - 2
    assert stats["claims_begun"] >= 1
    unused = {i for first, last in report.ranges for i in range(first, last + 1)}
    assert not set(range(first + 2, first + SIZE)) & (set(ids) | unused)
    # Every claimed ID was handed out once, reported unused, or dropped as expired.
    assert len(set(ids)) == len(ids)
    assert len(claimed(db_url)) == len(ids) + report.count + report.expired


def test_the_async_client_drops_a_block_at_its_deadline(db_url: str, app_url: str) -> None:
    first = stock(db_url, 4)
    bound_in_force(db_url)
    clock = FakeClock()

    async def scenario() -> tuple[list[int], int]:
        client = AsyncIdClient(app_url, "orders", clock=clock)
        try:
            ids = [await client.next_id()]
            clock.now += BOUND_MS / 1000
            ids.append(await client.next_id())
        finally:
            report = await client.aclose()
        return ids, report.expired

    ids, expired = asyncio.run(scenario())
    assert ids[0] == first
    assert ids[1] >= first + SIZE
    assert expired >= SIZE - 1
