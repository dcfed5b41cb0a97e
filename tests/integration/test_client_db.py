"""allocator.client against a real PostgreSQL: IDs come only from claimed blocks, clients in
threads and processes never overlap, and the database's errors arrive translated.

Rules: the superuser only stocks the pool (``take_fence`` + ``cut``) and reads the ledger;
the clients claim as a throwaway login role in ``allocator_consumer`` where the role
matters. Processes are started with ``spawn`` (no inherited connections or threads).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg_pool import ConnectionPool

from allocator.client import (
    AsyncIdClient,
    ClaimArgumentError,
    IdClient,
    PoolEmptyError,
    PostgresClaimer,
    claim_once,
)
from tests.fixtures.pg import cut, take_fence, url_for_user

pytestmark = pytest.mark.integration

EPOCH = 7
FIRST = 1 << 22
SPAWN_TIMEOUT_S = 120


def stock(url: str, count: int, size: int, first: int = FIRST) -> list[tuple[int, int]]:
    ranges = [(first + i * size, first + (i + 1) * size - 1) for i in range(count)]
    with psycopg.connect(url, autocommit=True) as admin:
        if admin.execute("SELECT epoch FROM allocator.fence").fetchone() != (EPOCH,):
            take_fence(admin, EPOCH)
        cut(admin, EPOCH, ranges)
    return ranges


def claimed_by(url: str) -> dict[str, set[int]]:
    """Every ID the ledger records as claimed, by consumer."""
    result: dict[str, set[int]] = {}
    with psycopg.connect(url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT claimed_by, first_id, last_id FROM allocator.block_ledger"
            " WHERE claimed_by IS NOT NULL"
        ).fetchall()
    for consumer, first, last in rows:
        result.setdefault(consumer, set()).update(range(first, last + 1))
    return result


@pytest.fixture
def app_url(db_url: str) -> Iterator[str]:
    """A URL of a fresh login role that is only in allocator_consumer."""
    name = f"t_app_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(
            pgsql.SQL("CREATE ROLE {} LOGIN IN ROLE allocator_consumer").format(
                pgsql.Identifier(name)
            )
        )
    yield url_for_user(db_url, name)
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,)
        )
        admin.execute(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(name)))


def test_ids_come_only_from_blocks_claimed_for_the_consumer(db_url: str, app_url: str) -> None:
    stock(db_url, count=10, size=16)
    client = IdClient(app_url, "orders", batch_blocks=2, wait_timeout_s=0.5)
    ids = [client.next_id() for _ in range(100)] + client.take(40)
    report = client.close()
    ledger = claimed_by(db_url)
    assert set(ledger) == {"orders"}
    assert len(set(ids)) == 140
    assert set(ids) <= ledger["orders"]
    unused = {i for first, last in report.ranges for i in range(first, last + 1)}
    assert len(unused) == report.count
    assert not unused & set(ids)
    # Everything the client claimed was either handed out or reported unused.
    assert set(ids) | unused == ledger["orders"]


def test_an_exhausted_pool_raises_pool_empty_error(db_url: str, app_url: str) -> None:
    stock(db_url, count=2, size=8)
    client = IdClient(app_url, "orders", wait_timeout_s=0.3, backoff_max_s=0.05)
    try:
        assert len(set(client.take(16))) == 16
        with pytest.raises(PoolEmptyError, match="the pool is empty") as caught:
            client.next_id()
        # The chain ends in the database's own AL003.
        cause = caught.value.__cause__
        assert isinstance(cause, PoolEmptyError)
        assert isinstance(cause.__cause__, psycopg.Error)
        assert cause.__cause__.sqlstate == "AL003"
        # Refilled, the same client carries on.
        stock(db_url, count=1, size=8, first=FIRST + 1024)
        assert client.next_id() == FIRST + 1024
    finally:
        client.close()


def test_claim_once_translates_the_sql_errors(db_url: str, app_url: str) -> None:
    with pytest.raises(PoolEmptyError) as empty:
        claim_once(app_url, "orders")
    assert empty.value.exit_code == 75
    claimer = PostgresClaimer(app_url)
    try:
        with pytest.raises(ClaimArgumentError, match="non-empty") as bad_consumer:
            claimer.claim("", 1)
        assert bad_consumer.value.sqlstate == "AL001"
        with pytest.raises(ClaimArgumentError, match="between 1 and 1000") as bad_count:
            claimer.claim("orders", 1001)
        assert bad_count.value.sqlstate == "AL002"
        stock(db_url, count=3, size=8)
        assert [b.first_id for b in claimer.claim("orders", 5)] == [FIRST, FIRST + 8, FIRST + 16]
    finally:
        claimer.close()


def test_a_client_over_a_connection_pool(db_url: str, app_url: str) -> None:
    stock(db_url, count=4, size=8)
    with ConnectionPool(app_url, min_size=1, max_size=2, open=True) as pool:
        with IdClient(pool, "pooled", wait_timeout_s=2) as client:
            ids = client.take(32)
        assert not pool.closed  # borrowed, not owned
    assert sorted(ids) == list(range(FIRST, FIRST + 32))


def test_the_async_client_claims_across_blocks(db_url: str, app_url: str) -> None:
    stock(db_url, count=6, size=8)

    async def main() -> list[int]:
        async with AsyncIdClient(app_url, "async", batch_blocks=2, wait_timeout_s=2) as client:
            ids = [await client.next_id() for _ in range(20)]
            ids += await client.take(20)
            return ids

    ids = asyncio.run(main())
    assert len(set(ids)) == 40
    assert set(ids) <= claimed_by(db_url)["async"]


def _take_in_process(url: str, consumer: str, threads: int, per_thread: int) -> list[int]:
    """Runs in a spawned process: one client shared by ``threads`` threads."""
    out: list[list[int]] = [[] for _ in range(threads)]
    with IdClient(url, consumer, batch_blocks=3, refill_at=0.7, wait_timeout_s=20) as client:

        def work(sink: list[int]) -> None:
            for i in range(per_thread):
                sink.extend(client.take(5) if i % 50 == 0 else [client.next_id()])

        workers = [threading.Thread(target=work, args=(sink,)) for sink in out]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    return [i for sink in out for i in sink]


def test_clients_in_threads_and_processes_hand_out_disjoint_ids(db_url: str, app_url: str) -> None:
    stock(db_url, count=600, size=32)
    per_thread = 1000
    results: dict[str, list[int]] = {}
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as processes:
        pending = {
            f"proc-{i}": processes.apply_async(
                _take_in_process, (app_url, f"proc-{i}", 3, per_thread)
            )
            for i in range(2)
        }
        in_threads: dict[str, list[int]] = {}

        def own_client(name: str) -> None:
            in_threads[name] = _take_in_process(app_url, name, 1, per_thread)

        threads = [threading.Thread(target=own_client, args=(f"thread-{i}",)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(SPAWN_TIMEOUT_S)
        for name, result in pending.items():
            results[name] = result.get(SPAWN_TIMEOUT_S)
    results.update(in_threads)
    every = [i for ids in results.values() for i in ids]
    expected_per_thread = per_thread + 20 * 4  # take(5) on every 50th call
    assert sorted(len(ids) for ids in results.values()) == sorted(
        [3 * expected_per_thread] * 2 + [expected_per_thread] * 3
    )
    assert len(set(every)) == len(every)
    ledger = claimed_by(db_url)
    for consumer, ids in results.items():
        assert set(ids) <= ledger[consumer], consumer
    names = list(results)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not ledger[a] & ledger[b], (a, b)
