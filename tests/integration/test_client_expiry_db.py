"""The clients' age bound against a real PostgreSQL: they claim through
``allocator.claim_blocks_expiring`` where it exists (each block with its ``expires_in_ms``),
drop a block's IDs at its local deadline, and fall back to ``allocator.claim_blocks`` where
the schema predates it.

STAND-IN: migration 0011 (issue 22) brings the real ``allocator.claim_blocks_expiring``.
Until it is merged, the tests that need it create a stand-in in their own database
(tests/fixtures/stand_in_0011.py: ``claim_blocks``' rows with a fixed ``expires_in_ms``);
replace it with the real function and a bound in force once 0011 is merged.

Rules: the superuser stocks the pool and installs the stand-in; the clients claim as a
throwaway role in ``allocator_consumer``; deadlines run on a fake clock the test moves, so
nothing depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from allocator.client import AsyncIdClient, AsyncPostgresClaimer, IdClient, PostgresClaimer
from tests.fixtures.pg import consumer_login, cut, take_fence
from tests.fixtures.stand_in_0011 import install_claim_blocks_expiring

pytestmark = pytest.mark.integration

EPOCH = 7
FIRST = 1 << 22
SIZE = 16
EXPIRES_IN_MS = 300


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def install_stand_in(url: str) -> None:
    install_claim_blocks_expiring(url, EXPIRES_IN_MS)


def stock(url: str, count: int) -> None:
    ranges = [(FIRST + i * SIZE, FIRST + (i + 1) * SIZE - 1) for i in range(count)]
    with psycopg.connect(url, autocommit=True) as admin:
        take_fence(admin, EPOCH)
        cut(admin, EPOCH, ranges)


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
    install_stand_in(db_url)
    stock(db_url, 6)
    clock = FakeClock()
    client = IdClient(app_url, "orders", wait_timeout_s=5.0, clock=clock)
    try:
        ids = [client.next_id(), client.next_id()]
        assert ids == [FIRST, FIRST + 1]
        clock.now += EXPIRES_IN_MS / 1000  # block 0 reaches its deadline
        ids.append(client.next_id())
        assert ids[-1] >= FIRST + SIZE  # from a later block: block 0's rest is dropped
        ids += client.take(SIZE)  # past the next prefetch, over the non-blocking path
    finally:
        report = client.close()
    stats = client.get_stats()
    assert stats["ids_expired"] == report.expired >= SIZE - 2
    assert stats["claims_begun"] >= 1
    unused = {i for first, last in report.ranges for i in range(first, last + 1)}
    assert not set(range(FIRST + 2, FIRST + SIZE)) & (set(ids) | unused)
    # Every claimed ID was handed out once, reported unused, or dropped as expired.
    assert len(set(ids)) == len(ids)
    assert len(claimed(db_url)) == len(ids) + report.count + report.expired


def test_the_async_client_drops_a_block_at_its_deadline(db_url: str, app_url: str) -> None:
    install_stand_in(db_url)
    stock(db_url, 4)
    clock = FakeClock()

    async def scenario() -> tuple[list[int], int]:
        client = AsyncIdClient(app_url, "orders", clock=clock)
        try:
            ids = [await client.next_id()]
            clock.now += EXPIRES_IN_MS / 1000
            ids.append(await client.next_id())
        finally:
            report = await client.aclose()
        return ids, report.expired

    ids, expired = asyncio.run(scenario())
    assert ids[0] == FIRST
    assert ids[1] >= FIRST + SIZE
    assert expired >= SIZE - 1
