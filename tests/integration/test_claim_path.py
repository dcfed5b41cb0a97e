"""claim_blocks reads the bound on an ID's age inline since migration 0013: the expression
in its body must stay ``age_bound_id(0, false)``'s, in every state of ``block_age``.

Rules: the statement is taken from the installed function's own body (pg_proc.prosrc) and
run beside ``age_bound_id()`` in one statement; the two may differ only when the database
clock crossed a millisecond between them (one millisecond of IDs).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from allocator.core.layout import Layout
from tests.fixtures.pg import take_fence

pytestmark = pytest.mark.integration

EPOCH = 40
LAYOUT = Layout()
ONE_MS_OF_IDS = 1 << (LAYOUT.datacenter_bits + LAYOUT.lane_bits + LAYOUT.sequence_bits)
INLINE = re.compile(
    r"SELECT \(SELECT p\.pause_id FROM allocator\.claim_pause p\),"
    r"\s*(\(SELECT greatest.*?\))\s*INTO pause, bound_id;",
    re.DOTALL,
)


@pytest.fixture
def admin(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        take_fence(conn, EPOCH)
        yield conn


def inline_and_called(conn: psycopg.Connection[Any]) -> tuple[int | None, int | None]:
    """The bound as claim_blocks' body computes it, and as age_bound_id() does."""
    row = conn.execute(
        "SELECT prosrc FROM pg_proc"
        " WHERE oid = 'allocator.claim_blocks(text, integer)'::regprocedure"
    ).fetchone()
    assert row is not None
    found = INLINE.search(row[0])
    assert found, "claim_blocks no longer reads the bound with the pause flag"
    got = conn.execute(f"SELECT {found.group(1)}, allocator.age_bound_id()").fetchone()
    assert got is not None
    return got[0], got[1]


def heartbeat(conn: psycopg.Connection[Any], serve_aged: bool, stale_ms: int) -> None:
    conn.execute(
        "SELECT allocator.leader_heartbeat(0, %s, 4000, %s, %s)", (EPOCH, serve_aged, stale_ms)
    )


def test_the_inline_bound_is_age_bound_ids_in_every_state(admin: psycopg.Connection[Any]) -> None:
    assert inline_and_called(admin) == (None, None)  # no heartbeat yet: no bound
    heartbeat(admin, serve_aged=True, stale_ms=60_000)  # a leader serves: a bound
    inline, called = inline_and_called(admin)
    assert inline is not None
    assert called is not None
    assert abs(inline - called) <= ONE_MS_OF_IDS
    heartbeat(admin, serve_aged=True, stale_ms=1)  # no leader serves, aged blocks served
    time.sleep(0.01)
    assert inline_and_called(admin) == (None, None)
    heartbeat(admin, serve_aged=False, stale_ms=1)  # no leader, but the bound always holds
    time.sleep(0.01)
    inline, called = inline_and_called(admin)
    assert inline is not None
    assert called is not None
    assert abs(inline - called) <= ONE_MS_OF_IDS
