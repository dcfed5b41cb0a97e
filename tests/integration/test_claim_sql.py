"""allocator.claim_blocks and the fenced write functions, against a real PostgreSQL."""

from __future__ import annotations

import json

import psycopg
import pytest
from psycopg import errors as pg_errors

from allocator.layout import Layout
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
