"""allocator.client against a real PostgreSQL: IDs come only from claimed blocks, clients in
threads and processes never overlap, and the database's errors arrive translated.

Rules: the superuser only stocks the pool (``take_fence`` + ``cut``) and reads the ledger;
the clients claim as a throwaway login role in ``allocator_consumer`` where the role
matters. Processes are started with ``spawn`` (no inherited connections or threads).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import select
import threading
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool

from allocator.client import (
    AsyncIdClient,
    Block,
    ClaimArgumentError,
    IdClient,
    PoolEmptyError,
    PostgresClaimer,
    claim_once,
)
from allocator.core.errors import DatabaseError, DatabaseUnavailableError
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


def assert_ends_in_al003(error: BaseException) -> None:
    """The chain under a client's PoolEmptyError ends in the database's own AL003."""
    cause = error.__cause__
    assert isinstance(cause, PoolEmptyError)
    assert isinstance(cause.__cause__, psycopg.Error)
    assert cause.__cause__.sqlstate == "AL003"


def test_an_exhausted_pool_raises_pool_empty_error(db_url: str, app_url: str) -> None:
    stock(db_url, count=2, size=8)
    client = IdClient(app_url, "orders", wait_timeout_s=0.3, backoff_max_s=0.05)
    try:
        assert len(set(client.take(16))) == 16
        with pytest.raises(PoolEmptyError, match="the pool is empty") as caught:
            client.next_id()
        assert_ends_in_al003(caught.value)
        # Refilled, the same client carries on. (A retry that draws its ticket while the cut
        # commits strands one block until a node's requeue_stranded: hence two blocks.)
        stock(db_url, count=2, size=8, first=FIRST + 1024)
        assert client.next_id() in (FIRST + 1024, FIRST + 1032)
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
            assert client.get_stats()["claims_begun"] == 0  # a pool: the thread claims
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


# -- the prefetch sent and collected on the caller's thread ------------------------------------


class WatchedClaimer(PostgresClaimer):
    """A PostgresClaimer that notes which thread makes each call."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.calls: list[tuple[str, str]] = []

    def _note(self, what: str) -> None:
        self.calls.append((what, threading.current_thread().name))

    def claim(self, consumer: str, n: int) -> list[Block]:
        self._note("claim")
        return super().claim(consumer, n)

    def begin(self, consumer: str, n: int) -> bool:
        self._note("begin")
        return super().begin(consumer, n)

    def poll(self) -> list[Block] | None:
        self._note("poll")
        return super().poll()

    def finish(self, timeout_s: float | None = None) -> list[Block]:
        self._note("finish")
        return super().finish(timeout_s)

    def threads_of(self, what: str) -> set[str]:
        return {thread for call, thread in self.calls if call == what}

    def wait_for_answer(self) -> None:
        """Block until a begun claim's answer is readable (a test's peek at the socket)."""
        sent = self._sent
        assert sent is not None
        readable, _, _ = select.select([sent.conn.pgconn.socket], [], [], 10)
        assert readable


def poll_until_answered(claimer: PostgresClaimer) -> list[Block]:
    deadline = time.monotonic() + 10
    while (blocks := claimer.poll()) is None:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    return blocks


def test_the_prefetch_is_sent_and_collected_on_the_callers_thread(
    db_url: str, app_url: str
) -> None:
    stock(db_url, count=40, size=16)
    claimer = WatchedClaimer(app_url)
    client = IdClient(claimer, "orders", batch_blocks=2, refill_at=1.0, wait_timeout_s=5)
    ids: list[int] = []
    try:
        for _ in range(10):  # segments
            for _ in range(2):  # blocks
                if claimer.calls and claimer.calls[-1][0] == "begin":
                    claimer.wait_for_answer()  # so the boundary finds it in
                ids += [client.next_id() for _ in range(16)]
        stats = client.get_stats()
        report = client.close()
    finally:
        claimer.close()
    assert len(set(ids)) == 320
    ledger = claimed_by(db_url)["orders"]
    assert set(ids) <= ledger
    unused = {i for first, last in report.ranges for i in range(first, last + 1)}
    assert report.complete
    assert set(ids) | unused == ledger
    assert stats["claims_on_claimer_thread"] == 1  # the first segment, nothing after
    assert stats["claims_begun"] == stats["claims_on_caller_thread"] == 10
    assert stats["claims_handed_over"] == 0
    assert stats["waits"] == 1
    main = threading.current_thread().name
    assert claimer.threads_of("begin") == claimer.threads_of("poll") == {main}
    assert claimer.threads_of("claim") == {"allocator-claimer:orders"}
    assert claimer.threads_of("finish") == set()


def test_a_busy_url_client_claims_on_the_callers_thread(db_url: str, app_url: str) -> None:
    stock(db_url, count=300, size=16)
    client = IdClient(app_url, "orders", batch_blocks=2, wait_timeout_s=5)
    ids = [client.next_id() for _ in range(3000)] + client.take(500)
    stats = client.get_stats()
    report = client.close()  # finishes a begun claim, if one is out: it is in the report
    assert len(set(ids)) == 3500
    ledger = claimed_by(db_url)["orders"]
    unused = {i for first, last in report.ranges for i in range(first, last + 1)}
    assert report.complete
    assert set(ids) | unused == ledger
    assert not unused & set(ids)
    assert stats["claims_on_claimer_thread"] == 1
    assert stats["claims_begun"] >= stats["claims"] - 1 >= 100
    assert stats["claims_begun"] == (
        stats["claims_on_caller_thread"] + stats["claims_handed_over"] + stats["claim_in_flight"]
    )


def test_the_non_blocking_path_translates_the_sql_errors(db_url: str, app_url: str) -> None:
    claimer = PostgresClaimer(app_url)
    try:
        assert not claimer.begin("orders", 1)  # no connection yet: claim() opens it
        stock(db_url, count=1, size=8)
        assert [b.first_id for b in claimer.claim("orders", 1)] == [FIRST]
        assert claimer.begin("orders", 1)
        assert not claimer.begin("orders", 1)  # one at a time
        with pytest.raises(PoolEmptyError) as empty:
            claimer.finish()
        assert isinstance(empty.value.__cause__, psycopg.Error)
        assert empty.value.__cause__.sqlstate == "AL003"
        # AL001..AL003 keep the connection: the next claim can be begun at once.
        assert claimer.begin("", 1)
        with pytest.raises(ClaimArgumentError, match="non-empty") as bad_consumer:
            poll_until_answered(claimer)
        assert bad_consumer.value.sqlstate == "AL001"
        assert claimer.begin("orders", 1001)
        with pytest.raises(ClaimArgumentError, match="between 1 and 1000") as bad_count:
            poll_until_answered(claimer)
        assert bad_count.value.sqlstate == "AL002"
        stock(db_url, count=3, size=8, first=FIRST + 8)
        assert claimer.begin("orders", 5)
        assert [b.first_id for b in poll_until_answered(claimer)] == [
            FIRST + 8,
            FIRST + 16,
            FIRST + 24,
        ]
        # Without its grant the role gets permission denied: a DatabaseError, and the
        # connection is closed (the next claim reconnects).
        role = conninfo_to_dict(app_url)["user"]
        with psycopg.connect(db_url, autocommit=True) as admin:
            admin.execute(
                pgsql.SQL("REVOKE allocator_consumer FROM {}").format(pgsql.Identifier(role))
            )
        assert claimer.begin("orders", 1)
        with pytest.raises(DatabaseError) as denied:
            claimer.finish()
        assert isinstance(denied.value.__cause__, psycopg.Error)
        assert denied.value.__cause__.sqlstate == "42501"
        assert not claimer.begin("orders", 1)  # closed
    finally:
        claimer.close()


def test_finish_gives_up_after_its_bound(db_url: str, app_url: str) -> None:
    stock(db_url, count=3, size=8)  # the abandoned claim takes one once the lock is gone
    claimer = PostgresClaimer(app_url)
    try:
        claimer.claim("orders", 1)
        with psycopg.connect(db_url) as admin:  # a transaction holding the blocks table
            admin.execute("LOCK TABLE allocator.blocks IN ACCESS EXCLUSIVE MODE")
            assert claimer.begin("orders", 1)
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailableError, match="no answer"):
                claimer.finish(0.3)
            assert time.monotonic() - started >= 0.3
            admin.rollback()
        assert not claimer.begin("orders", 1)  # abandoned with its connection
        assert len(claimer.claim("orders", 1)) == 1  # which the next claim reopens
    finally:
        claimer.close()


def test_a_begun_claim_on_an_empty_pool_raises_pool_empty_error(db_url: str, app_url: str) -> None:
    stock(db_url, count=2, size=8)
    client = IdClient(app_url, "orders", refill_at=1.0, wait_timeout_s=0.5, backoff_max_s=0.05)
    try:
        assert len(set(client.take(16))) == 16
        with pytest.raises(PoolEmptyError, match="the pool is empty") as caught:
            client.next_id()
        assert_ends_in_al003(caught.value)
        stats = client.get_stats()
        assert stats["claims_begun"] == 2  # block 2, then the claim that found none
        assert stats["pool_empty_answers"] >= 1
        # Refilled, the claimer thread's retry succeeds; then the caller's thread claims.
        # (A retry that draws its ticket while the cut commits strands one block: spares.)
        stock(db_url, count=8, size=8, first=FIRST + 1024)
        first = client.next_id()
        assert FIRST + 1024 <= first < FIRST + 1024 + 64
        client.take(7)
        assert client.next_id() > first + 7
        assert client.get_stats()["claims_begun"] == 4
    finally:
        client.close()


def test_a_lost_connection_on_the_non_blocking_path_is_retried(db_url: str, app_url: str) -> None:
    stock(db_url, count=200, size=16)
    role = conninfo_to_dict(app_url)["user"]
    client = IdClient(
        app_url, "orders", batch_blocks=2, refill_at=1.0, wait_timeout_s=10, backoff_max_s=0.05
    )
    ids: list[int] = []
    try:
        for _ in range(5):
            ids += client.take(40)
            with psycopg.connect(db_url, autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                    (role,),
                )
        ids += client.take(40)
        stats = client.get_stats()
    finally:
        report = client.close()
    assert len(set(ids)) == len(ids) == 240
    ledger = claimed_by(db_url)["orders"]
    assert set(ids) <= ledger
    assert not {i for first, last in report.ranges for i in range(first, last + 1)} & set(ids)
    assert stats["claims_on_claimer_thread"] >= 2  # reconnected by the claimer thread
