"""The clients' age bound without a database: a block's IDs are handed out only before its
local deadline (the claim's start plus ``expires_in_ms``), the rest is dropped, counted and
reported, never reused; prefetched blocks obey the same deadline; the claimers fall back to
``claim_blocks`` where the database lacks ``claim_blocks_expiring``.

Rules: time is a fake clock the test moves (no sleeps, no timing thresholds); claims come
from an ``InMemoryClaimer`` whose ``expires_in_ms`` the test sets.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from allocator.client import AsyncIdClient, Block, IdClient, InMemoryClaimer, PostgresClaimer
from allocator.client.base import (
    CLAIM_BLOCKS,
    CLAIM_BLOCKS_EXPIRING,
    SET_LOCAL_STATEMENT_TIMEOUT,
)
from allocator.core.errors import DatabaseError

FIRST = 1 << 22
SIZE = 10
DEADLINE_S = 10.0


class FakeClock:
    """Monotonic seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def wait_until(predicate: Callable[[], bool], timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        time.sleep(0.001)


def block_of(id_: int) -> int:
    return (id_ - FIRST) // SIZE


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_client(clock: FakeClock) -> Iterator[Callable[..., IdClient]]:
    made: list[IdClient] = []

    def make(claimer: InMemoryClaimer, **kwargs: Any) -> IdClient:
        kwargs.setdefault("backoff_initial_s", 0.001)
        kwargs.setdefault("backoff_max_s", 0.01)
        made.append(IdClient(claimer, "unit-test", clock=clock, **kwargs))
        return made[-1]

    yield make
    for client in made:
        client.close(timeout=5)


def test_ids_past_the_deadline_are_dropped_reported_and_never_reused(
    clock: FakeClock, make_client: Callable[..., IdClient]
) -> None:
    pool = InMemoryClaimer(block_size=SIZE, first_id=FIRST, expires_in_ms=1000)
    client = make_client(pool)
    assert client.next_id() == FIRST
    clock.advance(1.0)  # exactly the deadline: the block's first ID has reached the bound
    assert client.next_id() == FIRST + SIZE  # a fresh block, not FIRST + 1
    stats = client.get_stats()
    assert (stats["ids_expired"], stats["blocks_expired"]) == (SIZE - 1, 1)
    report = client.close()
    assert report.expired == SIZE - 1
    assert report.count == SIZE - 1  # the fresh block's rest
    assert report.ranges == ((FIRST + SIZE + 1, FIRST + 2 * SIZE - 1),)
    assert report.to_json()["expired"] == SIZE - 1


def test_before_the_deadline_the_block_keeps_serving(
    clock: FakeClock, make_client: Callable[..., IdClient]
) -> None:
    pool = InMemoryClaimer(block_size=SIZE, first_id=FIRST, expires_in_ms=1000)
    client = make_client(pool, refill_at=0.1)  # no time-triggered prefetch before 0.9 s
    assert client.next_id() == FIRST
    clock.advance(0.8)
    assert client.take(3) == [FIRST + 1, FIRST + 2, FIRST + 3]
    assert client.get_stats()["ids_expired"] == 0


def test_blocks_without_expiry_are_never_dropped(
    clock: FakeClock, make_client: Callable[..., IdClient]
) -> None:
    client = make_client(InMemoryClaimer(block_size=SIZE, first_id=FIRST))
    assert client.next_id() == FIRST
    clock.advance(10**9)
    assert client.next_id() == FIRST + 1
    assert client.get_stats()["ids_expired"] == 0


def test_the_deadline_counts_from_the_claims_start(
    clock: FakeClock, make_client: Callable[..., IdClient]
) -> None:
    """A claim that takes long leaves its blocks less time: a claim that outlasts
    ``expires_in_ms`` yields nothing to hand out."""

    class SlowClaimer(InMemoryClaimer):
        slow = True

        def claim(self, consumer: str, n: int) -> list[Block]:
            if self.slow:
                self.slow = False
                clock.advance(2.0)  # the answer comes after the block's deadline
            return super().claim(consumer, n)

    pool = SlowClaimer(block_size=SIZE, first_id=FIRST, expires_in_ms=1000)
    client = make_client(pool)
    assert client.next_id() == FIRST + SIZE
    assert client.get_stats()["ids_expired"] == SIZE


def test_the_next_segment_is_prefetched_before_the_deadline(
    clock: FakeClock, make_client: Callable[..., IdClient]
) -> None:
    """At a rate too low to reach the ID trigger, the time trigger (``refill_at`` of the
    segment's life left) prefetches, so the caller at the deadline does not wait."""
    pool = InMemoryClaimer(block_size=SIZE, first_id=FIRST, expires_in_ms=1000)
    client = make_client(pool)  # refill_at = 0.5: prefetch once 0.5 s of 1 s is left
    assert client.next_id() == FIRST
    clock.advance(0.6)
    assert client.next_id() == FIRST + 1
    wait_until(lambda: client.get_stats()["prefetched_blocks"] == 1)
    waits = client.get_stats()["waits"]
    clock.advance(0.4)  # block 0's deadline; the prefetched block lives until 1.6
    assert client.next_id() == FIRST + SIZE
    stats = client.get_stats()
    assert stats["waits"] == waits  # served from the prefetch
    assert stats["ids_expired"] == SIZE - 2
    assert len(pool.claims) == 2


def test_a_prefetched_segment_past_its_deadline_is_dropped_and_replaced(
    clock: FakeClock, make_client: Callable[..., IdClient]
) -> None:
    pool = InMemoryClaimer(block_size=SIZE, first_id=FIRST, expires_in_ms=60_000)
    client = make_client(pool)
    assert client.take(5) == list(range(FIRST, FIRST + 5))
    pool.expires_in_ms = 100  # the prefetch (block 1) comes out of an old pool
    assert client.next_id() == FIRST + 5  # the trigger ID: the prefetch is claimed
    wait_until(lambda: client.get_stats()["prefetched_blocks"] == 1)
    pool.expires_in_ms = 60_000
    clock.advance(0.2)
    ids = client.take(SIZE)  # block 0's rest, then the replacement's
    wait_until(lambda: len(pool.claims) == 3)
    ids += client.take(SIZE)
    assert not [i for i in ids if block_of(i) == 1]  # block 1 never handed out
    assert ids[:4] == list(range(FIRST + 6, FIRST + 10))
    assert block_of(ids[4]) == 2
    assert client.get_stats()["ids_expired"] == SIZE


def test_a_take_drops_what_it_gathered_if_that_expires_while_it_waits(
    clock: FakeClock, make_client: Callable[..., IdClient]
) -> None:
    pool = InMemoryClaimer(block_size=SIZE, first_id=FIRST, expires_in_ms=1000, blocks=1)
    client = make_client(pool, wait_timeout_s=DEADLINE_S)
    result: list[int] = []
    taker = threading.Thread(target=lambda: result.extend(client.take(SIZE + 5)))
    taker.start()
    wait_until(lambda: client.get_stats()["pool_empty_answers"] >= 1)
    clock.advance(1.0)  # block 0, gathered by the waiting take, passes its deadline
    pool.add_blocks(2)
    taker.join(DEADLINE_S)
    assert result == list(range(FIRST + SIZE, FIRST + 2 * SIZE + 5))
    assert client.get_stats()["ids_expired"] == SIZE


def test_the_async_client_drops_ids_past_the_deadline(clock: FakeClock) -> None:
    async def scenario() -> tuple[list[int], int, int]:
        pool = InMemoryClaimer(block_size=SIZE, first_id=FIRST, expires_in_ms=1000)
        client = AsyncIdClient(pool.as_async(), "unit-test", clock=clock)
        ids = [await client.next_id()]
        clock.advance(0.6)  # the time trigger: prefetch block 1
        ids.append(await client.next_id())
        while client.get_stats()["prefetched_blocks"] == 0:
            await asyncio.sleep(0)
        clock.advance(0.4)
        ids.append(await client.next_id())
        report = await client.aclose()
        return ids, report.expired, client.get_stats()["waits"]

    ids, expired, waits = asyncio.run(scenario())
    assert ids == [FIRST, FIRST + 1, FIRST + SIZE]
    assert expired == SIZE - 2
    assert waits == 1  # only the first claim


# -- the claimers: claim_blocks_expiring where the database has it -----------------------------


class FakeCursor:
    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows = rows

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows


class FakeConnection:
    """Answers ``claim_blocks_expiring`` with 42883 when ``has_expiring`` is false; records
    the claim statements (``statements``) and the statement timeouts each claim set."""

    def __init__(self, has_expiring: bool) -> None:
        self.has_expiring = has_expiring
        self.statements: list[str] = []
        self.timeouts: list[str] = []

    def pipeline(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def execute(
        self, statement: str, params: dict[str, Any], *, prepare: bool | None = None
    ) -> FakeCursor:
        assert prepare is False, "a claim is never prepared server-side (PgBouncer)"
        if statement == SET_LOCAL_STATEMENT_TIMEOUT:
            self.timeouts.append(params["ms"])
            return FakeCursor([(params["ms"],)])
        self.statements.append(statement)
        if statement == CLAIM_BLOCKS_EXPIRING:
            if not self.has_expiring:
                raise psycopg.errors.UndefinedFunction(
                    "function allocator.claim_blocks_expiring(unknown, integer) does not exist"
                )
            return FakeCursor([(1, FIRST, FIRST + 9, 1234)])
        return FakeCursor([(1, FIRST, FIRST + 9)])


def test_the_claimer_falls_back_to_claim_blocks_once_per_connection() -> None:
    claimer = PostgresClaimer("postgresql://unused")
    conn = FakeConnection(has_expiring=False)
    claimer._connection = lambda: conn  # type: ignore[method-assign]
    assert claimer.claim("c", 1) == [Block(1, FIRST, FIRST + 9, None)]
    assert claimer.claim("c", 1) == [Block(1, FIRST, FIRST + 9, None)]
    # It asked for the new function once; after 42883 only claim_blocks.
    assert conn.statements == [CLAIM_BLOCKS_EXPIRING, CLAIM_BLOCKS, CLAIM_BLOCKS]
    assert conn.timeouts == ["5000"] * 3  # each statement in a transaction with its timeout


def test_the_claimer_uses_claim_blocks_expiring_where_it_exists() -> None:
    claimer = PostgresClaimer("postgresql://unused")
    conn = FakeConnection(has_expiring=True)
    claimer._connection = lambda: conn  # type: ignore[method-assign]
    assert claimer.claim("c", 1) == [Block(1, FIRST, FIRST + 9, 1234)]
    assert conn.statements == [CLAIM_BLOCKS_EXPIRING]


def test_other_errors_of_the_new_function_are_not_taken_for_an_old_schema() -> None:
    class Refusing(FakeConnection):
        def execute(
            self, statement: str, params: dict[str, Any], *, prepare: bool | None = None
        ) -> FakeCursor:
            if statement == SET_LOCAL_STATEMENT_TIMEOUT:
                return FakeCursor([])
            self.statements.append(statement)
            raise psycopg.errors.InsufficientPrivilege("permission denied for function")

    claimer = PostgresClaimer("postgresql://unused")
    conn = Refusing(has_expiring=True)
    claimer._connection = lambda: conn  # type: ignore[method-assign]
    with pytest.raises(DatabaseError) as caught:
        claimer.claim("c", 1)
    assert isinstance(caught.value.__cause__, psycopg.errors.InsufficientPrivilege)
    assert conn.statements == [CLAIM_BLOCKS_EXPIRING]


def test_block_json_names_the_expiry_only_when_there_is_one() -> None:
    assert "expires_in_ms" not in Block(1, FIRST, FIRST + 9).to_json()
    assert Block(1, FIRST, FIRST + 9, 250).to_json()["expires_in_ms"] == 250
