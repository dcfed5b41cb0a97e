"""Many threads and processes claiming at once: every range disjoint, every claim recorded."""

from __future__ import annotations

import itertools
import multiprocessing
import random
import threading

import psycopg
import pytest

from tests.fixtures.pg import cut, layout_blocks, take_fence

pytestmark = pytest.mark.integration

THREADS = 8
PROCESSES = 3
CLAIMS_EACH = 60
BLOCK = 256


def claim_many(url: str, consumer: str, seed: int) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    got: list[tuple[int, int, int]] = []
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(CLAIMS_EACH):
            rows = conn.execute(
                "SELECT block_id, first_id, last_id FROM allocator.claim_blocks(%s, %s)",
                (consumer, rng.randint(1, 3)),
            ).fetchall()
            got.extend((int(b), int(f), int(last)) for b, f, last in rows)
    return got


def test_concurrent_claims_never_overlap(db_url: str) -> None:
    workers = THREADS + PROCESSES
    total = workers * CLAIMS_EACH * 3  # enough for every call to get all it asks for
    with psycopg.connect(db_url, autocommit=True) as admin:
        take_fence(admin, 9)
        for start in range(0, total, 1000):
            count = min(1000, total - start)
            cut(admin, 9, layout_blocks(count, first_index=start + 1, size=BLOCK))

    results: dict[str, list[tuple[int, int, int]]] = {}

    def run_thread(i: int) -> None:
        results[f"thread-{i}"] = claim_many(db_url, f"thread-{i}", i)

    threads = [threading.Thread(target=run_thread, args=(i,)) for i in range(THREADS)]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(PROCESSES) as pool:
        pending = [
            pool.apply_async(claim_many, (db_url, f"process-{i}", 100 + i))
            for i in range(PROCESSES)
        ]
        for thread in threads:
            thread.start()
        for i, result in enumerate(pending):
            results[f"process-{i}"] = result.get(timeout=120)
        for thread in threads:
            thread.join(120)

    claimed = sorted((first, last, who) for who, rows in results.items() for _, first, last in rows)
    assert len(claimed) >= workers * CLAIMS_EACH
    for (_, prev_last, _), (first, _, _) in itertools.pairwise(claimed):
        assert first > prev_last  # disjoint: no ID handed out twice
    with psycopg.connect(db_url) as conn:
        ledger = {
            (int(f), int(last), str(who))
            for f, last, who in conn.execute(
                "SELECT first_id, last_id, claimed_by FROM allocator.block_ledger"
                " WHERE claimed_by IS NOT NULL"
            ).fetchall()
        }
    assert set(claimed) == ledger  # every claim a worker saw is recorded for it, and only those
