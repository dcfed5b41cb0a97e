"""Claims left open while others claim and the leader requeues (migration 0004's held tickets).

Consumers claim in autocommit and inside transactions they keep open for a while, then
commit or roll back; a leader thread runs ``requeue_stranded`` all along. Afterwards: no
block was handed to two committed claims, every committed claim is recorded, the pool count
matches the table, nothing is left held, and every block not committed can still be claimed
(nothing stranded). A "pool empty" answer (AL003) is retried as the contract tells clients
to. Behaviour only: no timing is asserted.
"""

from __future__ import annotations

import math
import random
import threading
import time

import psycopg
import pytest

from tests.fixtures.pg import claim, cut, take_fence

pytestmark = pytest.mark.integration

EPOCH = 31
BLOCKS = 900
WORKERS = 6
ROUNDS = 40
BLOCK = 64


POOL_EMPTY_RETRIES = 400
"""AL003 is an answer the contract allows (docs/sql.md: retry with backoff): near the end of
the run the tickets have passed the cut blocks, and a block whose claim rolled back is
claimable again only once ``requeue_stranded`` has moved it into its window."""


def claim_retrying(
    conn: psycopg.Connection, name: str, n: int, pool_empty: list[int]
) -> list[tuple[int, int, int]]:
    """``claim`` as a well-behaved client does it: AL003 is retried after a short pause
    (bounded; the leader thread requeues every 5 ms). Any other error propagates."""
    for _ in range(POOL_EMPTY_RETRIES):
        try:
            return claim(conn, name, n)
        except psycopg.Error as exc:
            if exc.sqlstate != "AL003":
                raise
            if not conn.autocommit:
                conn.rollback()  # only called with no claim open in this transaction
            pool_empty.append(1)
            time.sleep(0.005)
    raise AssertionError(f"{name}: the pool stayed empty through {POOL_EMPTY_RETRIES} retries")


def consume(
    url: str, name: str, seed: int, committed: list[tuple[int, str]], pool_empty: list[int]
) -> None:
    rng = random.Random(seed)
    with (
        psycopg.connect(url, autocommit=True) as fast,
        psycopg.connect(url) as slow,
    ):
        open_blocks: list[int] = []
        for _ in range(ROUNDS):
            won = claim_retrying(fast, name, rng.randint(1, 2), pool_empty)
            committed.extend((b, name) for b, _, _ in won)
            if not open_blocks:
                won = claim_retrying(slow, f"{name}-slow", rng.randint(1, 3), pool_empty)
                open_blocks = [b for b, _, _ in won]
            elif rng.random() < 0.25:
                if rng.random() < 0.5:
                    slow.commit()
                    committed.extend((b, f"{name}-slow") for b in open_blocks)
                else:
                    slow.rollback()
                open_blocks = []
        slow.rollback()


def test_open_claims_never_hand_a_block_out_twice_nor_strand_one(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as admin:
        take_fence(admin, EPOCH)
        cut(admin, EPOCH, [(i * BLOCK, (i + 1) * BLOCK - 1) for i in range(1, BLOCKS + 1)])

    committed: list[tuple[int, str]] = []
    errors: list[BaseException] = []
    pool_empty: list[int] = []
    done = threading.Event()

    def leader() -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            while not done.wait(0.005):
                conn.execute("SELECT allocator.requeue_stranded(0, %s)", (EPOCH,))

    def worker(i: int) -> None:
        try:
            consume(db_url, f"c{i}", i, committed, pool_empty)
        except BaseException as exc:  # reported below, with the thread's name
            errors.append(exc)

    stalled = psycopg.connect(db_url)  # open through the whole run, rolled back at the end
    try:
        ((stalled_block, _, _),) = claim(stalled, "stalled")
        lead = threading.Thread(target=leader)
        lead.start()
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(WORKERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        done.set()
        lead.join()
        assert not errors, errors
        print(f"{len(committed)} committed claims, {len(pool_empty)} pool-empty answers retried")
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("SELECT allocator.requeue_stranded(0, %s)", (EPOCH,))
            held = conn.execute("SELECT block_id FROM allocator.held_tickets").fetchall()
            assert (stalled_block,) in held
        stalled.rollback()
    finally:
        stalled.close()  # also when an assertion above fails: no connection leaks

    ids = [block_id for block_id, _ in committed]
    assert len(ids) == len(set(ids)), "a block was handed to two committed claims"
    with psycopg.connect(db_url, autocommit=True) as conn:
        recorded = dict(
            conn.execute(
                "SELECT block_id, claimed_by FROM allocator.blocks WHERE claimed_at IS NOT NULL"
            ).fetchall()
        )
        assert recorded == dict(committed)
        for _ in range(2):  # every claim has ended: two runs requeue whatever rolled back
            conn.execute("SELECT allocator.requeue_stranded(0, %s)", (EPOCH,))
        assert conn.execute("SELECT count(*) FROM allocator.held_tickets").fetchone() == (0,)
        (unclaimed,) = conn.execute(  # type: ignore[misc]
            "SELECT count(*) FROM allocator.blocks WHERE claimed_at IS NULL"
        ).fetchone()
        assert unclaimed == BLOCKS - len(ids)
        (available,) = conn.execute(  # type: ignore[misc]
            "SELECT available_blocks FROM allocator.pool_status"
        ).fetchone()
        assert available == unclaimed
        drained: list[int] = []
        for _ in range(math.ceil(unclaimed / 100)):  # the rest: nothing stranded anywhere
            drained += [b for b, _, _ in claim(conn, "drain", 100)]
        assert len(drained) == unclaimed
        with pytest.raises(psycopg.Error, match="pool empty"):
            claim(conn, "drain")
        assert not set(drained) & set(ids)
