"""allocator.postgres against a real PostgreSQL: the node's named operations, the fence protocol
seen through them, error translation, session settings, and retention (migration 0002).

Rules: the node's side runs as a throwaway login role in ``allocator_node`` (proving the
role suffices); the superuser only sets the scene (claims, held locks) and counts rows.
Concurrency is asserted by events (who waits on whom in ``pg_locks``, what a takeover read),
never by timing.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql
from pydantic import SecretStr

from allocator.config import PostgresConfig
from allocator.core.errors import (
    BehindHighWaterError,
    DatabaseError,
    DatabaseUnavailableError,
    FencedError,
    FenceError,
    InvalidBatchError,
    StaleTakeoverError,
)
from allocator.core.layout import Layout
from allocator.core.records import BlockAgeBound, CutResult, FenceState, Takeover
from allocator.fence import Token
from allocator.postgres import sql
from allocator.postgres.operator import read_status
from allocator.postgres.store import NodeDatabase
from jobs import sampling
from tests.fixtures.pg import LAYOUT_JSON, claim, url_for_user

pytestmark = pytest.mark.integration

OLD, NEW = Token(0, 100), Token(0, 200)
BASE = 1 << 22
WAIT_S = 10.0
NEW_TAKEOVER = {"generation": 0, "epoch": NEW.epoch, "holder": "node-b", "host": "h", "pid": 2}
NEW_TAKEOVER["layout"] = LAYOUT_JSON

Conn = psycopg.Connection[tuple[Any, ...]]


def blocks(first: int, count: int, size: int = 4096) -> list[tuple[int, int]]:
    return [(first + i * size, first + (i + 1) * size - 1) for i in range(count)]


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Poll an observable condition with a deadline (never a fixed sleep)."""
    done = threading.Event()
    deadline = threading.Timer(timeout_s, done.set)
    deadline.start()
    try:
        while not condition():
            if done.wait(0.01):
                raise AssertionError(f"timed out after {timeout_s} s waiting until {what}")
    finally:
        deadline.cancel()


def config(url: str, **overrides: Any) -> PostgresConfig:
    values: dict[str, Any] = {
        "url": SecretStr(url),
        "pool_min_size": 1,
        "pool_max_size": 2,
        "statement_timeout_ms": 10_000,
        "idle_in_transaction_timeout_ms": 10_000,
        "connect_timeout_s": 5.0,
    }
    values.update(overrides)
    return PostgresConfig(**values)


@pytest.fixture
def admin(db_url: str) -> Iterator[Conn]:
    with psycopg.connect(db_url, autocommit=True) as connection:
        connection.execute("SET statement_timeout = '30s'")
        yield connection


@pytest.fixture
def node_url(db_url: str) -> Iterator[str]:
    """A URL of a fresh login role that is only a member of ``allocator_node``."""
    name = f"t_node_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_url, autocommit=True) as su:
        su.execute(
            pgsql.SQL("CREATE ROLE {} LOGIN IN ROLE allocator_node").format(pgsql.Identifier(name))
        )
    yield url_for_user(db_url, name)
    with psycopg.connect(db_url, autocommit=True) as su:
        su.execute(pgsql.SQL("DROP OWNED BY {}").format(pgsql.Identifier(name)))
        su.execute(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(name)))


@pytest.fixture
def make_db(node_url: str) -> Iterator[Callable[..., NodeDatabase]]:
    """Opened NodeDatabases as the node role; closed after the test."""
    opened: list[NodeDatabase] = []

    def make(name: str = "node-a", **kwargs: Any) -> NodeDatabase:
        config_overrides = {
            k: kwargs.pop(k) for k in list(kwargs) if k in PostgresConfig.model_fields
        }
        database = NodeDatabase(config(node_url, **config_overrides), node_name=name, **kwargs)
        opened.append(database)
        database.open()
        return database

    yield make
    for database in opened:
        database.close()


@pytest.fixture
def db(make_db: Callable[..., NodeDatabase]) -> NodeDatabase:
    return make_db()


def count_blocks(admin: Conn) -> int:
    (n,) = admin.execute("SELECT count(*) FROM allocator.blocks").fetchone()  # type: ignore[misc]
    return int(n)


def high_water(admin: Conn) -> int:
    (mark,) = admin.execute("SELECT last_id FROM allocator.high_water").fetchone()  # type: ignore[misc]
    return int(mark)


def blocked_by(admin: Conn, waiter_pid: int) -> list[int]:
    (pids,) = admin.execute("SELECT pg_blocking_pids(%s)", (waiter_pid,)).fetchone()  # type: ignore[misc]
    return list(pids)


# -- the happy path -----------------------------------------------------------------------


def test_round_trip_takeover_cut_requeue_prune_as_the_node_role(
    db: NodeDatabase, admin: Conn, db_url: str, node_url: str
) -> None:
    assert db.take_fence(OLD, "node-a", "host-a", 4242) == Takeover(
        high_water_id=-1, previous_generation=0, previous_epoch=0
    )
    assert db.fence() == FenceState(epoch=OLD.epoch, holder="node-a")
    batch = blocks(BASE, 3)
    assert db.cut_blocks(OLD, batch) == CutResult(
        high_water_id=batch[-1][1], last_ticket=3, lead_ms=0
    )
    assert db.high_water_id() == batch[-1][1]

    assert claim(admin, "app") == [(1, *batch[0])]
    with psycopg.connect(db_url) as rolled_back, rolled_back.transaction(force_rollback=True):
        claim(rolled_back, "gone")  # strands the block of ticket 2
    assert db.requeue_stranded(OLD) == 0  # a run only considers tickets drawn before the last
    assert db.requeue_stranded(OLD) == 1

    db.record_pool_sample()
    status = db.pool_status()
    assert (status.available_blocks, status.available_ids) == (2, 2 * 4096)
    assert (status.high_water_id, status.epoch, status.holder) == (
        batch[-1][1],
        OLD.epoch,
        "node-a",
    )
    assert status.cut_position == 4  # the requeued block got ticket 4

    assert db.prune_claimed(OLD, 0, 10) == 1
    remaining = admin.execute(
        "SELECT first_id, claimed_at IS NULL FROM allocator.block_ledger ORDER BY first_id"
    ).fetchall()
    assert remaining == [(batch[1][0], True), (batch[2][0], True)]

    db.ping()
    assert db.end_term(OLD, "stepped_down") is True
    assert db.end_term(OLD, "stepped_down") is False
    (term,) = db.leader_history(5)
    assert (term.epoch, term.holder, term.host, term.pid) == (OLD.epoch, "node-a", "host-a", 4242)
    assert term.ended_at is not None
    assert term.end_reason == "stepped_down"

    status_now, terms = read_status(node_url)
    assert status_now.available_blocks == 2
    assert terms == [term]


def test_takeover_reports_the_mark_and_the_epoch_it_replaced(db: NodeDatabase) -> None:
    db.take_fence(OLD, "node-a", "h", 1)
    cut = db.cut_blocks(OLD, blocks(BASE, 2))
    assert db.take_fence(NEW, "node-b", "h", 2) == Takeover(
        high_water_id=cut.high_water_id, previous_generation=0, previous_epoch=OLD.epoch
    )
    history = db.leader_history(10)
    assert [(t.epoch, t.end_reason) for t in history] == [
        (NEW.epoch, None),
        (OLD.epoch, "superseded"),
    ]
    assert [t.epoch for t in db.leader_history(1)] == [NEW.epoch]


# -- the fence, through the translated errors ---------------------------------------------


def test_write_with_a_stale_epoch_is_fenced_and_writes_nothing(
    db: NodeDatabase, admin: Conn
) -> None:
    db.take_fence(OLD, "node-a", "h", 1)
    db.cut_blocks(OLD, blocks(BASE, 2))
    claim(admin, "app")
    db.take_fence(NEW, "node-b", "h", 2)
    before = (count_blocks(admin), high_water(admin))

    with pytest.raises(FencedError, match="does not hold the fence") as caught:
        db.cut_blocks(OLD, blocks(BASE + 2 * 4096, 3))
    assert isinstance(caught.value, FenceError)
    assert isinstance(caught.value.__cause__, psycopg.Error)
    assert caught.value.__cause__.sqlstate == "AL100"
    with pytest.raises(FencedError):
        db.requeue_stranded(OLD)
    with pytest.raises(FencedError):
        db.prune_claimed(OLD, 0, 100)
    with pytest.raises(FencedError):  # an epoch that never held the fence
        db.cut_blocks(Token(0, NEW.epoch + 1), blocks(BASE + 2 * 4096, 1))

    assert (count_blocks(admin), high_water(admin)) == before


@pytest.mark.parametrize("token", [OLD, Token(0, OLD.epoch - 1)])
def test_takeover_that_is_not_newer_is_stale(db: NodeDatabase, token: Token) -> None:
    db.take_fence(OLD, "node-a", "h", 1)
    with pytest.raises(StaleTakeoverError, match="stale takeover") as caught:
        db.take_fence(token, "node-b", "h", 2)
    assert isinstance(caught.value, FenceError)
    assert db.fence() == FenceState(epoch=OLD.epoch, holder="node-a")
    assert len(db.leader_history(10)) == 1


def test_cut_at_or_behind_the_mark_is_refused_across_leaders(db: NodeDatabase, admin: Conn) -> None:
    db.take_fence(OLD, "node-a", "h", 1)
    db.cut_blocks(OLD, blocks(BASE, 2))
    with pytest.raises(BehindHighWaterError, match="high-water mark"):
        db.cut_blocks(OLD, blocks(BASE + 4096, 1))
    db.take_fence(NEW, "node-b", "h", 2)
    with pytest.raises(BehindHighWaterError):  # a new leader whose clock is behind
        db.cut_blocks(NEW, blocks(4096, 1))
    assert count_blocks(admin) == 2
    assert db.cut_blocks(NEW, blocks(BASE + 2 * 4096, 1)).high_water_id == BASE + 3 * 4096 - 1


@pytest.mark.parametrize(
    "ranges",
    [[], [(20, 10)], [(10, 20), (15, 30)], [(40, 50), (10, 20)], [(-1, 5)], [(0, 1 << 63)]],
)
def test_malformed_batches_are_invalid(db: NodeDatabase, ranges: list[tuple[int, int]]) -> None:
    db.take_fence(OLD, "node-a", "h", 1)
    with pytest.raises(InvalidBatchError):
        db.cut_blocks(OLD, ranges)


def test_takeover_with_a_bad_epoch_is_invalid(db: NodeDatabase) -> None:
    with pytest.raises(InvalidBatchError):
        db.take_fence(Token(0, 0), "node-a", "h", 1)


# -- concurrency: the fence-row lock ----------------------------------------------------


def test_takeover_waits_for_an_open_cut_then_the_old_leaders_next_write_is_fenced(
    db: NodeDatabase, admin: Conn, db_url: str
) -> None:
    db.take_fence(OLD, "node-a", "h", 1)
    events: list[str] = []
    takeovers: list[Takeover | BaseException] = []
    first = blocks(BASE, 2)

    with (
        psycopg.connect(db_url) as old_leader,  # not autocommit: the cut's transaction stays open
        psycopg.connect(db_url, autocommit=True) as new_leader,
    ):
        new_leader.execute("SET statement_timeout = '30s'")
        old_leader.execute(
            sql.CUT_BLOCKS,
            {
                "generation": 0,
                "epoch": OLD.epoch,
                "first_ids": [f for f, _ in first],
                "last_ids": [x for _, x in first],
                "layout": LAYOUT_JSON,
                "max_ahead_ms": 1000,
            },
        )
        events.append("cut_executed")

        def take_over() -> None:
            try:
                with new_leader.cursor() as cursor:
                    row = cursor.execute(sql.TAKE_FENCE, NEW_TAKEOVER).fetchone()
                assert row is not None
                takeovers.append(Takeover(*row))
            except BaseException as exc:  # reported to the main thread below
                takeovers.append(exc)
            events.append("takeover_returned")

        thread = threading.Thread(target=take_over, name="takeover")
        thread.start()
        try:
            old_pid, new_pid = old_leader.info.backend_pid, new_leader.info.backend_pid
            wait_until(
                lambda: old_pid in blocked_by(admin, new_pid),
                "the takeover waits for the old leader's transaction",
            )
            assert events == ["cut_executed"]  # the takeover has not returned
            events.append("cut_committing")
            old_leader.commit()
        finally:
            thread.join(WAIT_S)
        assert not thread.is_alive()

    assert events == ["cut_executed", "cut_committing", "takeover_returned"]
    # The takeover read the mark after the cut committed: it saw the cut.
    assert takeovers == [
        Takeover(high_water_id=first[-1][1], previous_generation=0, previous_epoch=OLD.epoch)
    ]

    # The old leader's next write is rejected, and writes nothing.
    with pytest.raises(FencedError):
        db.cut_blocks(OLD, blocks(BASE + 2 * 4096, 1))
    assert count_blocks(admin) == 2
    assert db.cut_blocks(NEW, blocks(BASE + 2 * 4096, 1)).high_water_id == BASE + 3 * 4096 - 1


def test_write_queued_behind_a_takeover_is_fenced_once_the_takeover_commits(
    make_db: Callable[..., NodeDatabase], admin: Conn, db_url: str
) -> None:
    patient = make_db("patient", lock_timeout_ms=30_000)
    patient.take_fence(OLD, "patient", "h", 1)
    outcome: list[BaseException | CutResult] = []

    with psycopg.connect(db_url) as new_leader:  # the takeover's transaction stays open
        new_leader.execute(sql.TAKE_FENCE, NEW_TAKEOVER)

        def write() -> None:
            try:
                outcome.append(patient.cut_blocks(OLD, blocks(BASE, 1)))
            except BaseException as exc:  # reported to the main thread below
                outcome.append(exc)

        thread = threading.Thread(target=write, name="old-leader-write")
        thread.start()
        try:
            wait_until(
                lambda: bool(
                    admin.execute(
                        "SELECT 1 FROM pg_stat_activity WHERE application_name = %s"
                        " AND wait_event_type = 'Lock'",
                        (patient.application_name,),
                    ).fetchone()
                ),
                "the old leader's write waits for the takeover",
            )
            assert outcome == []
            new_leader.commit()
        finally:
            thread.join(WAIT_S)
        assert not thread.is_alive()

    assert len(outcome) == 1
    assert isinstance(outcome[0], FencedError)
    assert count_blocks(admin) == 0


def test_lock_timeout_fails_a_write_stuck_behind_the_fence_row(
    make_db: Callable[..., NodeDatabase], admin: Conn, db_url: str
) -> None:
    db = make_db(lock_timeout_ms=200)
    db.take_fence(OLD, "node-a", "h", 1)
    with psycopg.connect(db_url) as takeover:  # a takeover in progress holds the row
        takeover.execute(sql.TAKE_FENCE, NEW_TAKEOVER)
        with pytest.raises(DatabaseUnavailableError, match="lock_timeout") as caught:
            db.cut_blocks(OLD, blocks(BASE, 1))
        assert isinstance(caught.value.__cause__, psycopg.errors.LockNotAvailable)
        takeover.rollback()
    # The takeover rolled back: the same leader's retry goes through.
    assert db.cut_blocks(OLD, blocks(BASE, 1)).high_water_id == BASE + 4095
    assert count_blocks(admin) == 1


# -- session settings ---------------------------------------------------------------------


def test_pool_connections_carry_the_timeouts_and_name(
    make_db: Callable[..., NodeDatabase], admin: Conn
) -> None:
    db = make_db(
        "n1",
        statement_timeout_ms=4321,
        idle_in_transaction_timeout_ms=3210,
        lock_timeout_ms=345,
        pool_min_size=2,
        pool_max_size=2,
    )
    settings = db.session_settings()
    assert settings.statement_timeout == "4321ms"
    assert settings.idle_in_transaction_session_timeout == "3210ms"
    assert settings.lock_timeout == "345ms"
    assert settings.application_name == "allocator-node:n1"
    (count,) = admin.execute(  # type: ignore[misc]
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'allocator-node:n1'"
    ).fetchone()
    assert count == 2  # every pool connection was configured


def test_take_fence_raises_lock_timeout_for_its_own_transaction_only(
    make_db: Callable[..., NodeDatabase],
) -> None:
    db = make_db(lock_timeout_ms=345, pool_min_size=1, pool_max_size=1)  # one connection
    db.take_fence(OLD, "node-a", "h", 1)
    assert db.session_settings().lock_timeout == "345ms"


# -- retention (migration 0002) -----------------------------------------------------------


def test_prune_deletes_only_old_claimed_blocks_oldest_first_within_the_limit(
    db: NodeDatabase, admin: Conn
) -> None:
    db.take_fence(OLD, "node-a", "h", 1)
    cut = blocks(BASE, 6)
    db.cut_blocks(OLD, cut)
    claimed = [claim(admin, f"app-{i}")[0] for i in range(4)]  # one claim per statement
    # The cutoff comes from the database clock: a retention of 0 s means "claimed before now".
    assert db.prune_claimed(OLD, 3600.0, 100) == 0  # none that old
    assert db.prune_claimed(OLD, 0.0, 3) == 3
    ledger = admin.execute(
        "SELECT block_id, claimed_by FROM allocator.block_ledger ORDER BY block_id"
    ).fetchall()
    assert ledger == [(claimed[3][0], "app-3"), (5, None), (6, None)]  # the newest claim stays

    assert db.prune_claimed(OLD, 0.0, 3) == 1
    assert db.prune_claimed(OLD, 0.0, 3) == 0
    assert admin.execute(
        "SELECT kind, generation, epoch, blocks FROM allocator.fenced_writes ORDER BY write_id"
    ).fetchall() == [("prune", 0, OLD.epoch, 3), ("prune", 0, OLD.epoch, 1)]
    assert db.pool_status().available_blocks == 2  # unclaimed blocks are never pruned
    assert count_blocks(admin) == 2

    # Pruning never lowers the mark: the pruned ranges can never be cut again.
    assert high_water(admin) == cut[-1][1]
    with pytest.raises(BehindHighWaterError):
        db.cut_blocks(OLD, [cut[0]])


def test_prune_rejects_bad_arguments(db: NodeDatabase) -> None:
    db.take_fence(OLD, "node-a", "h", 1)
    with pytest.raises(InvalidBatchError):
        db.prune_claimed(OLD, 0.0, 0)
    with pytest.raises(ValueError, match="retention_s"):
        db.prune_claimed(OLD, -1.0, 10)


def test_prune_claimed_is_executable_by_the_node_role_only(admin: Conn) -> None:
    signature = "allocator.prune_claimed(bigint, bigint, bigint, integer)"
    allowed = {
        role: admin.execute(
            "SELECT has_function_privilege(%s, %s, 'EXECUTE')", (role, signature)
        ).fetchone()[0]  # type: ignore[index]
        for role in ("allocator_node", "allocator_consumer", "allocator_operator")
    }
    assert allowed == {
        "allocator_node": True,
        "allocator_consumer": False,
        "allocator_operator": False,
    }
    (public,) = admin.execute(  # type: ignore[misc]
        "SELECT count(*) FROM pg_proc p, aclexplode(p.proacl) a"
        " WHERE p.oid = %s::regprocedure AND a.grantee = 0",
        (signature,),
    ).fetchone()
    assert public == 0


# -- unavailable, closed, missing ---------------------------------------------------------


def test_unreachable_database_is_unavailable(unused_tcp_port: int) -> None:
    url = f"postgresql://nobody@127.0.0.1:{unused_tcp_port}/nothing"
    database = NodeDatabase(config(url, connect_timeout_s=2.0), node_name="lonely")
    with pytest.raises(DatabaseUnavailableError):
        database.open(timeout=0.5)
    assert not database.is_open
    with pytest.raises(DatabaseError, match="not open"):
        database.ping()
    with pytest.raises(DatabaseUnavailableError, match="unreachable"):
        read_status(url, connect_timeout_s=2.0)


def test_closed_database_refuses_operations_and_can_reopen(db: NodeDatabase) -> None:
    db.close()
    with pytest.raises(DatabaseError, match="not open") as caught:
        db.ping()
    assert not isinstance(caught.value, DatabaseUnavailableError)  # not retryable
    db.open()
    db.ping()


def test_read_status_on_an_unmigrated_database_says_to_migrate(empty_db_url: str) -> None:
    with pytest.raises(DatabaseError, match="allocator migrate"):
        read_status(empty_db_url)


def test_a_write_whose_leadership_came_into_doubt_is_rolled_back(db_url: str) -> None:
    """I6: commit_if is asked right before COMMIT; False leaves nothing written."""
    from pydantic import SecretStr

    from allocator.config import PostgresConfig
    from allocator.core.errors import WriteAbandonedError
    from allocator.postgres.store import NodeDatabase

    with NodeDatabase(PostgresConfig(url=SecretStr(db_url)), node_name="doubt") as db:
        db.take_fence(Token(0, 42), "doubt", "h", 1)
        with pytest.raises(WriteAbandonedError):
            db.cut_blocks(Token(0, 42), [(1000, 1099)], commit_if=lambda: False)
        assert db.high_water_id() == -1
        result = db.cut_blocks(Token(0, 42), [(1000, 1099)], commit_if=lambda: True)
        assert result.high_water_id == 1099


# -- the age at hand-out (migration 0011) ----------------------------------------------------


def test_claimed_block_ages_are_the_hand_outs_between_two_claim_positions(
    db: NodeDatabase, admin: Conn
) -> None:
    """What the leader's sampling job reads, as the node role: the blocks claimed with
    tickets in the range, newest first, at most the limit, voided ones left out; their ages
    decoded with the layout are claimed_at minus the first ID's time."""
    db.take_fence(OLD, "node-a", "h", 1)
    layout = Layout()
    (now_ms,) = admin.execute("SELECT allocator.db_now_ms()").fetchone()  # type: ignore[misc]
    aged = [layout.encode(now_ms - 60_000, 0, lane, 0) for lane in range(3)]
    fresh = [layout.encode(now_ms - 100, 0, lane, 0) for lane in range(2)]
    db.cut_blocks(OLD, [(first, first + 4095) for first in aged + fresh])  # tickets 1..5
    before = db.pool_status().claim_position
    assert claim(admin, "app")[0][1] == aged[0]  # no bound yet: ticket 1, a minute old
    db.leader_heartbeat(OLD, BlockAgeBound(4000, True, 60_000))
    assert db.void_aged_blocks(OLD, 0, 1) == 1  # ticket 2
    assert claim(admin, "app")[0][1] == fresh[0]  # voids ticket 3 itself, hands out ticket 4
    after = db.pool_status().claim_position
    assert (before, after) == (0, 4)

    handed = db.claimed_block_ages(before, after, 1000)
    assert [(b.ticket, b.first_id) for b in handed] == [(4, fresh[0]), (1, aged[0])]
    young, old = sampling.handout_ages_s(handed, layout)
    assert 60.0 <= old < 600.0
    assert 0.1 <= young < 60.0
    assert [b.ticket for b in db.claimed_block_ages(before, after, 1)] == [4]
    assert [b.ticket for b in db.claimed_block_ages(1, after, 1000)] == [4]
    assert db.claimed_block_ages(after, after, 1000) == []
    status = db.block_age_status()
    assert (status.max_block_age_ms, status.leader_serves) == (4000, True)
    assert status.oldest_unclaimed_age_ms is not None
    assert status.oldest_unclaimed_age_ms < 60_000  # the fresh block left
