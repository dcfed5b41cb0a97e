"""Pausing claims in SQL (migration 0010): ``pause_claims``, ``resume_claims``,
``claims_in_flight``, ``claim_blocks``' AL004, and a reset database that starts paused.

Rules: a fresh migrated database per test; the roles are throwaway login users in the
allocator groups; "nothing handed out while paused" is judged on the ledger and the ticket
position, not on timing.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql

from tests.fixtures.pg import claim, cut, layout_blocks, take_fence, url_for_user

pytestmark = pytest.mark.integration

EPOCH = 40
REASON = "restore drill INC-1234"
PAUSED, INVALID, PRIVILEGE, SERIALIZATION = "AL004", "AL106", "42501", "40001"

Conn = psycopg.Connection[tuple[object, ...]]
LoginAs = Callable[[str], Conn]


@pytest.fixture
def admin(db_url: str) -> Iterator[Conn]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        take_fence(conn, EPOCH)
        cut(conn, EPOCH, layout_blocks(10))
        yield conn


@pytest.fixture
def login_as(db_url: str, admin: Conn) -> Iterator[LoginAs]:
    made: list[tuple[str, Conn]] = []

    def make(group: str) -> Conn:
        name = f"t_pause_{group.removeprefix('allocator_')}_{uuid.uuid4().hex[:8]}"
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


def sqlstate(conn: Conn, statement: str) -> str | None:
    try:
        conn.execute(statement)
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


def handed_out(conn: Conn) -> tuple[int, int]:
    """Blocks claimed so far and the claim-ticket position: what a claim would change."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM allocator.blocks WHERE claimed_at IS NOT NULL),"
        " claim_position FROM allocator.pool_status"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])  # type: ignore[call-overload]


def test_only_the_operator_pauses_and_resumes(login_as: LoginAs) -> None:
    consumer, node = login_as("allocator_consumer"), login_as("allocator_node")
    for conn in (consumer, node):
        for statement in (
            "SELECT * FROM allocator.pause_claims('x')",
            "SELECT * FROM allocator.resume_claims('x')",
            "SELECT * FROM allocator.claims_in_flight()",
        ):
            assert sqlstate(conn, statement) == PRIVILEGE, statement
    operator = login_as("allocator_operator")
    assert sqlstate(operator, "SELECT * FROM allocator.pause_claims('x')") is None


def test_claims_are_refused_while_paused_audited_and_served_again(
    admin: Conn, login_as: LoginAs
) -> None:
    operator, consumer = login_as("allocator_operator"), login_as("allocator_consumer")
    operator_name = operator.info.user
    assert claim(consumer, "app") != []
    before = handed_out(admin)

    row = operator.execute("SELECT * FROM allocator.pause_claims(%s)", (REASON,)).fetchone()
    assert row is not None
    pause_id, _paused_at, paused_by, reason, already = row
    assert (paused_by, reason, already) == (operator_name, REASON, False)
    assert consumer.execute("SELECT claims_paused FROM allocator.pool_status").fetchone() == (True,)
    for n in (1, 5):
        with pytest.raises(psycopg.Error) as refused:
            claim(consumer, "app", n)
        assert refused.value.sqlstate == PAUSED
        detail = refused.value.diag.message_detail
        assert detail is not None
        assert detail.startswith("paused at ")
        assert REASON not in detail  # who and why are the operators' (claim_pause_history)
    assert handed_out(admin) == before  # no block claimed, no ticket drawn

    row = operator.execute("SELECT * FROM allocator.resume_claims('restored')").fetchone()
    assert row is not None
    assert row[0] == pause_id
    assert row[5:] == (operator_name, "restored", True)
    assert len(claim(consumer, "app", 2)) == 2
    assert consumer.execute("SELECT claims_paused FROM allocator.pool_status").fetchone() == (
        False,
    )
    history = operator.execute(
        "SELECT pause_id, paused_by, reason, resumed_by, resume_reason, resumed_at > paused_at"
        " FROM allocator.claim_pause_history"
    ).fetchall()
    assert history == [(pause_id, operator_name, REASON, operator_name, "restored", True)]


def test_pausing_twice_and_resuming_unpaused_claims_change_nothing(login_as: LoginAs) -> None:
    operator = login_as("allocator_operator")
    resumed = operator.execute("SELECT * FROM allocator.resume_claims('nothing')").fetchone()
    assert resumed is not None
    assert (resumed[0], resumed[-1]) == (None, False)
    first = operator.execute("SELECT * FROM allocator.pause_claims('first')").fetchone()
    again = operator.execute("SELECT * FROM allocator.pause_claims('second')").fetchone()
    assert first is not None
    assert again is not None
    assert again[:4] == first[:4]  # the open pause, with its own reason
    assert (first[-1], again[-1]) == (False, True)
    (count,) = operator.execute(  # type: ignore[misc]
        "SELECT count(*) FROM allocator.claim_pause_history"
    ).fetchone()
    assert count == 1


@pytest.mark.parametrize("reason", ["", "   ", "x" * 1001])
def test_a_pause_or_resume_needs_a_reason(login_as: LoginAs, reason: str) -> None:
    operator = login_as("allocator_operator")
    for function in ("pause_claims", "resume_claims"):
        statement = sql.SQL("SELECT * FROM allocator.{}({})").format(
            sql.Identifier(function), sql.Literal(reason)
        )
        assert sqlstate(operator, statement.as_string(operator)) == INVALID


def test_a_claim_in_flight_is_listed_until_its_transaction_ends(
    db_url: str, admin: Conn, login_as: LoginAs
) -> None:
    """A claim made in an open transaction before the pause: the pause's wait must see it,
    and it keeps its block when it commits (it was claimed before the pause)."""
    operator = login_as("allocator_operator")
    with psycopg.connect(db_url, application_name="slow-consumer") as holder:
        (block,) = claim(holder, "slow")  # the transaction stays open
        operator.execute("SELECT * FROM allocator.pause_claims('drain')")
        in_flight = operator.execute(
            "SELECT pid, application_name, state FROM allocator.claims_in_flight()"
        ).fetchall()
        assert in_flight == [(holder.info.backend_pid, "slow-consumer", "idle in transaction")]
        holder.commit()
    assert operator.execute("SELECT * FROM allocator.claims_in_flight()").fetchall() == []
    (claimed_by,) = admin.execute(  # type: ignore[misc]
        "SELECT claimed_by FROM allocator.blocks WHERE block_id = %s", (block[0],)
    ).fetchone()
    assert claimed_by == "slow"


def test_a_repeatable_read_claim_older_than_the_pause_is_refused(
    db_url: str, login_as: LoginAs
) -> None:
    """Its snapshot predates the pause, so a plain read would say "not paused": the flag is
    read FOR KEY SHARE there and the claim fails as a serialization conflict (retryable)."""
    operator = login_as("allocator_operator")
    with psycopg.connect(db_url) as late:
        late.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        late.execute("SELECT 1 FROM allocator.pool_status")  # the snapshot is taken here
        operator.execute("SELECT * FROM allocator.pause_claims('drain')")
        with pytest.raises(psycopg.Error) as refused:
            claim(late, "late")
    assert refused.value.sqlstate == SERIALIZATION


@pytest.mark.usefixtures("admin")
def test_a_reset_after_restore_leaves_claims_paused_with_its_reason(login_as: LoginAs) -> None:
    operator, consumer = login_as("allocator_operator"), login_as("allocator_consumer")
    operator.execute("SELECT * FROM allocator.pause_claims('before the backup')")
    operator.execute("SELECT * FROM allocator.reset_after_restore(%s, -1, 1000)", (REASON,))
    assert sqlstate(consumer, "SELECT * FROM allocator.claim_blocks('app')") == PAUSED
    history = operator.execute(
        "SELECT reason, resume_reason FROM allocator.claim_pause_history ORDER BY pause_id"
    ).fetchall()
    assert history == [
        ("before the backup", "superseded by a pool reset after restore"),
        (f"pool reset after restore: {REASON}", None),
    ]
    operator.execute("SELECT * FROM allocator.resume_claims('procedure done')")
    assert sqlstate(consumer, "SELECT * FROM allocator.claim_blocks('app')") != PAUSED
