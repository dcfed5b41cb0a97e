"""The bound on an ID's age in SQL (migration 0011): ``leader_heartbeat``, ``void_aged_blocks``,
``claim_blocks`` and ``claim_blocks_expiring`` skipping aged blocks, ``block_age_status``.

Rules: a fresh migrated database per test; blocks are cut with first IDs at chosen
milliseconds (a minute old: aged under a bound of 4 s; a moment old: fresh), so "aged" never
depends on how long a test takes. A stale heartbeat is one written with ``leader_stale_ms``
of 1 and read after a short sleep. Results are judged on the ledger and the ticket position.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from allocator.core.layout import Layout
from tests.fixtures.pg import claim, cut, take_fence, url_for_user

pytestmark = pytest.mark.integration

EPOCH = 40
BOUND_MS = 4000
STALE_MS = 60_000
MAX_EXTRA = 32
"""Extra tickets ``claim_blocks`` draws for aged blocks per call (the migration's constant)."""
VOIDED = "allocator:voided-aged"
FENCED, INVALID, EMPTY, PRIVILEGE = "AL100", "AL103", "AL003", "42501"
LAYOUT = Layout()

Conn = psycopg.Connection[Any]
LoginAs = Callable[[str], Conn]


@pytest.fixture
def admin(db_url: str) -> Iterator[Conn]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        take_fence(conn, EPOCH)
        yield conn


@pytest.fixture
def login_as(db_url: str, admin: Conn) -> Iterator[LoginAs]:
    made: list[tuple[str, Conn]] = []

    def make(group: str) -> Conn:
        name = f"t_age_{group.removeprefix('allocator_')}_{uuid.uuid4().hex[:8]}"
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
                sql.Identifier(name), sql.Identifier(group)
            )
        )
        conn = psycopg.connect(url_for_user(db_url, name), autocommit=True)
        made.append((name, conn))
        return conn

    yield make
    for name, conn in made:
        conn.close()
        admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def db_now_ms(conn: Conn) -> int:
    row = conn.execute("SELECT allocator.db_now_ms()").fetchone()
    assert row is not None
    return int(row[0])


def cut_at(conn: Conn, ms: int, count: int) -> list[tuple[int, int]]:
    """``count`` blocks of one lane each (4096 IDs) in millisecond ``ms``... onwards."""
    ranges = []
    for i in range(count):
        lane = i % 32
        first = LAYOUT.encode(ms + i // 32, 0, lane, 0)
        ranges.append((first, first + 4095))
    cut(conn, EPOCH, ranges)
    return ranges


def stock(conn: Conn, aged: int, fresh: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """``aged`` blocks a minute old, then ``fresh`` blocks of now."""
    now = db_now_ms(conn)
    old = cut_at(conn, now - 60_000, aged) if aged else []
    return old, cut_at(conn, now - 100, fresh) if fresh else []


def heartbeat(
    conn: Conn,
    *,
    serve_aged: bool = True,
    stale_ms: int = STALE_MS,
    epoch: int = EPOCH,
    bound_ms: int = BOUND_MS,
) -> None:
    conn.execute(
        "SELECT allocator.leader_heartbeat(0, %s, %s, %s, %s)",
        (epoch, bound_ms, serve_aged, stale_ms),
    )


def go_stale(conn: Conn, *, serve_aged: bool) -> None:
    """A heartbeat that is stale a moment later: no leader serves."""
    heartbeat(conn, serve_aged=serve_aged, stale_ms=1)
    time.sleep(0.05)


def void(conn: Conn, ahead_ms: int = 0, limit: int = 1000, epoch: int = EPOCH) -> int:
    row = conn.execute(
        "SELECT allocator.void_aged_blocks(0, %s, %s, %s)", (epoch, ahead_ms, limit)
    ).fetchone()
    assert row is not None
    return int(row[0])


def voided_count(conn: Conn) -> int:
    row = conn.execute(
        "SELECT count(*) FROM allocator.blocks WHERE claimed_by = %s", (VOIDED,)
    ).fetchone()
    assert row is not None
    return int(row[0])


def claim_position(conn: Conn) -> int:
    row = conn.execute("SELECT claim_position FROM allocator.pool_status").fetchone()
    assert row is not None
    return int(row[0])


def sqlstate(conn: Conn, statement: str, params: tuple[object, ...] = ()) -> str | None:
    try:
        conn.execute(statement, params)
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


def firsts(rows: list[tuple[int, int, int]]) -> set[int]:
    return {first for _block, first, _last in rows}


# -- no heartbeat: nothing changes ------------------------------------------------------------


def test_without_a_heartbeat_an_older_leaders_pool_is_served_as_before(admin: Conn) -> None:
    aged, _fresh = stock(admin, aged=3, fresh=1)
    assert firsts(claim(admin, "app", 2)) == {aged[0][0], aged[1][0]}
    assert firsts(claim(admin, "app")) == {aged[2][0]}
    assert voided_count(admin) == 0
    row = admin.execute(
        "SELECT max_block_age_ms, serve_aged_without_leader, heartbeat_at, leader_serves,"
        " oldest_unclaimed_age_ms FROM allocator.block_age_status"
    ).fetchone()
    assert row is not None
    assert row[:4] == (None, None, None, False)
    assert 0 <= int(row[4]) < 60_000  # the fresh block
    expiring = admin.execute("SELECT * FROM allocator.claim_blocks_expiring('app')").fetchall()
    assert len(expiring) == 1
    assert expiring[0][3] is None  # no bound in force


# -- a leader serves: aged blocks are voided and skipped -----------------------------------------


def test_a_claim_skips_and_voids_the_aged_blocks_it_draws(admin: Conn) -> None:
    aged, fresh = stock(admin, aged=3, fresh=4)
    heartbeat(admin)
    assert firsts(claim(admin, "app")) == {fresh[0][0]}
    assert voided_count(admin) == 3
    assert firsts(claim(admin, "app", 2)) == {fresh[1][0], fresh[2][0]}
    ledger = dict(
        admin.execute("SELECT first_id, claimed_by FROM allocator.block_ledger").fetchall()
    )
    assert {ledger[first] for first, _ in aged} == {VOIDED}  # recorded, never deleted


def test_a_batch_claim_skips_aged_blocks_among_its_tickets(admin: Conn) -> None:
    _aged, fresh = stock(admin, aged=2, fresh=5)
    heartbeat(admin)
    got = claim(admin, "app", 4)
    assert firsts(got) == {first for first, _ in fresh[:4]}
    assert voided_count(admin) == 2
    assert voided_position(admin) == 2  # its two voided draws are counted as voids


def test_a_claim_draws_at_most_a_fixed_number_of_extra_tickets(admin: Conn) -> None:
    _aged, fresh = stock(admin, aged=100, fresh=1)
    heartbeat(admin)
    before = claim_position(admin)
    with pytest.raises(psycopg.Error) as empty:
        claim(admin, "app")
    assert empty.value.sqlstate == EMPTY  # 33 aged blocks drawn; the fresh one is further on
    assert claim_position(admin) - before == 1 + MAX_EXTRA
    with pytest.raises(psycopg.Error) as empty:
        claim(admin, "app", 10)
    assert empty.value.sqlstate == EMPTY
    assert claim_position(admin) - before == 1 + MAX_EXTRA + 10 + MAX_EXTRA
    # the voids rolled back with AL003, their draws still count as voids: no claim was served
    assert voided_position(admin) == claim_position(admin) - before
    # AL003 rolled the claims' voids back (their tickets stay drawn): the leader's job
    # voids every aged block, wherever its ticket, and the fresh block is next in line.
    assert voided_count(admin) == 0
    assert void(admin) == 100
    assert firsts(claim(admin, "app")) == {fresh[0][0]}


def test_the_leaders_void_moves_the_tickets_past_the_voided_blocks(admin: Conn) -> None:
    aged, fresh = stock(admin, aged=100, fresh=2)
    heartbeat(admin)
    before = claim_position(admin)
    assert void(admin, limit=60) == 60  # in bulk, at most the limit...
    voided = {
        int(first)
        for (first,) in admin.execute(
            "SELECT first_id FROM allocator.blocks WHERE claimed_by = %s", (VOIDED,)
        ).fetchall()
    }
    assert voided == {first for first, _ in aged[:60]}  # ...oldest first
    assert claim_position(admin) == before + 60
    assert void(admin) == 40
    assert claim_position(admin) == before + 100
    assert void(admin) == 0
    assert claim(admin, "app") == [(101, fresh[0][0], fresh[0][1])]
    assert claim_position(admin) == before + 101  # no ticket wasted on a voided block


def voided_position(conn: Conn) -> int:
    row = conn.execute("SELECT allocator.voided_position()").fetchone()
    assert row is not None
    return int(row[0])


def test_the_claim_rate_counts_hand_outs_not_voids(admin: Conn) -> None:
    """Voids draw tickets but are not demand: a rate that counted them would size the pool
    by them, cut blocks that age out and are voided again, and never shrink."""
    stock(admin, aged=60, fresh=40)
    heartbeat(admin)
    admin.execute("SELECT allocator.record_pool_sample()")
    sampled = admin.execute(
        "SELECT claim_position, voided_position FROM allocator.pool_samples"
        " ORDER BY sampled_at DESC LIMIT 1"
    ).fetchone()
    assert sampled is not None
    # the sample 2 s in the past, so the rate reads it (it reads samples 1-60 s old)
    admin.execute(
        "UPDATE allocator.pool_samples SET sampled_at = sampled_at - interval '2 seconds'"
    )
    assert void(admin, limit=40) == 40  # the leader's void draws 40 tickets
    assert len(claim(admin, "app")) == 1  # a claim draws the other 20 aged ones
    assert len(claim(admin, "app", 10)) == 10
    position, voids = claim_position(admin), voided_position(admin)
    assert position - int(sampled[0]) == 60 + 11
    assert voids - int(sampled[1]) == 60
    row = admin.execute("SELECT claim_rate_blocks_per_s FROM allocator.pool_status").fetchone()
    assert row is not None
    assert 0 < float(row[0]) <= 11 / 2  # 11 hand-outs in a little over 2 s; no void counted


def test_consumer_names_of_the_system_are_refused(admin: Conn) -> None:
    stock(admin, aged=0, fresh=2)
    for name in ("allocator:voided-aged", "allocator:voided-by-reset", "allocator:app"):
        assert sqlstate(admin, "SELECT * FROM allocator.claim_blocks(%s)", (name,)) == "AL001"
    assert len(claim(admin, "allocator-app")) == 1  # only the prefix with its colon


def test_the_void_runs_ahead_of_the_bound(admin: Conn) -> None:
    now = db_now_ms(admin)
    near = cut_at(admin, now - 3000, 2)  # 3 s old: inside a 4 s bound
    heartbeat(admin)
    assert void(admin, ahead_ms=0) == 0
    assert void(admin, ahead_ms=2000) == 2  # older than 4 s - 2 s
    assert voided_count(admin) == len(near)
    assert sqlstate(
        admin, "SELECT allocator.void_aged_blocks(0, %s, %s, 10)", (EPOCH, BOUND_MS)
    ) == (INVALID)  # ahead must stay below the bound


def test_a_void_never_takes_a_block_a_claim_holds(db_url: str, admin: Conn) -> None:
    aged, _fresh = stock(admin, aged=2, fresh=0)
    with psycopg.connect(db_url) as holder:  # a claim in an open transaction, no bound yet
        assert firsts(claim(holder, "slow-app")) == {aged[0][0]}
        heartbeat(admin)
        assert void(admin) == 1  # the held one is skipped, not waited for
        holder.commit()
    ledger = dict(admin.execute("SELECT first_id, claimed_by FROM allocator.blocks").fetchall())
    assert ledger == {aged[0][0]: "slow-app", aged[1][0]: VOIDED}


def test_claim_blocks_expiring_tells_when_each_block_passes_the_bound(admin: Conn) -> None:
    now = db_now_ms(admin)
    cut_at(admin, now - 60_000, 1)
    blocks = cut_at(admin, now - 1000, 2)
    heartbeat(admin)
    with admin.transaction():
        rows = admin.execute("SELECT * FROM allocator.claim_blocks_expiring('app', 2)").fetchall()
        setting = admin.execute("SHOW synchronous_commit").fetchone()
    assert setting == ("on",)  # claim_blocks' durability survives the wrapper
    assert [(first, last) for _b, first, last, _e in rows] == blocks
    after = db_now_ms(admin)
    for _block, first, _last, expires_in_ms in rows:
        born = LAYOUT.decode(first).timestamp_ms
        assert born + BOUND_MS - after <= expires_in_ms <= born + BOUND_MS - now
        assert 0 < expires_in_ms < BOUND_MS
    assert voided_count(admin) == 1


def test_claim_blocks_expiring_answers_claim_blocks_errors(admin: Conn) -> None:
    heartbeat(admin)
    for statement, code in (
        ("SELECT * FROM allocator.claim_blocks_expiring('', 1)", "AL001"),
        ("SELECT * FROM allocator.claim_blocks_expiring('app', 0)", "AL002"),
        ("SELECT * FROM allocator.claim_blocks_expiring('app', 1)", EMPTY),
    ):
        assert sqlstate(admin, statement) == code, statement


# -- no leader serves: the setting decides --------------------------------------------------------


def test_a_stale_heartbeat_serves_aged_blocks_when_the_setting_says_so(admin: Conn) -> None:
    aged, _fresh = stock(admin, aged=2, fresh=1)
    go_stale(admin, serve_aged=True)
    assert firsts(claim(admin, "app")) == {aged[0][0]}
    row = admin.execute("SELECT leader_serves FROM allocator.block_age_status").fetchone()
    assert row == (False,)
    expiring = admin.execute("SELECT * FROM allocator.claim_blocks_expiring('app')").fetchall()
    assert [(r[1], r[3]) for r in expiring] == [(aged[1][0], None)]
    assert voided_count(admin) == 0


def test_a_stale_heartbeat_keeps_the_bound_when_the_setting_refuses(admin: Conn) -> None:
    _aged, fresh = stock(admin, aged=2, fresh=1)
    go_stale(admin, serve_aged=False)
    assert firsts(claim(admin, "app")) == {fresh[0][0]}
    assert voided_count(admin) == 2
    with pytest.raises(psycopg.Error) as empty:
        claim(admin, "app")
    assert empty.value.sqlstate == EMPTY


def test_the_slow_path_skips_aged_stranded_blocks(db_url: str, admin: Conn) -> None:
    aged, fresh = stock(admin, aged=1, fresh=1)
    with psycopg.connect(db_url) as rolled_back:  # both tickets drawn, the claim undone
        assert len(claim(rolled_back, "gone", 2)) == 2
        rolled_back.rollback()
    admin.execute("SELECT allocator.requeue_stranded(0, %s)", (EPOCH,))  # both now stranded
    heartbeat(admin)
    assert firsts(claim(admin, "app")) == {fresh[0][0]}  # the slow path, past the aged one
    with pytest.raises(psycopg.Error) as empty:
        claim(admin, "app")
    assert empty.value.sqlstate == EMPTY
    row = admin.execute(
        "SELECT claimed_by FROM allocator.blocks WHERE first_id = %s", (aged[0][0],)
    ).fetchone()
    assert row == (None,)  # skipped, left for the leader's job


# -- the fence, the arguments, the record ---------------------------------------------------------


def test_a_stale_token_can_neither_beat_nor_void(admin: Conn) -> None:
    stock(admin, aged=2, fresh=0)
    heartbeat(admin)
    take_fence(admin, EPOCH + 1, holder="successor")
    assert sqlstate(
        admin, "SELECT allocator.leader_heartbeat(0, %s, 4000, true, 1000)", (EPOCH,)
    ) == (FENCED)
    assert sqlstate(admin, "SELECT allocator.void_aged_blocks(0, %s, 0, 10)", (EPOCH,)) == FENCED
    assert voided_count(admin) == 0
    row = admin.execute("SELECT generation, epoch FROM allocator.block_age").fetchone()
    assert row == (0, EPOCH)


def test_bad_arguments_are_refused(admin: Conn) -> None:
    for statement in (
        "SELECT allocator.leader_heartbeat(0, 40, 0, true, 1000)",
        "SELECT allocator.leader_heartbeat(0, 40, 4000, NULL, 1000)",
        "SELECT allocator.leader_heartbeat(0, 40, 4000, true, 0)",
        "SELECT allocator.void_aged_blocks(0, 40, -1, 10)",
        "SELECT allocator.void_aged_blocks(0, 40, 0, 0)",
    ):
        assert sqlstate(admin, statement) == INVALID, statement


def test_heartbeats_of_one_leader_make_one_serving_stretch(admin: Conn) -> None:
    heartbeat(admin)
    heartbeat(admin)
    heartbeat(admin, bound_ms=5000)  # other settings: a new stretch
    take_fence(admin, EPOCH + 1, holder="successor")
    heartbeat(admin, epoch=EPOCH + 1, bound_ms=5000)
    rows = admin.execute(
        "SELECT epoch, max_block_age_ms, heartbeats, first_at <= last_at"
        " FROM allocator.serving_history ORDER BY stretch_id"
    ).fetchall()
    assert rows == [(EPOCH, 4000, 2, True), (EPOCH, 5000, 1, True), (EPOCH + 1, 5000, 1, True)]


def test_each_role_gets_exactly_its_part(admin: Conn, login_as: LoginAs) -> None:
    stock(admin, aged=1, fresh=2)
    consumer, node, operator = (
        login_as("allocator_consumer"),
        login_as("allocator_node"),
        login_as("allocator_operator"),
    )
    node.execute("SELECT allocator.leader_heartbeat(0, %s, 4000, true, 60000)", (EPOCH,))
    assert node.execute("SELECT allocator.void_aged_blocks(0, %s, 0, 10)", (EPOCH,)).fetchone() == (
        1,
    )
    assert len(consumer.execute("SELECT * FROM allocator.claim_blocks_expiring('a')").fetchall())
    for conn in (consumer, node, operator):
        row = conn.execute("SELECT leader_serves FROM allocator.block_age_status").fetchone()
        assert row == (True,)
    for conn in (node, operator):
        assert conn.execute("SELECT count(*) FROM allocator.serving_history").fetchone() == (1,)
    refused = {
        consumer: [
            "SELECT allocator.leader_heartbeat(0, 40, 4000, true, 1000)",
            "SELECT allocator.void_aged_blocks(0, 40, 0, 10)",
            "SELECT * FROM allocator.serving_history",
            "SELECT * FROM allocator.block_age",
            "SELECT allocator.age_bound_id()",
        ],
        node: [
            "SELECT * FROM allocator.claim_blocks_expiring('n')",
            "SELECT * FROM allocator.block_age",
            "SELECT * FROM allocator.serving_stretches",
            "SELECT allocator.age_bound_id()",
        ],
        operator: [
            "SELECT * FROM allocator.claim_blocks_expiring('o')",
            "SELECT allocator.leader_heartbeat(0, 40, 4000, true, 1000)",
            "SELECT allocator.void_aged_blocks(0, 40, 0, 10)",
            "SELECT * FROM allocator.block_age",
        ],
    }
    for conn, statements in refused.items():
        for statement in statements:
            assert sqlstate(conn, statement) == PRIVILEGE, statement
