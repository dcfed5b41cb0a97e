"""The refill job (:mod:`jobs.refill`) on the fake store: it fills the pool to the target with
blocks the database accepts, stops when fenced, and writes nothing a doubt rolled back.

Rules: no servers. The job runs through :class:`jobs.context.LeaderContext` exactly as the
node runs it, on :class:`tests.fakes.store.FakeStore`, which tests/contract/test_store_contract.py
holds to the real store; the clocks are real (the target is a few milliseconds' worth of
blocks, so a run never meets its time budget).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from allocator.config import load_config, runway
from allocator.core.errors import FencedError
from allocator.core.health import NodeHealth
from allocator.core.leadership import SessionGuard, Term
from allocator.core.records import CommitCheck, CutResult
from allocator.fence import Token
from allocator.metrics import NodeMetrics
from allocator.node.seams import LeaderHooks, LeaderStore
from jobs import refill
from jobs.context import LeaderContext
from tests.fakes.store import FakeDatabase, FakeStore

TOKEN = Token(0, 10)
CONFIG = load_config(None, {"pool.min_blocks": 96, "pool.low_watermark_blocks": 32}, env={})
TARGET = runway.target_blocks(CONFIG, None)


class Leader:
    """A term led by ``n1`` with the refill's context; what the hooks were told."""

    def __init__(self, database: FakeDatabase, store: FakeStore | None = None) -> None:
        self.store = store or FakeStore(database)
        self.store.take_fence(TOKEN, "n1", "h", 1)
        guard = SessionGuard(10.0)
        guard("CONNECTED")
        self.term = Term(TOKEN, guard)
        self.term.activate()
        self.fenced: list[FencedError] = []
        self.marks: list[int] = []
        hooks = LeaderHooks(
            health=NodeHealth(),
            on_fenced=self.fenced.append,
            on_fatal=lambda exc: None,
            cut_recorded=self.marks.append,
        )
        port: LeaderStore = self.store  # mypy: the fake serves the jobs' port
        self.ctx = LeaderContext(self.term, port, CONFIG, NodeMetrics(), hooks)

    def metric(self, name: str) -> float | None:
        return self.ctx.metrics.registry.get_sample_value(name)


def test_the_refill_fills_the_pool_to_its_target_after_the_mark() -> None:
    database = FakeDatabase()
    leader = Leader(database)
    assert TARGET == 96
    assert refill.run(leader.ctx) == TARGET
    status = leader.store.pool_status()
    assert (status.available_blocks, status.cut_position) == (TARGET, TARGET)
    blocks = database.blocks()
    assert all(a.last_id < b.first_id for a, b in itertools.pairwise(blocks))  # I1, I2
    assert status.high_water_id == blocks[-1].last_id == leader.marks[-1]
    assert {(b.generation, b.epoch) for b in blocks} == {TOKEN}
    assert database.heartbeats  # the run's first write
    assert refill.run(leader.ctx) == 0  # at its target: nothing more
    assert len(database.blocks()) == TARGET
    assert leader.fenced == []


def test_the_refill_cuts_back_up_to_the_target_after_claims() -> None:
    database = FakeDatabase()
    leader = Leader(database)
    refill.run(leader.ctx)
    mark = leader.store.high_water_id()
    assert len(database.claim("app", 40)) == 40
    assert refill.run(leader.ctx) == 40
    assert leader.store.pool_status().available_blocks == TARGET
    assert min(b.first_id for b in database.blocks()[TARGET:]) > mark  # strictly after the mark


def test_a_fenced_refill_writes_nothing_and_reports_the_fence() -> None:
    database = FakeDatabase()
    leader = Leader(database)
    FakeStore(database).take_fence(Token(0, 11), "n2", "h", 2)
    assert refill.run(leader.ctx) == 0
    assert len(leader.fenced) == 1
    assert database.blocks() == []
    assert database.heartbeats == []
    assert leader.metric("allocator_fenced_writes_rejected_total") == 1
    assert not leader.ctx.refilling.is_set()


class SuspendedDuringCut(FakeStore):
    """ZooKeeper says SUSPENDED while a cut's statement runs: the term pauses before the
    commit check the job passed (``commit_if=term.may_write``) is asked."""

    def __init__(self, database: FakeDatabase) -> None:
        super().__init__(database)
        self.term: Term | None = None

    def cut_blocks(
        self,
        token: Token,
        ranges: Sequence[tuple[int, int]],
        commit_if: CommitCheck | None = None,
    ) -> CutResult:
        assert self.term is not None
        self.term.pause()
        return super().cut_blocks(token, ranges, commit_if)


def test_a_cut_whose_leadership_came_into_doubt_writes_nothing() -> None:
    database = FakeDatabase()
    store = SuspendedDuringCut(database)
    leader = Leader(database, store)
    store.term = leader.term
    assert refill.run(leader.ctx) == 0
    assert database.blocks() == []
    assert store.high_water_id() == -1
    assert leader.marks == []  # ZooKeeper's watermark is not raised for what never committed
    assert leader.metric("allocator_writes_abandoned_total") == 1
    assert leader.fenced == []
    assert len(database.heartbeats) == 1  # committed before the doubt
