"""allocator.claim_blocks and the fenced write functions, against a real PostgreSQL."""

from __future__ import annotations

import json
import time

import psycopg
import pytest
from psycopg import errors as pg_errors

from allocator.core.layout import Layout
from tests.fixtures.pg import LAYOUT_JSON, claim, cut, take_fence

pytestmark = pytest.mark.integration

EPOCH = 100


@pytest.fixture
def conn(db_url: str) -> psycopg.Connection[tuple[object, ...]]:
    with psycopg.connect(db_url, autocommit=True) as connection:
        yield connection


def blocks(first: int, count: int, size: int = 4096) -> list[tuple[int, int]]:
    return [(first + i * size, first + (i + 1) * size - 1) for i in range(count)]


def test_claims_hand_out_the_oldest_blocks_first_in_order(conn: psycopg.Connection) -> None:
    take_fence(conn, EPOCH)
    cut(conn, EPOCH, blocks(1 << 22, 5))
    first = claim(conn, "orders")
    batch = claim(conn, "orders", 3)
    assert first == [(1, 1 << 22, (1 << 22) + 4095)]
    assert [b[0] for b in batch] == [2, 3, 4]
    assert [b[1] for b in batch] == sorted(b[1] for b in batch)


@pytest.mark.parametrize(
    ("consumer", "message"),
    [
        (None, "non-empty"),
        ("", "non-empty"),
        ("   ", "non-empty"),
        ("x" * 129, "129 characters"),
        ("bad\nname", "control characters"),
    ],
)
def test_bad_consumer_is_rejected_with_al001(
    conn: psycopg.Connection, consumer: str | None, message: str
) -> None:
    with pytest.raises(psycopg.Error, match=message) as caught:
        conn.execute("SELECT * FROM allocator.claim_blocks(%s, 1)", (consumer,))
    assert caught.value.sqlstate == "AL001"


@pytest.mark.parametrize("n", [None, 0, -1, 1001])
def test_bad_count_is_rejected_with_al002(conn: psycopg.Connection, n: int | None) -> None:
    with pytest.raises(psycopg.Error, match="between 1 and 1000") as caught:
        conn.execute("SELECT * FROM allocator.claim_blocks('orders', %s)", (n,))
    assert caught.value.sqlstate == "AL002"


def test_maximum_count_is_accepted(conn: psycopg.Connection) -> None:
    take_fence(conn, EPOCH)
    cut(conn, EPOCH, blocks(1 << 22, 1000, size=16))
    assert len(claim(conn, "bulk", 1000)) == 1000


def test_empty_pool_raises_al003_without_waiting(conn: psycopg.Connection) -> None:
    with pytest.raises(psycopg.Error, match="pool empty") as caught:
        claim(conn, "orders")
    assert caught.value.sqlstate == "AL003"


def test_short_pool_returns_fewer_rows(conn: psycopg.Connection) -> None:
    take_fence(conn, EPOCH)
    cut(conn, EPOCH, blocks(1 << 22, 2))
    assert len(claim(conn, "orders", 5)) == 2


def test_block_cut_after_an_early_claim_is_not_stranded(conn: psycopg.Connection) -> None:
    """A claim on an empty pool burns tickets; blocks cut later must still be claimable."""
    take_fence(conn, EPOCH)
    for _ in range(3):
        with pytest.raises(psycopg.Error):
            claim(conn, "early", 2)
    cut(conn, EPOCH, blocks(1 << 22, 2))
    assert len(claim(conn, "late", 2)) == 2


def test_block_of_a_rolled_back_claim_is_claimed_again(conn: psycopg.Connection) -> None:
    take_fence(conn, EPOCH)
    cut(conn, EPOCH, blocks(1 << 22, 4))
    with conn.transaction(force_rollback=True):
        (lost,) = claim(conn, "rolled-back")
    # The next claims draw later tickets and do not see the stranded block...
    assert lost not in claim(conn, "orders", 2)
    # ...until the leader requeues it: two runs, because a run only considers tickets drawn
    # before the previous run (claims still in flight keep their block).
    requeue = "SELECT allocator.requeue_stranded(0, %s)"
    conn.execute(requeue, (EPOCH,))
    (moved,) = conn.execute(requeue, (EPOCH,)).fetchone()  # type: ignore[misc]
    assert moved == 1
    assert lost in claim(conn, "orders", 2)


def test_claim_slow_path_takes_a_stranded_block_when_its_ticket_misses(
    conn: psycopg.Connection,
) -> None:
    take_fence(conn, EPOCH)
    cut(conn, EPOCH, blocks(1 << 22, 1))
    with conn.transaction(force_rollback=True):
        (lost,) = claim(conn, "rolled-back")
    # The slow path only takes tickets requeue_stranded has seen drawn (its previous run),
    # never one a claim in flight may be about to take.
    with pytest.raises(psycopg.Error, match="pool empty"):
        claim(conn, "too-soon")
    conn.execute("SELECT allocator.requeue_stranded(0, %s)", (EPOCH,))
    # The pool has no block for the next ticket: the claim falls back to the stranded one.
    assert claim(conn, "orders") == [lost]


def test_a_claim_never_waits_for_a_block_another_transaction_holds(
    conn: psycopg.Connection, db_url: str
) -> None:
    """Review finding: a slow-path claim in an open transaction must not stall others."""
    take_fence(conn, EPOCH)
    cut(conn, EPOCH, blocks(1 << 22, 3))
    with conn.transaction(force_rollback=True):
        (lost,) = claim(conn, "rolled-back")
    conn.execute("SELECT allocator.requeue_stranded(0, %s)", (EPOCH,))
    with psycopg.connect(db_url) as holder, psycopg.connect(db_url, autocommit=True) as other:
        other.execute("SET lock_timeout = '2s'")  # a wait would fail instead of hanging
        # holder drains the pool's next tickets and grabs the stranded block, keeps it open
        assert lost in claim(holder, "holder", 3)
        with pytest.raises(psycopg.Error, match="pool empty"):
            claim(other, "other")  # returns at once: nothing to take, nothing to wait for
        holder.rollback()
    conn.execute("SELECT allocator.requeue_stranded(0, %s)", (EPOCH,))
    conn.execute("SELECT allocator.requeue_stranded(0, %s)", (EPOCH,))
    assert len(claim(conn, "after", 3)) == 3


def test_longest_consumer_name_is_accepted(conn: psycopg.Connection) -> None:
    take_fence(conn, EPOCH)
    cut(conn, EPOCH, blocks(1 << 22, 1))
    assert len(claim(conn, "x" * 128)) == 1


def test_a_block_at_the_largest_id_is_refused_as_ahead_of_the_database_clock(
    conn: psycopg.Connection,
) -> None:
    """The largest ID carries the layout's last millisecond (2089): decoding it must not
    overflow, and the clock rule must refuse it (AL105), not a range or cast error."""
    layout = json.dumps(Layout().record(31))  # the largest ID's datacenter field is all ones
    conn.execute("SELECT * FROM allocator.take_fence(0, %s, 'node', 'h', 1, %s)", (EPOCH, layout))
    top = 2**63 - 1
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(
            "SELECT * FROM allocator.cut_blocks(0, %s, %s, %s, %s, 1000)",
            (EPOCH, [top - 4095], [top], layout),
        )
    assert caught.value.sqlstate == "AL105"
    assert "clock ahead" in str(caught.value)


def test_claim_forces_synchronous_commit(conn: psycopg.Connection) -> None:
    take_fence(conn, EPOCH)
    cut(conn, EPOCH, blocks(1 << 22, 1))
    conn.execute("SET synchronous_commit = off")
    with conn.transaction():
        claim(conn, "orders")
        (setting,) = conn.execute("SHOW synchronous_commit").fetchone()  # type: ignore[misc]
    assert setting == "on"
    (after,) = conn.execute("SHOW synchronous_commit").fetchone()  # type: ignore[misc]
    assert after == "off"  # only the claim's transaction was changed


def test_write_with_a_stale_epoch_is_fenced_al100(conn: psycopg.Connection) -> None:
    take_fence(conn, EPOCH)
    take_fence(conn, EPOCH + 1)
    with pytest.raises(psycopg.Error, match="fenced") as caught:
        cut(conn, EPOCH, blocks(1 << 22, 1))
    assert caught.value.sqlstate == "AL100"
    with pytest.raises(psycopg.Error) as requeue:
        conn.execute("SELECT allocator.requeue_stranded(0, %s)", (EPOCH,))
    assert requeue.value.sqlstate == "AL100"


@pytest.mark.parametrize("older", [EPOCH, EPOCH - 1])
def test_takeover_only_moves_forward_al101(conn: psycopg.Connection, older: int) -> None:
    take_fence(conn, EPOCH)
    with pytest.raises(psycopg.Error, match="stale takeover") as caught:
        take_fence(conn, older)
    assert caught.value.sqlstate == "AL101"


def test_cut_at_or_behind_the_high_water_mark_is_rejected_al102(conn: psycopg.Connection) -> None:
    take_fence(conn, EPOCH)
    cut(conn, EPOCH, blocks(1 << 22, 2))
    with pytest.raises(psycopg.Error, match="high-water mark") as caught:
        cut(conn, EPOCH, blocks((1 << 22) + 4096, 1))
    assert caught.value.sqlstate == "AL102"
    # A new leader is bound by the same mark, whatever its clock says.
    take_fence(conn, EPOCH + 1)
    with pytest.raises(psycopg.Error) as again:
        cut(conn, EPOCH + 1, blocks(1 << 16, 1))
    assert again.value.sqlstate == "AL102"


@pytest.mark.parametrize(
    ("firsts", "lasts"),
    [
        ([], []),
        ([10], [20, 30]),
        ([30], [20]),
        ([10, 15], [20, 30]),
        ([40, 10], [50, 20]),
        ([None], [5]),
        ("[2:3]={5000,6000}", "[2:3]={5099,6099}"),
        ("{{1,2}}", "{{3,4}}"),
    ],
)
def test_malformed_batches_are_rejected_al103(
    conn: psycopg.Connection, firsts: list[int | None] | str, lasts: list[int] | str
) -> None:
    """Includes arrays not indexed from 1, which once slipped past the high-water check."""
    take_fence(conn, EPOCH)
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(
            "SELECT * FROM allocator.cut_blocks(0, %s, %s::bigint[], %s::bigint[], %s, 1000)",
            (EPOCH, firsts, lasts, LAYOUT_JSON),
        )
    assert caught.value.sqlstate == "AL103"


def test_overlapping_blocks_are_refused_even_to_a_superuser(conn: psycopg.Connection) -> None:
    take_fence(conn, EPOCH)
    cut(conn, EPOCH, blocks(1000, 1, size=100))
    with pytest.raises(pg_errors.ExclusionViolation):
        conn.execute(
            "INSERT INTO allocator.blocks (ticket, first_id, last_id, epoch)"
            " VALUES (999999, 1050, 1200, %s)",
            (EPOCH,),
        )


def test_overlap_within_one_insert_and_moved_ranges_are_refused(
    conn: psycopg.Connection,
) -> None:
    with pytest.raises(pg_errors.ExclusionViolation):
        conn.execute(
            "INSERT INTO allocator.blocks (ticket, first_id, last_id, epoch)"
            " VALUES (1, 100, 200, 1), (2, 150, 300, 1)"
        )
    take_fence(conn, EPOCH)
    cut(conn, EPOCH, blocks(1000, 2, size=100))
    with pytest.raises(psycopg.Error) as caught:
        conn.execute("UPDATE allocator.blocks SET last_id = last_id + 50 WHERE first_id = 1000")
    assert caught.value.sqlstate == "AL103"
    # claims and requeues update other columns and are untouched by the guard
    assert len(claim(conn, "app")) == 1


def test_leader_history_records_terms(conn: psycopg.Connection) -> None:
    take_fence(conn, EPOCH, holder="node-a")
    take_fence(conn, EPOCH + 5, holder="node-b")
    conn.execute("SELECT allocator.end_term(0, %s, 'stepped_down')", (EPOCH + 5,))
    rows = conn.execute(
        "SELECT epoch, holder, ended_at IS NOT NULL, end_reason"
        " FROM allocator.leader_history ORDER BY epoch"
    ).fetchall()
    assert rows == [
        (EPOCH, "node-a", True, "superseded"),
        (EPOCH + 5, "node-b", True, "stepped_down"),
    ]


def test_pool_status_reports_level_rate_and_mark(conn: psycopg.Connection) -> None:
    take_fence(conn, EPOCH, holder="node-a")
    cut(conn, EPOCH, blocks(1 << 22, 10))
    claim(conn, "orders", 4)
    status = conn.execute(
        "SELECT available_blocks, available_ids, high_water_id, epoch, holder"
        " FROM allocator.pool_status"
    ).fetchone()
    assert status == (6, 6 * 4096, (1 << 22) + 10 * 4096 - 1, EPOCH, "node-a")
    # Claim rate needs a sample at least a second old: backdate one.
    conn.execute("SELECT allocator.record_pool_sample()")
    conn.execute(
        "UPDATE allocator.pool_samples SET sampled_at = clock_timestamp() - interval '10 s',"
        " claim_position = 0"
    )
    rate, runway = conn.execute(
        "SELECT claim_rate_blocks_per_s, runway_s FROM allocator.pool_status"
    ).fetchone()  # type: ignore[misc]
    assert rate == pytest.approx(0.4, rel=0.2)
    assert runway == pytest.approx(6 / rate)


# -- a slow consumer: a claim left open (migration 0004) ------------------------------------

REQUEUE = "SELECT allocator.requeue_stranded(0, %s)"


def requeue(conn: psycopg.Connection) -> int:
    (moved,) = conn.execute(REQUEUE, (EPOCH,)).fetchone()  # type: ignore[misc]
    return int(moved)


def floor_and_mark(conn: psycopg.Connection) -> tuple[int, int]:
    row = conn.execute("SELECT requeued_upto, requeue_mark FROM allocator.high_water").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def held(conn: psycopg.Connection) -> list[int]:
    rows = conn.execute("SELECT block_id FROM allocator.held_tickets ORDER BY block_id")
    return [int(block_id) for (block_id,) in rows.fetchall()]


def available(conn: psycopg.Connection) -> int:
    (count,) = conn.execute("SELECT available_blocks FROM allocator.pool_status").fetchone()  # type: ignore[misc]
    return int(count)


def ticket_of(conn: psycopg.Connection, block_id: int) -> int:
    row = conn.execute("SELECT ticket FROM allocator.blocks WHERE block_id = %s", (block_id,))
    (ticket,) = row.fetchone()  # type: ignore[misc]
    return int(ticket)


def open_claim(db_url: str, consumer: str = "slow") -> tuple[psycopg.Connection, int]:
    """A consumer that claims one block inside a transaction and keeps it open."""
    holder = psycopg.connect(db_url)
    ((block_id, _, _),) = claim(holder, consumer)
    return holder, block_id


def test_a_held_claim_no_longer_pins_the_requeue_floor(
    conn: psycopg.Connection, db_url: str
) -> None:
    take_fence(conn, EPOCH)
    cut(conn, EPOCH, blocks(1 << 22, 20))
    holder, mine = open_claim(db_url)
    try:
        claim(conn, "others", 3)
        requeue(conn)
        requeue(conn)  # the held ticket is in this run's window: it cannot lock the row
        floor, _ = floor_and_mark(conn)
        assert floor >= ticket_of(conn, mine) + 3  # 0003 stopped at ticket_of(mine) - 1
        assert held(conn) == [mine]
        for _ in range(3):  # later runs advance the floor with the claims; the row stays held
            claim(conn, "others", 2)
            requeue(conn)
        assert floor_and_mark(conn)[0] > floor
        assert held(conn) == [mine]
    finally:
        holder.rollback()
        holder.close()


def test_a_held_ticket_is_forgotten_once_its_claim_commits(
    conn: psycopg.Connection, db_url: str
) -> None:
    take_fence(conn, EPOCH)
    cut(conn, EPOCH, blocks(1 << 22, 5))
    holder, mine = open_claim(db_url)
    with holder:
        claim(conn, "others")
        requeue(conn)
        requeue(conn)
        assert held(conn) == [mine]
        assert available(conn) == 4  # an open claim's block reads as unclaimed, as in 0003
        holder.commit()
    assert available(conn) == 3
    assert requeue(conn) == 0
    assert held(conn) == []
    (owner,) = conn.execute(  # type: ignore[misc]
        "SELECT claimed_by FROM allocator.blocks WHERE block_id = %s", (mine,)
    ).fetchone()
    assert owner == "slow"
    assert available(conn) == 3


def test_a_held_ticket_whose_claim_rolls_back_is_requeued_and_handed_out_once(
    conn: psycopg.Connection, db_url: str
) -> None:
    take_fence(conn, EPOCH)
    cut(conn, EPOCH, blocks(1 << 22, 6))
    holder, mine = open_claim(db_url)
    with holder:
        handed_out = [b for b, _, _ in claim(conn, "others", 2)]
        requeue(conn)
        requeue(conn)
        assert held(conn) == [mine]
        holder.rollback()
    assert available(conn) == 4  # counted again at once, before any requeue
    assert requeue(conn) == 1
    assert held(conn) == []
    floor, _ = floor_and_mark(conn)
    assert ticket_of(conn, mine) > floor  # back in the queue, behind the pool
    assert available(conn) == 4
    handed_out += [b for b, _, _ in claim(conn, "others", 10)]
    assert sorted(handed_out) == list(range(1, 7))  # every block once, the requeued one too
    with pytest.raises(psycopg.Error, match="pool empty"):
        claim(conn, "others")


def test_the_slow_path_takes_a_rolled_back_held_block_before_the_next_requeue(
    conn: psycopg.Connection, db_url: str
) -> None:
    take_fence(conn, EPOCH)
    cut(conn, EPOCH, blocks(1 << 22, 2))
    holder, mine = open_claim(db_url)
    with holder:
        (other,) = claim(conn, "others")
        requeue(conn)
        requeue(conn)
        assert held(conn) == [mine]
        with pytest.raises(psycopg.Error, match="pool empty"):
            claim(conn, "too-soon")  # the held block is locked: skipped, never waited for
        holder.rollback()
    assert claim(conn, "later") == [(mine, *blocks(1 << 22, 1)[0])]
    assert other[0] != mine
    assert requeue(conn) == 0  # claimed by now: forgotten, not moved
    assert held(conn) == []


def test_available_blocks_stays_right_around_held_claims(
    conn: psycopg.Connection, db_url: str
) -> None:
    take_fence(conn, EPOCH)
    cut(conn, EPOCH, blocks(1 << 22, 10))
    holders = [open_claim(db_url, f"slow-{i}") for i in range(3)]
    try:
        claim(conn, "others", 2)
        requeue(conn)
        requeue(conn)
        assert len(held(conn)) == 3
        assert available(conn) == 8
        holders[0][0].commit()
        holders[1][0].rollback()
        claim(conn, "others", 2)
        requeue(conn)
        truth = "SELECT count(*) FROM allocator.blocks WHERE claimed_at IS NULL"
        (unclaimed,) = conn.execute(truth).fetchone()  # type: ignore[misc]
        assert available(conn) == unclaimed == 5  # 10 - 1 committed - 4 others (+1 held open)
        assert held(conn) == [holders[2][1]]
    finally:
        for holder, _ in holders:
            holder.rollback()
            holder.close()


def test_a_claim_bounds_how_long_its_transaction_may_sit_idle(
    conn: psycopg.Connection, db_url: str
) -> None:
    take_fence(conn, EPOCH)
    cut(conn, EPOCH, blocks(1 << 22, 3))
    setting = "SHOW idle_in_transaction_session_timeout"
    with psycopg.connect(db_url) as consumer:
        consumer.execute("SET idle_in_transaction_session_timeout = 0")
        consumer.commit()
        claim(consumer, "bounded")
        assert consumer.execute(setting).fetchone() == ("1min",)
        consumer.commit()
        assert consumer.execute(setting).fetchone() == ("0",)  # the transaction's only
        consumer.commit()
        consumer.execute("SET idle_in_transaction_session_timeout = '10s'")
        consumer.commit()
        claim(consumer, "bounded")
        assert consumer.execute(setting).fetchone() == ("10s",)  # a shorter bound is kept
        consumer.rollback()


def wait_for_backend_gone(conn: psycopg.Connection, pid: int, deadline_s: float) -> None:
    """Poll pg_stat_activity until the backend ``pid`` has exited (by the deadline)."""
    until = time.monotonic() + deadline_s
    while time.monotonic() < until:
        row = conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
        if row is None:
            return
        time.sleep(0.2)
    pytest.fail(f"backend {pid} still there after {deadline_s} s")


@pytest.mark.parametrize(
    ("session_bound", "deadline_s"),
    [
        pytest.param("2s", 30.0, id="shorter-session-bound"),
        # The function's own bound takes a minute to show; the setting it makes is checked
        # by test_a_claim_bounds_how_long_its_transaction_may_sit_idle in every run.
        pytest.param(None, 120.0, id="claim-blocks-own-60s-bound", marks=pytest.mark.soak),
    ],
)
def test_an_idle_claim_is_ended_by_the_server_and_its_block_requeued(
    conn: psycopg.Connection, db_url: str, session_bound: str | None, deadline_s: float
) -> None:
    """The server ends a transaction left idle after a claim (60 s, set by claim_blocks, or
    the session's shorter bound); the block rolls back and the leader requeues it."""
    take_fence(conn, EPOCH)
    cut(conn, EPOCH, blocks(1 << 22, 3))
    holder = psycopg.connect(db_url)
    try:
        if session_bound:
            holder.execute(
                "SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
                (session_bound,),
            )
            holder.commit()
        ((mine, _, _),) = claim(holder, "stalled")
        claim(conn, "others")
        requeue(conn)
        requeue(conn)
        assert held(conn) == [mine]
        wait_for_backend_gone(conn, holder.info.backend_pid, deadline_s)
        with pytest.raises(psycopg.Error) as ended:
            holder.execute("SELECT 1")
        # FATAL 25P03 when the client reads the server's last message, else just "closed"
        assert isinstance(
            ended.value, pg_errors.IdleInTransactionSessionTimeout | psycopg.OperationalError
        )
        assert holder.closed
    finally:
        holder.close()
    assert requeue(conn) == 1
    assert held(conn) == []
    got = [b for b, _, _ in claim(conn, "others", 3)]
    assert got.count(mine) == 1
