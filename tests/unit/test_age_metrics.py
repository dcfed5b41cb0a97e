"""Operators see an ID's age: the leader's sampling job sets the age gauges and the hand-out
histogram, the aging job counts what it voids (:mod:`jobs.sampling`, :mod:`jobs.aging`,
:mod:`allocator.metrics`).

Rules: no servers; the fake store keeps blocks, claims and the heartbeat as the real functions
do (tests/contract/test_store_contract.py), on a database clock the test moves.
"""

from __future__ import annotations

import math

from allocator.config import block_age, load_config
from allocator.core.errors import DatabaseUnavailableError
from allocator.core.health import NodeHealth
from allocator.core.layout import Layout
from allocator.core.leadership import SessionGuard, Term
from allocator.core.records import BlockAgeBound, BlockAgeStatus, ClaimedBlock
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


class Clock:
    """The database server's clock, moved by the test."""

    def __init__(self, now_ms: float) -> None:
        self.now_ms = now_ms

    def __call__(self) -> float:
        return self.now_ms


def leader() -> tuple[LeaderContext, FakeStore, Clock]:
    clock = Clock(CUT_MS)
    store = FakeStore(FakeDatabase(now_ms=clock))
    store.take_fence(TOKEN, "n1", "h", 1)
    guard = SessionGuard(10.0)
    guard("CONNECTED")  # type: ignore[arg-type]
    term = Term(TOKEN, guard)
    term.activate()
    hooks = LeaderHooks(health=NodeHealth(), on_fenced=lambda exc: None, on_fatal=lambda e: None)
    return LeaderContext(term, store, CONFIG, NodeMetrics(), hooks), store, clock


def cut_at_cut_ms(store: FakeStore, count: int) -> None:
    """``count`` blocks from ``CUT_MS`` on (32 a millisecond), by tickets 1, 2, …"""
    start = store.pool_status().cut_position
    blocks = [LAYOUT.nth_block(i, 4096, start_ms=CUT_MS) for i in range(start, start + count)]
    store.cut_blocks(TOKEN, blocks)


def hand_out(store: FakeStore, clock: Clock, age_ms: int) -> None:
    """Claim the next block ``age_ms`` after its first ID's millisecond."""
    status = store.pool_status()
    (block,) = [b for b in store.database.blocks() if b.ticket == status.claim_position + 1]
    clock.now_ms = LAYOUT.decode(block.first_id).timestamp_ms + age_ms
    assert store.database.claim("app") == [(block.first_id, block.last_id)]


def sample(ctx: LeaderContext, name: str, labels: dict[str, str] | None = None) -> float | None:
    return ctx.metrics.registry.get_sample_value(name, labels or {})


def test_the_gauges_show_the_oldest_block_and_the_bound_and_nan_for_what_is_not_known() -> None:
    ctx, store, clock = leader()
    assert math.isnan(sample(ctx, "allocator_pool_oldest_block_age_seconds") or 0.0)
    store.leader_heartbeat(TOKEN, BlockAgeBound(300_000, True, 10_000))
    cut_at_cut_ms(store, 1)
    clock.now_ms = CUT_MS + 42_500
    sampling.run(ctx)
    assert sample(ctx, "allocator_pool_oldest_block_age_seconds") == 42.5
    assert sample(ctx, "allocator_pool_max_block_age_seconds") == 300.0
    assert store.database.claim("app")  # the pool runs empty
    sampling.run(ctx)
    assert math.isnan(sample(ctx, "allocator_pool_oldest_block_age_seconds") or 0.0)
    ctx.metrics.leadership_ended()  # an ex-leader exports no stale age
    assert math.isnan(sample(ctx, "allocator_pool_max_block_age_seconds") or 0.0)


def test_the_hand_out_ages_are_those_claimed_since_the_previous_run_each_counted_once() -> None:
    ctx, store, clock = leader()
    cut_at_cut_ms(store, 5)
    hand_out(store, clock, 500)
    hand_out(store, clock, 3_000)
    sampling.run(ctx)  # the term's first run only takes the position
    count = "allocator_claimed_block_age_seconds_count"
    assert sample(ctx, count) == 0
    for age_ms in (2_000, 400_000, 10):
        hand_out(store, clock, age_ms)
    sampling.run(ctx)
    assert sample(ctx, count) == 3
    assert sample(ctx, "allocator_claimed_block_age_seconds_sum") == 2.0 + 400.0 + 0.01
    assert sample(ctx, "allocator_claimed_block_age_seconds_bucket", {"le": "5.0"}) == 2
    assert sample(ctx, "allocator_claimed_block_age_seconds_bucket", {"le": "300.0"}) == 2
    assert sample(ctx, "allocator_claimed_block_age_seconds_bucket", {"le": "600.0"}) == 3
    sampling.run(ctx)  # nothing claimed since: nothing observed again
    assert sample(ctx, count) == 3


def test_at_most_the_sample_limit_is_read_per_run() -> None:
    ctx, store, clock = leader()
    sampling.run(ctx)
    limit = sampling.HANDOUT_SAMPLE_LIMIT
    cut_at_cut_ms(store, limit + 10)
    clock.now_ms = CUT_MS + 1_000
    assert len(store.database.claim("app", limit + 10)) == limit + 10
    sampling.run(ctx)
    assert sample(ctx, "allocator_claimed_block_age_seconds_count") == limit


def test_an_unreadable_age_leaves_the_pool_reading_and_the_next_run_in_place() -> None:
    ctx, store, _ = leader()
    cut_at_cut_ms(store, 2)
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
    assert read == [2]


def test_an_age_never_reads_below_zero() -> None:
    ahead = ClaimedBlock(
        ticket=1, first_id=LAYOUT.encode(CUT_MS, 0, 0, 0), claimed_at_ms=CUT_MS - 7
    )
    assert sampling.handout_ages_s([ahead], LAYOUT) == [0.0]


def test_the_aging_job_counts_what_it_voided() -> None:
    ctx, store, clock = leader()
    cut_at_cut_ms(store, 7)
    clock.now_ms = CUT_MS + 3_600_000  # an hour later: past the default bound
    store.leader_heartbeat(TOKEN, block_age.bound(CONFIG))
    assert aging.run(ctx) == 7
    assert sample(ctx, "allocator_blocks_voided_aged_total") == 7
