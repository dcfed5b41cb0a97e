"""The two threads that run beside the claims: the leader and the monitoring reader."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psycopg
from psycopg.rows import dict_row

from allocator.bench.slow_consumer.plan import Plan
from allocator.bench.slow_consumer.queries import POOL_LEVEL, POOL_STATUS, REQUEUE
from allocator.bench.slow_consumer.stats import Sample
from allocator.bench.stock import BENCH_LAYOUT, BLOCK_SIZE_IDS, CUT_BLOCKS, EPOCH, LAYOUT_JSON

STOCK_BATCH_BLOCKS = 50_000


class Ticker(threading.Thread):
    """Runs :meth:`tick` every ``interval_s`` on a connection of its own until stopped; a
    tick that overruns starts the next one at once (never a burst to catch up). An error
    ends the thread and is kept in :attr:`error` for the main thread to raise."""

    def __init__(self, name: str, url: str, interval_s: float) -> None:
        super().__init__(name=name, daemon=True)
        self._url = url
        self._interval_s = interval_s
        self._stopped = threading.Event()
        self.samples: list[Sample] = []
        self.error: BaseException | None = None

    def stop(self) -> None:
        """Stop and wait for the thread (if it ever started); again is harmless."""
        self._stopped.set()
        if self.ident is not None:
            self.join()

    def run(self) -> None:
        try:
            with psycopg.connect(self._url, autocommit=True) as conn:
                due = time.monotonic()
                while not self._stopped.is_set():
                    self.tick(conn)
                    due += self._interval_s
                    now = time.monotonic()
                    due = max(due, now)
                    self._stopped.wait(due - now)
        except BaseException as exc:  # handed to the main thread, which raises it
            self.error = exc

    def tick(self, conn: psycopg.Connection[Any]) -> None:
        """One tick's work (subclasses)."""
        raise NotImplementedError

    def timed(self, conn: psycopg.Connection[Any], query: str, *args: Any) -> list[Any]:
        """Run ``query``, record how long it took (the round trip a caller sees)."""
        started = time.time()
        t0 = time.perf_counter_ns()
        with conn.cursor(row_factory=dict_row) as cursor:
            rows = cursor.execute(query, *args).fetchall()
        took = time.perf_counter_ns() - t0
        self.samples.append(Sample(started, took // 1000, os.getloadavg()[0]))
        return rows


class Leader(Ticker):
    """What the refill job does in the database, on the bench's tick: ``requeue_stranded``
    (timed), then the pool level and a cut back up to ``pool_blocks`` (not timed)."""

    def __init__(self, url: str, plan: Plan, next_block: int) -> None:
        super().__init__("bench-leader", url, plan.tick_s())
        self._pool_blocks = plan.pool_blocks
        self._next_block = next_block
        self.blocks_cut = 0
        self.moved = 0
        self.commits: list[Sample] = []
        """The requeue's COMMIT, timed apart: a WAL flush, the disk's cost, not the
        function's (it shares the disk with every claim's commit)."""

    def tick(self, conn: psycopg.Connection[Any]) -> None:
        with conn.transaction():
            (row,) = self.timed(conn, REQUEUE, (EPOCH,))
            started, t0 = time.time(), time.perf_counter_ns()
        took = time.perf_counter_ns() - t0
        self.commits.append(Sample(started, took // 1000, os.getloadavg()[0]))
        self.moved += int(next(iter(row.values())))
        level = conn.execute(POOL_LEVEL).fetchone()
        if (need := self._pool_blocks - (int(level[0]) if level else 0)) > 0:
            self._next_block = cut_blocks(conn, self._next_block, need)
            self.blocks_cut += need


class Reader(Ticker):
    """A monitoring consumer: ``SELECT * FROM allocator.pool_status`` (timed) on a tick."""

    def __init__(self, url: str, plan: Plan) -> None:
        super().__init__("bench-pool-status", url, plan.status_every_ms / 1000)

    def tick(self, conn: psycopg.Connection[Any]) -> None:
        self.timed(conn, POOL_STATUS)


def cut_blocks(conn: psycopg.Connection[Any], start: int, count: int) -> int:
    """Cut blocks ``start … start + count - 1`` (cutting order) as the leader; the next index."""
    for offset in range(0, count, STOCK_BATCH_BLOCKS):
        ranges = [
            BENCH_LAYOUT.nth_block(start + offset + k, BLOCK_SIZE_IDS)
            for k in range(min(STOCK_BATCH_BLOCKS, count - offset))
        ]
        conn.execute(
            CUT_BLOCKS,
            (
                EPOCH,
                [first for first, _ in ranges],
                [last for _, last in ranges],
                LAYOUT_JSON,
            ),
        )
    return start + count
