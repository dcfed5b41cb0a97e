"""The store's contract: the same cases against the fake (:class:`tests.fakes.store.FakeStore`)
and the real store (:class:`allocator.postgres.store.NodeDatabase` on a migrated database, as
the node role). Whatever a fake-backed test concludes holds for the real store as far as these
cases reach.

Rules: every case takes the ``backend`` fixture and runs once per store; the ``real`` run
needs PostgreSQL and is marked ``integration`` (``-m "not integration"`` runs the fake's
alone, without servers). A case uses only the ports (:class:`~allocator.node.seams.NodeStore`,
:class:`~allocator.node.seams.LeaderStore`, plus ``high_water_id``) and a consumer's claims;
both databases run on real time, so a case asserts no duration. Where the fake deliberately
differs, the case says so.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import psycopg
import pytest
from psycopg import sql as pgsql
from pydantic import SecretStr

from allocator.config import PostgresConfig
from allocator.core import cutter
from allocator.core.clock import wall_clock_ms
from allocator.core.errors import (
    BehindHighWaterError,
    ClockAheadError,
    DatabaseBehindError,
    FencedError,
    InvalidBatchError,
    LayoutMismatchError,
    StaleTakeoverError,
    WriteAbandonedError,
)
from allocator.core.layout import Layout
from allocator.core.records import BlockAgeBound, BlockAgeStatus, FenceState, Takeover
from allocator.fence import Token, Watermark
from allocator.node.seams import LeaderStore, NodeStore
from allocator.postgres import compat
from allocator.postgres.compat import SchemaStamp
from allocator.postgres.store import NodeDatabase
from tests.fakes.store import FakeDatabase, FakeStore
from tests.fixtures.pg import claim, url_for_user

OLD, NEW = Token(0, 100), Token(0, 200)
LAYOUT = Layout()
BLOCK = 4096
BOUND = BlockAgeBound(
    max_block_age_ms=60_000, serve_aged_without_leader=True, leader_stale_ms=60_000
)
"""A bound under which the layout's first blocks (2020) are aged and blocks cut now are not."""

Ranges = list[tuple[int, int]]


class ContractStore(NodeStore, LeaderStore, Protocol):
    """What the cases call: both ports and the mark's read."""

    def high_water_id(self) -> int: ...


def _both_serve_the_ports(fake: FakeStore, real: NodeDatabase) -> list[ContractStore]:
    """mypy's proof that both stores serve the node's and the jobs' ports (never called)."""
    node: list[NodeStore] = [fake, real]
    jobs: list[LeaderStore] = [fake, real]
    del node, jobs
    return [fake, real]


class Backend(Protocol):
    """One store under contract, and the consumer's side of its database."""

    store: ContractStore

    def other_node(self, datacenter_id: int) -> ContractStore:
        """Another node's store on the same database, with another datacenter id."""
        ...

    def claim(self, n: int = 1) -> Ranges:
        """An application's claim (``claim_blocks``): the blocks, in ID order."""
        ...

    def claim_rolled_back(self) -> None:
        """A claim that drew a ticket and rolled back: its block is stranded."""
        ...


class FakeBackend:
    def __init__(self) -> None:
        self.database = FakeDatabase()
        self.store: ContractStore = FakeStore(self.database)

    def other_node(self, datacenter_id: int) -> ContractStore:
        return FakeStore(self.database, layout=LAYOUT.record(datacenter_id))

    def claim(self, n: int = 1) -> Ranges:
        return self.database.claim("app", n)

    def claim_rolled_back(self) -> None:
        self.database.draw_tickets(1)


class RealBackend:
    def __init__(self, db_url: str, node_url: str) -> None:
        self.db_url, self.node_url = db_url, node_url
        self.opened: list[NodeDatabase] = []
        self.store: ContractStore = self._open(0)

    def _open(self, datacenter_id: int) -> NodeDatabase:
        config = PostgresConfig(
            url=SecretStr(self.node_url),
            pool_min_size=1,
            pool_max_size=2,
            statement_timeout_ms=10_000,
            idle_in_transaction_timeout_ms=10_000,
            connect_timeout_s=5.0,
        )
        store = NodeDatabase(config, node_name=f"node-{datacenter_id}", datacenter_id=datacenter_id)
        store.open()
        self.opened.append(store)
        return store

    def other_node(self, datacenter_id: int) -> ContractStore:
        return self._open(datacenter_id)

    def claim(self, n: int = 1) -> Ranges:
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            return sorted((first, last) for _, first, last in claim(conn, "app", n))

    def claim_rolled_back(self) -> None:
        with psycopg.connect(self.db_url) as conn, conn.transaction(force_rollback=True):
            claim(conn, "gone")

    def close(self) -> None:
        for store in self.opened:
            store.close()


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.integration)])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "fake":
        yield FakeBackend()
        return
    db_url: str = request.getfixturevalue("db_url")  # only now: the fake needs no server
    role = f"t_node_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_url, autocommit=True) as su:
        su.execute(
            pgsql.SQL("CREATE ROLE {} LOGIN IN ROLE allocator_node").format(pgsql.Identifier(role))
        )
    real = RealBackend(db_url, url_for_user(db_url, role))
    try:
        yield real
    finally:
        real.close()
        with psycopg.connect(db_url, autocommit=True) as su:
            su.execute(pgsql.SQL("DROP OWNED BY {}").format(pgsql.Identifier(role)))
            su.execute(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(role)))


# -- helpers ---------------------------------------------------------------------------------


def epoch_blocks(count: int, first_index: int = 0) -> Ranges:
    """Blocks from the layout's epoch (2020) on: far behind both clocks, aged under BOUND."""
    return [LAYOUT.nth_block(i, BLOCK) for i in range(first_index, first_index + count)]


def planned(store: ContractStore, count: int) -> Ranges:
    """The next ``count`` blocks as the refill plans them: the product's cutter, after the
    store's mark, at the node's clock."""
    plan = cutter.plan_blocks(
        LAYOUT, 0, BLOCK, store.high_water_id(), wall_clock_ms(), count, max_clock_behind_ms=1000
    )
    assert plan.blocks, "the cutter planned nothing"
    return list(plan.blocks)


def snapshot(store: ContractStore) -> tuple[Any, ...]:
    """What a write may change, leaving out what moves with the clock alone and the claim
    position (a sequence: a write that rolls back keeps the tickets it drew)."""
    pool, age = store.pool_status(), store.block_age_status()
    return (
        store.fence(),
        (pool.available_blocks, pool.available_ids, pool.high_water_id, pool.cut_position),
        (age.max_block_age_ms, age.heartbeat_at),
        store.claimed_block_ages(0, 1_000, 1_000),
        store.leader_history(100),
    )


def disjoint_and_increasing(ranges: Ranges) -> bool:
    """I1 and I2 over blocks in cutting order."""
    return all(last < next_first for (_, last), (next_first, _) in itertools.pairwise(ranges))


# -- a fresh database ------------------------------------------------------------------------


def test_a_fresh_database_has_no_fence_no_mark_no_pool(backend: Backend) -> None:
    store = backend.store
    assert store.fence() == FenceState(epoch=0, holder=None, generation=0, high_water_id=-1)
    assert store.high_water_id() == -1
    assert store.leader_history(10) == []
    status = store.pool_status()
    assert (status.available_blocks, status.available_ids, status.high_water_id) == (0, 0, -1)
    assert (status.cut_position, status.claim_position) == (0, 0)
    assert (status.claim_rate_blocks_per_s, status.runway_s) == (None, None)
    assert (status.mark_ahead_ms, status.mark_lead_ms, status.claims_paused) == (None, None, False)
    assert store.block_age_status() == BlockAgeStatus(None, None, None, False, None)
    assert store.replication().asynchronous is False
    assert not store.read_clock(wall_clock_ms).disagrees(1000)  # fake: the offset it is given
    # The node role reads the revision (`allocator migrate` granted it) and the marker.
    assert store.schema_stamp() == SchemaStamp(compat.HEAD, "0003")


# -- the fence -------------------------------------------------------------------------------


def test_the_first_takeover_records_the_term(backend: Backend) -> None:
    store = backend.store
    assert store.take_fence(OLD, "node-a", "host-a", 4242) == Takeover(-1, 0, 0)
    assert store.fence() == FenceState(epoch=OLD.epoch, holder="node-a")
    (term,) = store.leader_history(10)
    assert (term.generation, term.epoch, term.holder, term.host, term.pid) == (
        0,
        OLD.epoch,
        "node-a",
        "host-a",
        4242,
    )
    assert (term.ended_at, term.end_reason) == (None, None)


@pytest.mark.parametrize("token", [NEW, OLD, Token(0, NEW.epoch - 1)])
def test_a_takeover_that_is_not_newer_is_stale_and_changes_nothing(
    backend: Backend, token: Token
) -> None:
    store = backend.store
    store.take_fence(NEW, "node-a", "h", 1)
    before = snapshot(store)
    with pytest.raises(StaleTakeoverError):
        store.take_fence(token, "node-b", "h", 2)
    assert snapshot(store) == before


def test_a_newer_token_wins_and_a_newer_generation_beats_any_epoch(backend: Backend) -> None:
    store = backend.store
    store.take_fence(OLD, "node-a", "h", 1)
    cut = store.cut_blocks(OLD, epoch_blocks(2))
    assert store.take_fence(NEW, "node-b", "h", 2) == Takeover(cut.high_water_id, 0, OLD.epoch)
    rebased = Token(1, 1)
    assert store.take_fence(rebased, "node-c", "h", 3) == Takeover(cut.high_water_id, 0, NEW.epoch)
    with pytest.raises(StaleTakeoverError):
        store.take_fence(Token(0, NEW.epoch + 1), "node-a", "h", 1)
    terms = [(t.generation, t.epoch, t.end_reason) for t in store.leader_history(10)]
    assert terms == [(1, 1, None), (0, NEW.epoch, "superseded"), (0, OLD.epoch, "superseded")]


def test_a_takeover_below_zookeepers_watermark_changes_nothing(backend: Backend) -> None:
    store = backend.store
    store.take_fence(OLD, "node-a", "h", 1)
    store.cut_blocks(OLD, epoch_blocks(1))
    before = snapshot(store)
    for watermark in (Watermark(NEW, -1), Watermark(OLD, store.high_water_id() + 1)):
        with pytest.raises(DatabaseBehindError):
            store.take_fence(Token(0, NEW.epoch + 1), "node-b", "h", 2, watermark)
    assert snapshot(store) == before
    mark = store.high_water_id()
    assert store.take_fence(NEW, "node-b", "h", 2, Watermark(OLD, mark)) == Takeover(
        mark, 0, OLD.epoch
    )


def test_a_takeover_with_a_bad_epoch_is_invalid(backend: Backend) -> None:
    with pytest.raises(InvalidBatchError):
        backend.store.take_fence(Token(0, 0), "node-a", "h", 1)


def test_a_node_of_another_layout_cannot_take_the_fence(backend: Backend) -> None:
    backend.store.take_fence(OLD, "node-a", "h", 1)
    before = snapshot(backend.store)
    with pytest.raises(LayoutMismatchError):
        backend.other_node(datacenter_id=1).take_fence(NEW, "node-b", "h", 2)
    assert snapshot(backend.store) == before


def test_end_term_records_the_reason_once_for_that_token_only(backend: Backend) -> None:
    store = backend.store
    store.take_fence(OLD, "node-a", "h", 1)
    assert store.end_term(Token(0, 999), "stepped_down") is False
    assert store.end_term(OLD, "stepped_down") is True
    assert store.end_term(OLD, "shutdown") is False
    store.take_fence(NEW, "node-b", "h", 2)
    assert store.end_term(NEW, "") is True  # no reason given: "ended"
    newest, oldest = store.leader_history(10)
    assert (newest.end_reason, oldest.end_reason) == ("ended", "stepped_down")
    assert newest.ended_at is not None
    assert oldest.ended_at is not None
    assert store.fence().holder == "node-b"  # ending a term leaves the fence alone


def test_the_leader_history_is_newest_first_within_the_limit(backend: Backend) -> None:
    store = backend.store
    for epoch in (1, 2, 3):
        store.take_fence(Token(0, epoch), f"node-{epoch}", "h", epoch)
    assert [t.epoch for t in store.leader_history(2)] == [3, 2]
    assert [t.end_reason for t in store.leader_history(3)] == [None, "superseded", "superseded"]


# -- fenced writes -----------------------------------------------------------------------------

Write = Callable[[ContractStore, Token, Callable[[], bool]], object]

WRITES: dict[str, Write] = {
    "cut": lambda s, token, check: s.cut_blocks(token, epoch_blocks(2, 4), commit_if=check),
    "requeue": lambda s, token, check: s.requeue_stranded(token, commit_if=check),
    "prune": lambda s, token, check: s.prune_claimed(token, 0, 10, commit_if=check),
    "heartbeat": lambda s, token, check: s.leader_heartbeat(token, BOUND, commit_if=check),
    "void": lambda s, token, check: s.void_aged_blocks(token, 0, 10, commit_if=check),
}


def set_the_scene(backend: Backend) -> ContractStore:
    """OLD holds the fence; every write has something to do: ticket 1 claimed (prune),
    ticket 2 stranded and already in the requeue window (requeue), all four blocks aged
    under the heartbeat's bound (void), room after the mark (cut)."""
    store = backend.store
    store.take_fence(OLD, "node-a", "h", 1)
    store.cut_blocks(OLD, epoch_blocks(4))
    assert backend.claim() == epoch_blocks(1)
    backend.claim_rolled_back()
    assert store.requeue_stranded(OLD) == 0  # a run considers the tickets drawn before it
    store.leader_heartbeat(OLD, BOUND)
    return store


@pytest.mark.parametrize("write", WRITES)
def test_a_write_whose_commit_check_says_no_changes_nothing(backend: Backend, write: str) -> None:
    store = set_the_scene(backend)
    asked: list[int] = []

    def doubt() -> bool:
        asked.append(1)
        return False

    before = snapshot(store)
    with pytest.raises(WriteAbandonedError):
        WRITES[write](store, OLD, doubt)
    assert asked == [1]  # asked once, right before COMMIT
    assert snapshot(store) == before
    # nextval is not transactional: the tickets an abandoned void drew past its blocks stay
    # drawn, leaving those blocks stranded below the claim position (the requeue finds them).
    assert store.pool_status().claim_position == (4 if write == "void" else 2)
    WRITES[write](store, OLD, lambda: True)
    assert snapshot(store) != before  # the same write, committed, does change something


@pytest.mark.parametrize("write", WRITES)
def test_a_write_with_a_superseded_token_is_fenced_before_its_commit_check(
    backend: Backend, write: str
) -> None:
    store = set_the_scene(backend)
    store.take_fence(NEW, "node-b", "h", 2)
    before = snapshot(store)
    asked: list[int] = []

    def trust() -> bool:
        asked.append(1)
        return True

    for token in (OLD, Token(0, NEW.epoch + 1)):  # superseded, and never held the fence
        with pytest.raises(FencedError):
            WRITES[write](store, token, trust)
    assert asked == []  # the statement failed: nothing left to commit
    assert snapshot(store) == before


# -- cutting ---------------------------------------------------------------------------------


def test_cuts_planned_by_the_cutter_advance_the_mark_across_leaders(backend: Backend) -> None:
    """I1 and I2 across batches and leaders: each batch starts after the mark, which moves to
    its last ID; tickets continue."""
    store = backend.store
    store.take_fence(OLD, "node-a", "h", 1)
    cut: Ranges = []
    for token, batch in ((OLD, 8), (OLD, 8), (NEW, 4)):
        if token != store.fence().token:
            store.take_fence(token, "node-b", "h", 2)
        ranges = planned(store, batch)
        before = store.high_water_id()
        result = store.cut_blocks(token, ranges)
        assert ranges[0][0] > before
        assert (result.high_water_id, result.last_ticket) == (ranges[-1][1], len(cut) + batch)
        assert store.high_water_id() == result.high_water_id
        cut += ranges
    assert disjoint_and_increasing(cut)
    status = store.pool_status()
    assert (status.available_blocks, status.available_ids) == (20, 20 * BLOCK)
    assert status.cut_position == 20
    assert status.mark_lead_ms is not None
    assert status.mark_ahead_ms is not None


def test_a_cut_at_or_behind_the_mark_is_refused(backend: Backend) -> None:
    store = backend.store
    store.take_fence(OLD, "node-a", "h", 1)
    store.cut_blocks(OLD, epoch_blocks(2))
    before = snapshot(store)
    for ranges in (epoch_blocks(1, 1), epoch_blocks(1, 0)):
        with pytest.raises(BehindHighWaterError):
            store.cut_blocks(OLD, ranges)
    assert snapshot(store) == before


@pytest.mark.parametrize(
    "ranges",
    [[], [(20, 10)], [(10, 20), (15, 30)], [(40, 50), (10, 20)], [(-1, 5)], [(0, 1 << 63)]],
)
def test_a_malformed_batch_is_invalid(backend: Backend, ranges: Ranges) -> None:
    backend.store.take_fence(OLD, "node-a", "h", 1)
    with pytest.raises(InvalidBatchError):
        backend.store.cut_blocks(OLD, ranges)
    assert backend.store.high_water_id() == -1


def test_a_block_of_another_datacenter_is_refused(backend: Backend) -> None:
    backend.store.take_fence(OLD, "node-a", "h", 1)
    with pytest.raises(LayoutMismatchError):
        backend.store.cut_blocks(OLD, [LAYOUT.nth_block(0, BLOCK, datacenter=1)])
    assert backend.store.high_water_id() == -1


def test_a_block_past_the_database_clock_is_refused(backend: Backend) -> None:
    backend.store.take_fence(OLD, "node-a", "h", 1)
    an_hour_ahead = wall_clock_ms() + 3_600_000
    with pytest.raises(ClockAheadError):
        backend.store.cut_blocks(OLD, [LAYOUT.nth_block(0, BLOCK, start_ms=an_hour_ahead)])
    assert backend.store.high_water_id() == -1


# -- the pool --------------------------------------------------------------------------------


def test_the_pool_counts_unclaimed_blocks_and_tickets(backend: Backend) -> None:
    store = backend.store
    store.take_fence(OLD, "node-a", "h", 1)
    batch = epoch_blocks(3)
    store.cut_blocks(OLD, batch)
    assert backend.claim() == batch[:1]
    status = store.pool_status()
    assert (status.available_blocks, status.available_ids) == (2, 2 * BLOCK)
    assert (status.cut_position, status.claim_position) == (3, 1)
    assert (status.high_water_id, status.epoch, status.holder) == (
        batch[-1][1],
        OLD.epoch,
        "node-a",
    )
    store.record_pool_sample()  # a sample changes no count
    assert store.pool_status().available_blocks == 2
    (handed,) = store.claimed_block_ages(0, 1, 10)
    assert (handed.ticket, handed.first_id) == (1, batch[0][0])


def test_a_stranded_block_is_requeued_by_the_second_run_and_claimed_again(
    backend: Backend,
) -> None:
    store = backend.store
    store.take_fence(OLD, "node-a", "h", 1)
    batch = epoch_blocks(3)
    store.cut_blocks(OLD, batch)
    assert backend.claim() == batch[:1]
    backend.claim_rolled_back()  # strands ticket 2
    assert store.requeue_stranded(OLD) == 0  # a run only considers tickets drawn before the last
    assert store.requeue_stranded(OLD) == 1
    status = store.pool_status()
    assert (status.available_blocks, status.cut_position, status.claim_position) == (2, 4, 2)
    assert backend.claim() == batch[2:3]  # ticket 3
    assert backend.claim() == batch[1:2]  # ticket 4: the requeued block


def test_prune_takes_only_old_claimed_blocks_oldest_first_within_the_limit(
    backend: Backend,
) -> None:
    store = backend.store
    store.take_fence(OLD, "node-a", "h", 1)
    batch = epoch_blocks(3)
    store.cut_blocks(OLD, batch)
    assert backend.claim(2) == batch[:2]
    assert store.prune_claimed(OLD, 3600, 10) == 0  # claimed just now
    assert store.prune_claimed(OLD, 0, 1) == 1
    assert [b.ticket for b in store.claimed_block_ages(0, 10, 10)] == [2]
    assert store.prune_claimed(OLD, 0, 10) == 1
    assert store.pool_status().available_blocks == 1  # never an unclaimed block
    assert store.high_water_id() == batch[-1][1]  # pruning never lowers the mark
    with pytest.raises(ValueError, match="retention_s"):
        store.prune_claimed(OLD, -1, 10)
    with pytest.raises(InvalidBatchError):
        store.prune_claimed(OLD, 0, 0)


# -- the bound on an ID's age (migration 0011) ---------------------------------------------------


def test_the_heartbeat_puts_the_bound_in_force(backend: Backend) -> None:
    store = backend.store
    store.take_fence(OLD, "node-a", "h", 1)
    beat = store.leader_heartbeat(OLD, BOUND)
    assert store.block_age_status() == BlockAgeStatus(60_000, True, beat, True, None)
    with pytest.raises(InvalidBatchError):
        store.leader_heartbeat(OLD, BlockAgeBound(0, True, 1000))
    assert store.block_age_status().heartbeat_at == beat


def test_voids_take_aged_blocks_oldest_first_and_claims_skip_them(backend: Backend) -> None:
    store = backend.store
    store.take_fence(OLD, "node-a", "h", 1)
    store.cut_blocks(OLD, epoch_blocks(4))
    (fresh,) = planned(store, 1)
    store.cut_blocks(OLD, [fresh])  # tickets 1..4 aged, 5 fresh
    assert store.void_aged_blocks(OLD, 0, 10) == 0  # no heartbeat: no bound
    store.leader_heartbeat(OLD, BOUND)
    oldest = store.block_age_status().oldest_unclaimed_age_ms
    assert oldest is not None
    assert oldest > BOUND.max_block_age_ms
    assert store.void_aged_blocks(OLD, 0, 3) == 3
    assert store.claimed_block_ages(0, 10, 10) == []  # a void is no hand-out
    assert store.pool_status().claim_position == 3  # the tickets are drawn past the voids
    assert backend.claim() == [fresh]  # ticket 4 is aged: the claim voids it itself
    assert store.void_aged_blocks(OLD, 0, 10) == 0
    status = store.pool_status()
    assert (status.available_blocks, status.claim_position) == (0, 5)
    assert [b.ticket for b in store.claimed_block_ages(0, 10, 10)] == [5]
    with pytest.raises(InvalidBatchError):
        store.void_aged_blocks(OLD, BOUND.max_block_age_ms, 10)
