"""The leader's side of the bound on an ID's age, on the fake store: the refill's heartbeat and
the aging job's voids (:mod:`jobs.refill`, :mod:`jobs.aging`).

Rules: no servers. The fake store keeps blocks and checks the fence as the real functions do
(tests/contract/test_store_contract.py holds it to them); aged blocks are blocks cut at the
layout's epoch, far behind the database clock.
"""

from __future__ import annotations

import pytest

from allocator.config import block_age, load_config
from allocator.core.errors import FencedError
from allocator.core.health import NodeHealth
from allocator.core.layout import Layout
from allocator.core.leadership import SessionGuard, Term
from allocator.fence import Token
from allocator.metrics import NodeMetrics
from allocator.node.seams import LeaderHooks
from jobs import aging, refill
from jobs.context import LeaderContext
from tests.fakes.store import FakeDatabase, FakeStore

TOKEN = Token(0, 10)
LAYOUT = Layout()
CONFIG = load_config(
    None,
    {
        "pool.max_block_age_s": 4,
        "pool.refill_interval_s": 0.25,
        "pool.handover_margin_s": 1,
        "zookeeper.session_timeout_ms": 2000,
    },
    env={},
)


def leader(
    database: FakeDatabase,
) -> tuple[LeaderContext, FakeStore, list[FencedError], list[int]]:
    store = FakeStore(database)
    store.take_fence(TOKEN, "n1", "h", 1)
    guard = SessionGuard(10.0)
    guard("CONNECTED")  # type: ignore[arg-type]
    term = Term(TOKEN, guard)
    term.activate()
    fenced: list[FencedError] = []
    hooks = LeaderHooks(health=NodeHealth(), on_fenced=fenced.append, on_fatal=lambda exc: None)
    ctx = LeaderContext(term, store, CONFIG, NodeMetrics(), hooks)
    wakes: list[int] = []
    ctx.wake_refill = lambda: wakes.append(1)
    return ctx, store, fenced, wakes


def stock_aged(store: FakeStore, count: int) -> None:
    """``count`` blocks from the layout's epoch on (aged under any bound), and the heartbeat
    that puts the bound in force (without one nothing is aged)."""
    store.cut_blocks(TOKEN, [LAYOUT.nth_block(i, 4096) for i in range(count)])
    store.leader_heartbeat(TOKEN, block_age.bound(CONFIG))


def test_every_refill_run_writes_the_fenced_heartbeat_with_the_configured_bound() -> None:
    database = FakeDatabase()
    ctx, _, fenced, _ = leader(database)
    refill.run(ctx)
    refill.run(ctx)
    expected = block_age.bound(CONFIG)
    assert database.heartbeats == [(TOKEN, expected), (TOKEN, expected)]
    assert (expected.max_block_age_ms, expected.serve_aged_without_leader) == (4000, True)
    assert expected.leader_stale_ms == 1750  # 3 x 0.25 s + 1 s
    assert fenced == []


def test_a_refill_whose_leadership_came_into_doubt_writes_no_heartbeat() -> None:
    database = FakeDatabase()
    ctx, _, _, _ = leader(database)
    ctx.term.pause()
    refill.run(ctx)
    assert database.heartbeats == []


def test_the_aging_job_voids_in_batches_ahead_of_the_bound_and_wakes_the_refill(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(aging, "BATCH_BLOCKS", 10)
    database = FakeDatabase()
    ctx, store, fenced, wakes = leader(database)
    stock_aged(store, 2 * 10 + 7)
    assert aging.run(ctx) == 2 * 10 + 7
    assert database.voids == [(TOKEN, 500)] * 3  # 2 refill intervals > 10 % of 4 s
    assert store.pool_status().available_blocks == 0
    assert wakes == [1]
    assert aging.run(ctx) == 0
    assert wakes == [1]  # nothing voided: the refill keeps its pace
    assert fenced == []


def test_a_run_stops_after_its_batch_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aging, "BATCH_BLOCKS", 10)
    database = FakeDatabase()
    ctx, store, _, _ = leader(database)
    stock_aged(store, (aging.MAX_BATCHES_PER_RUN + 1) * 10)
    assert aging.run(ctx) == aging.MAX_BATCHES_PER_RUN * 10
    assert store.pool_status().available_blocks == 10  # the next run goes on


def test_a_leader_that_lost_the_fence_voids_nothing_and_ends_its_term() -> None:
    database = FakeDatabase()
    ctx, store, fenced, wakes = leader(database)
    stock_aged(store, 3)
    FakeStore(database).take_fence(Token(0, 11), "n2", "h", 2)
    assert aging.run(ctx) == 0
    refill.run(ctx)
    assert store.pool_status().available_blocks == 3
    assert database.heartbeats == [(TOKEN, block_age.bound(CONFIG))]  # stock_aged's only
    assert len(fenced) == 2
    assert wakes == []
