"""Least privilege: what each allocator role can and cannot do."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from tests.fixtures.pg import LAYOUT_JSON, cut, take_fence, url_for_user

pytestmark = pytest.mark.integration


@pytest.fixture
def login_as(db_url: str) -> Iterator[object]:
    """Creates throwaway login users in a group role; roles are cluster-wide, so drop them."""
    created: list[str] = []
    connections: list[psycopg.Connection[tuple[object, ...]]] = []

    def make(group: str) -> psycopg.Connection[tuple[object, ...]]:
        name = f"t_{group.removeprefix('allocator_')}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(db_url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
                    sql.Identifier(name), sql.Identifier(group)
                )
            )
        created.append(name)
        connection = psycopg.connect(url_for_user(db_url, name), autocommit=True)
        connections.append(connection)
        return connection

    yield make
    for connection in connections:
        connection.close()
    with psycopg.connect(db_url, autocommit=True) as admin:
        for name in created:
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


@pytest.fixture
def stocked(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as admin:
        take_fence(admin, 50)
        cut(admin, 50, [(1000 + 100 * i, 1099 + 100 * i) for i in range(10)])


def denied(conn: psycopg.Connection, statement: str) -> bool:
    try:
        conn.execute(statement)
    except psycopg.errors.InsufficientPrivilege:
        return True
    return False


REBASE = "SELECT * FROM allocator.rebase_fence('ensemble rebuilt')"
"""The operator's audited command: nobody else may run it."""
RESET = "SELECT * FROM allocator.reset_after_restore('restored from backup', -1, 1000)"
"""The operator's restore procedure (migration 0006): nobody else may run it either."""

WRITES = [
    f"SELECT * FROM allocator.take_fence(0, 999, 'x', 'h', 1, '{LAYOUT_JSON}')",
    f"SELECT * FROM allocator.cut_blocks(0, 50, ARRAY[5000], ARRAY[5099], '{LAYOUT_JSON}', 1000)",
    "SELECT allocator.requeue_stranded(0, 50)",
    "UPDATE allocator.blocks SET claimed_by = 'x', claimed_at = now()",
    "INSERT INTO allocator.blocks (ticket, first_id, last_id, epoch) VALUES (1, 9e6, 9e6, 50)",
    "DELETE FROM allocator.blocks",
    "UPDATE allocator.fence SET epoch = epoch + 1",
    "UPDATE allocator.high_water SET last_id = 0",
    "SELECT nextval('allocator.claim_ticket')",
]


@pytest.mark.usefixtures("stocked")
def test_consumer_can_only_claim_and_read_pool_status(login_as: object) -> None:
    consumer = login_as("allocator_consumer")  # type: ignore[operator]
    rows = consumer.execute("SELECT * FROM allocator.claim_blocks('app', 2)").fetchall()
    assert len(rows) == 2
    (available,) = consumer.execute("SELECT available_blocks FROM allocator.pool_status").fetchone()
    assert available == 8
    for statement in [
        *WRITES,
        REBASE,
        RESET,
        "SELECT * FROM allocator.blocks",
        "SELECT * FROM allocator.block_ledger",
        "SELECT * FROM allocator.leader_history",
        "SELECT * FROM allocator.fence",
    ]:
        assert denied(consumer, statement), statement


@pytest.mark.usefixtures("stocked")
def test_node_writes_only_through_the_fenced_functions(login_as: object) -> None:
    node = login_as("allocator_node")  # type: ignore[operator]
    node.execute(f"SELECT * FROM allocator.take_fence(0, 60, 'node-x', 'h', 1, '{LAYOUT_JSON}')")
    node.execute(
        "SELECT * FROM allocator.cut_blocks(0, 60, ARRAY[5000], ARRAY[5099], %s, 1000)",
        (LAYOUT_JSON,),
    )
    node.execute("SELECT allocator.requeue_stranded(0, 60)")
    node.execute("SELECT allocator.record_pool_sample()")
    node.execute("SELECT * FROM allocator.fence_history LIMIT 1")
    for statement in [
        *WRITES[3:],
        "SELECT * FROM allocator.block_ledger",  # migration 0007: the node reads what it uses
        REBASE,
        RESET,
        "SELECT * FROM allocator.claim_blocks('node', 1)",
    ]:
        assert denied(node, statement), statement


@pytest.mark.usefixtures("stocked")
def test_operator_reads_the_views_and_writes_nothing(login_as: object) -> None:
    operator = login_as("allocator_operator")  # type: ignore[operator]
    for view in ("block_ledger", "pool_status", "leader_history"):
        operator.execute(f"SELECT * FROM allocator.{view}").fetchall()
    for statement in [*WRITES, "SELECT * FROM allocator.claim_blocks('op', 1)"]:
        assert denied(operator, statement), statement


@pytest.mark.usefixtures("stocked")
def test_only_the_operator_rebases_the_fence_and_every_rebase_is_recorded(
    login_as: object,
) -> None:
    operator = login_as("allocator_operator")  # type: ignore[operator]
    (old_generation, old_epoch, new_generation) = operator.execute(REBASE).fetchone()
    assert (old_generation, old_epoch, new_generation) == (0, 50, 1)
    rows = operator.execute(
        "SELECT rebased_by, old_generation, old_epoch, new_generation, reason"
        " FROM allocator.fence_history"
    ).fetchall()
    assert len(rows) == 1
    rebased_by, *rest = rows[0]
    assert rebased_by.startswith("t_operator_")  # the login user, not the group
    assert rest == [0, 50, 1, "ensemble rebuilt"]
    (ended,) = operator.execute(
        "SELECT end_reason FROM allocator.leader_history WHERE epoch = 50"
    ).fetchone()
    assert ended == "rebased"
    with pytest.raises(psycopg.Error) as caught:
        operator.execute("SELECT * FROM allocator.rebase_fence('  ')")
    assert caught.value.sqlstate == "AL106"


@pytest.mark.usefixtures("stocked")
def test_only_the_operator_resets_the_pool_after_a_restore_and_it_is_recorded(
    login_as: object, db_url: str
) -> None:
    consumer = login_as("allocator_consumer")  # type: ignore[operator]
    consumer.execute("SELECT * FROM allocator.claim_blocks('app', 3)").fetchall()
    operator = login_as("allocator_operator")  # type: ignore[operator]
    with pytest.raises(psycopg.Error) as caught:
        operator.execute("SELECT * FROM allocator.reset_after_restore(' ', -1, 1000)")
    assert caught.value.sqlstate == "AL106"
    with pytest.raises(psycopg.Error) as caught:
        operator.execute("SELECT * FROM allocator.reset_after_restore('x', -1, 0)")
    assert caught.value.sqlstate == "AL106"
    floor = 10**15
    with psycopg.connect(db_url, autocommit=True) as admin:  # the clock before the reset
        (before_ms,) = admin.execute("SELECT allocator.db_now_ms()").fetchone()
    (voided, old_mark, new_mark, old_gen, old_epoch, new_gen) = operator.execute(
        "SELECT * FROM allocator.reset_after_restore('restored from backup', %s, 1000)",
        (floor,),
    ).fetchone()
    assert (voided, old_mark, old_gen, old_epoch, new_gen) == (7, 1999, 0, 50, 1)
    with psycopg.connect(db_url, autocommit=True) as admin:
        (mark_time_ms,) = admin.execute(  # a helper of the owner's (migration 0007)
            "SELECT allocator.id_time_ms(%s)", (new_mark,)
        ).fetchone()
        assert new_mark > floor  # past the watermark, and past the clock plus the lead:
        assert mark_time_ms >= before_ms + 1000  # the reset read its clock after before_ms
        ledger = admin.execute(
            "SELECT claimed_by, count(*) FROM allocator.block_ledger GROUP BY 1 ORDER BY 1"
        ).fetchall()
        assert ledger == [("allocator:voided-by-reset", 7), ("app", 3)]
        assert admin.execute("SELECT generation, epoch FROM allocator.fence").fetchone() == (1, 0)
        assert admin.execute(
            "SELECT end_reason FROM allocator.leader_history WHERE epoch = 50"
        ).fetchone() == ("reset",)
        with pytest.raises(psycopg.Error) as caught:  # the token from before the restore
            admin.execute("SELECT allocator.requeue_stranded(0, 50)")
        assert caught.value.sqlstate == "AL100"
    (row,) = operator.execute(
        "SELECT reason, voided_blocks, old_high_water_id, new_high_water_id, new_generation"
        " FROM allocator.pool_resets"
    ).fetchall()
    assert row == ("restored from backup", 7, 1999, new_mark, 1)
    (reason,) = operator.execute("SELECT reason FROM allocator.fence_history").fetchone()
    assert reason == "pool reset after restore: restored from backup"
