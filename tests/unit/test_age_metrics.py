"""Operators see an ID's age: the leader's sampling job sets the age gauges and the hand-out
histogram, the aging job counts what it voids (:mod:`jobs.sampling`, :mod:`jobs.aging`,
:mod:`allocator.metrics`).

Rules: no servers; the fake store answers ``block_age_status`` and selects the claimed blocks
by ticket as the real function does.
"""

from __future__ import annotations

import math

from allocator.config import load_config
from allocator.core.errors import DatabaseUnavailableError
from allocator.core.health import NodeHealth
from allocator.core.layout import Layout
from allocator.core.leadership import SessionGuard, Term
from allocator.core.records import BlockAgeStatus, ClaimedBlock
from allocator.fence import Token
from allocator.metrics import NodeMetrics
from allocator.node.seams import LeaderHooks
from jobs import aging, sampling
from jobs.context import LeaderContext
from tests.fakes.store import FakeDatabase, FakeStore

TOKEN = Token(0, 10)
CONFIG = load_config(None, {}, env={})
LAYOUT = Layout()
CUT_MS = LAYOUT.epoch_ms + 1_000_000_000
"""When the test's blocks were cut."""


class SamplingStore(FakeStore):
    def __init__(self, database: FakeDatabase) -> None:
        super().__init__(database)
        self.samples = 0

    def record_pool_sample(self) -> None:
        self.samples += 1


def leader() -> tuple[LeaderContext, SamplingStore]:
    database = FakeDatabase()
    database.take_fence(TOKEN, "n1", "h", 1, "default layout")
    guard = SessionGuard(10.0)
    guard("CONNECTED")  # type: ignore[arg-type]
    term = Term(TOKEN, guard)
    term.activate()
    hooks = LeaderHooks(health=NodeHealth(), on_fenced=lambda exc: None, on_fatal=lambda e: None)
    store = SamplingStore(database)
    return LeaderContext(term, store, CONFIG, NodeMetrics(), hooks), store


def handed_out(ticket: int, age_ms: int) -> ClaimedBlock:
    first_id = LAYOUT.encode(CUT_MS, 0, 0, 0) + ticket  # same millisecond, its own sequence
    return ClaimedBlock(ticket=ticket, first_id=first_id, claimed_at_ms=CUT_MS + age_ms)


def sample(ctx: LeaderContext, name: str, labels: dict[str, str] | None = None) -> float | None:
    return ctx.metrics.registry.get_sample_value(name, labels or {})


def test_the_gauges_show_the_oldest_block_and_the_bound_and_nan_for_what_is_not_known() -> None:
    ctx, store = leader()
    assert math.isnan(sample(ctx, "allocator_pool_oldest_block_age_seconds") or 0.0)
    store.block_age = BlockAgeStatus(300_000, True, None, True, 42_500)
    sampling.run(ctx)
    assert sample(ctx, "allocator_pool_oldest_block_age_seconds") == 42.5
    assert sample(ctx, "allocator_pool_max_block_age_seconds") == 300.0
    store.block_age = BlockAgeStatus(300_000, True, None, True, None)  # the pool ran empty
    sampling.run(ctx)
    assert math.isnan(sample(ctx, "allocator_pool_oldest_block_age_seconds") or 0.0)
    ctx.metrics.leadership_ended()  # an ex-leader exports no stale age
    assert math.isnan(sample(ctx, "allocator_pool_max_block_age_seconds") or 0.0)


def test_the_hand_out_ages_are_those_claimed_since_the_previous_run_each_counted_once() -> None:
    ctx, store = leader()
    store.claimed = [handed_out(1, 500), handed_out(2, 3_000)]
    store.claim_position = 2
    sampling.run(ctx)  # the term's first run only takes the position
    count = "allocator_claimed_block_age_seconds_count"
    assert sample(ctx, count) == 0
    store.claimed += [handed_out(3, 2_000), handed_out(4, 400_000), handed_out(5, 10)]
    store.claim_position = 5
    sampling.run(ctx)
    assert sample(ctx, count) == 3
    assert sample(ctx, "allocator_claimed_block_age_seconds_sum") == 2.0 + 400.0 + 0.01
    assert sample(ctx, "allocator_claimed_block_age_seconds_bucket", {"le": "5.0"}) == 2
    assert sample(ctx, "allocator_claimed_block_age_seconds_bucket", {"le": "300.0"}) == 2
    assert sample(ctx, "allocator_claimed_block_age_seconds_bucket", {"le": "600.0"}) == 3
    sampling.run(ctx)  # nothing claimed since: nothing observed again
    assert sample(ctx, count) == 3


def test_at_most_the_sample_limit_is_read_per_run() -> None:
    ctx, store = leader()
    sampling.run(ctx)
    limit = sampling.HANDOUT_SAMPLE_LIMIT
    store.claimed = [handed_out(t, 1_000) for t in range(1, limit + 11)]
    store.claim_position = limit + 10
    sampling.run(ctx)
    assert sample(ctx, "allocator_claimed_block_age_seconds_count") == limit


def test_an_unreadable_age_leaves_the_pool_reading_and_the_next_run_in_place() -> None:
    ctx, store = leader()
    read: list[int] = []
    ctx.hooks = LeaderHooks(
        health=NodeHealth(),
        on_fenced=lambda exc: None,
        on_fatal=lambda exc: None,
        pool_read=lambda status: read.append(status.available_blocks),
    )

    def unreachable() -> BlockAgeStatus:
        raise DatabaseUnavailableError("read the block age status: unreachable (test)")

    store.block_age_status = unreachable  # type: ignore[method-assign]
    sampling.run(ctx)  # no exception leaves the job
    assert read == [store.available_blocks]


def test_an_age_never_reads_below_zero() -> None:
    ahead = ClaimedBlock(
        ticket=1, first_id=LAYOUT.encode(CUT_MS, 0, 0, 0), claimed_at_ms=CUT_MS - 7
    )
    assert sampling.handout_ages_s([ahead], LAYOUT) == [0.0]


def test_the_aging_job_counts_what_it_voided() -> None:
    ctx, store = leader()
    store.database.aged_blocks = 7
    assert aging.run(ctx) == 7
    assert sample(ctx, "allocator_blocks_voided_aged_total") == 7
