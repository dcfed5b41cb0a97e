"""The low-water check (:mod:`jobs.low_water`): it wakes the refill when the pool is below
its watermark, never a refill in flight, and reads a large pool only once per refill interval.

Rules: no servers; a fake store answers a pool level, a fake clock decides what is due.
"""

from __future__ import annotations

import logging

from apscheduler.schedulers.background import BackgroundScheduler

from allocator.config import load_config
from allocator.core.errors import DatabaseUnavailableError
from allocator.core.health import NodeHealth
from allocator.core.leadership import SessionGuard, Term
from allocator.core.records import PoolStatus
from allocator.fence import Token
from allocator.metrics import NodeMetrics
from allocator.node.seams import LeaderHooks
from jobs.context import LeaderContext
from jobs.leader import QuietSkips
from jobs.low_water import LowWaterCheck

FLOOR, WATERMARK = 600, 400


class Pool:
    def __init__(self, available: int) -> None:
        self.available = available
        self.reads = 0
        self.down = False

    def pool_status(self) -> PoolStatus:
        if self.down:
            raise DatabaseUnavailableError("down")
        self.reads += 1
        return PoolStatus(self.available, self.available * 4096, None, None, -1, 0, 0, 1, "n")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


SEEN: list[int] = []
"""What the last :func:`setup`'s check handed to the node (``hooks.pool_read``)."""


def setup(available: int) -> tuple[LowWaterCheck, LeaderContext, Pool, Clock, list[int]]:
    config = load_config(
        None,
        {
            "pool.min_blocks": FLOOR,
            "pool.low_watermark_blocks": WATERMARK,
            "pool.refill_interval_s": 1.0,
        },
        env={},
    )
    guard = SessionGuard(10.0)
    guard("CONNECTED")  # type: ignore[arg-type]
    term = Term(Token(0, 1), guard)
    term.activate()
    SEEN.clear()
    hooks = LeaderHooks(
        health=NodeHealth(),
        on_fenced=lambda exc: None,
        on_fatal=lambda exc: None,
        pool_read=lambda status: SEEN.append(status.available_blocks),
    )
    pool = Pool(available)
    ctx = LeaderContext(term, pool, config, NodeMetrics(), hooks)  # type: ignore[arg-type]
    wakes: list[int] = []
    ctx.wake_refill = lambda: wakes.append(pool.available)
    clock = Clock()
    return LowWaterCheck(ctx, clock), ctx, pool, clock, wakes


def test_a_pool_below_the_watermark_wakes_the_refill_on_every_check_until_it_is_back() -> None:
    check, _ctx, pool, _clock, wakes = setup(FLOOR)
    check.run()
    assert wakes == []
    pool.available = WATERMARK - 1
    check.run()
    check.run()
    assert wakes == [WATERMARK - 1, WATERMARK - 1]
    pool.available = WATERMARK
    check.run()
    assert len(wakes) == 2


def test_a_refill_in_flight_is_not_woken_again() -> None:
    check, ctx, pool, _clock, wakes = setup(0)
    ctx.refilling.set()
    check.run()
    assert (wakes, pool.reads) == ([], 1)
    ctx.refilling.clear()
    check.run()
    assert wakes == [0]


def test_every_reading_goes_to_the_node() -> None:
    check, _ctx, pool, _clock, _wakes = setup(FLOOR)
    check.run()
    pool.available = 5
    check.run()
    assert SEEN == [FLOOR, 5]


def test_a_pool_of_four_floors_or_more_is_read_once_per_refill_interval() -> None:
    check, _ctx, pool, clock, _wakes = setup(4 * FLOOR)
    check.run()
    clock.now += 0.5
    check.run()
    assert pool.reads == 1
    clock.now += 0.5
    check.run()
    assert pool.reads == 2
    pool.available = 4 * FLOOR - 1
    clock.now += 1.0
    check.run()
    check.run()
    assert pool.reads == 4  # below four floors: read on every check


def test_nothing_is_read_or_woken_without_the_right_to_write() -> None:
    check, ctx, pool, _clock, wakes = setup(0)
    ctx.term.pause()
    check.run()
    assert (pool.reads, wakes) == (0, [])


def test_a_failed_reading_wakes_nothing() -> None:
    check, _ctx, pool, _clock, wakes = setup(0)
    pool.down = True
    check.run()
    assert wakes == []


def test_only_the_checks_skipped_runs_go_unlogged() -> None:
    check, *_ = setup(FLOOR)
    scheduler = BackgroundScheduler()
    skipped = 'Execution of job "%s" skipped: maximum number of running instances reached (%d)'
    quiet = QuietSkips()
    for func, logged in ((check.run, False), (print, True)):
        job = scheduler.add_job(func, "interval", seconds=1)
        record = logging.LogRecord("apscheduler.scheduler", 30, "", 0, skipped, (job, 1), None)
        assert quiet.filter(record) is logged
