"""A claim on a primary whose synchronous standby is absent (docs/postgres-ha.md, "When no
synchronous standby answers: claims block"): the commit waits past the claim's
statement_timeout, the Python client gives up without a cancel and its backend keeps
waiting, a cancel ends the wait with the claim committed (lost to a client that gave up,
returned with a WARNING to one that still reads).

Rules: ``synchronous_standby_names`` is server-wide: set with ALTER SYSTEM inside
:func:`absent_sync_standby` only and reset on the way out. The setting reaches commits
asynchronously after ``pg_reload_conf()``, so each change is proven by a probe commit, never
by a sleep. Each pytest-xdist worker has a server of its own and runs one file at a time
(``--dist loadfile``), so no other test's commits wait meanwhile.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from allocator.client import PostgresClaimer
from allocator.core.errors import DatabaseUnavailableError
from tests.fixtures.pg import consumer_login, cut, take_fence

pytestmark = pytest.mark.integration

STANDBY = "allocator_test_absent_standby"
APP = "allocator-test-syncrep"
STATEMENT_TIMEOUT_MS = 100
DEADLINE_S = 15.0
FIRST = 1 << 22
SIZE = 16
CLAIM = "SELECT first_id, last_id FROM allocator.claim_blocks(%s, 1)"


def _waiting_on_sync_rep(admin: psycopg.Connection[tuple[object, ...]], pid: int) -> bool:
    row = admin.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return row == ("SyncRep",)


def _until(predicate: object, what: str) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"not within {DEADLINE_S:g} s: {what}"
        time.sleep(0.01)


def _commit_waits(url: str) -> bool:
    """Whether a commit waits for a synchronous standby now: a probe commits a transaction
    that wrote WAL (one with only an ID would not wait); True once its backend waits on
    SyncRep (it is then cancelled: committed locally, which harms nothing), False when it
    commits at once."""
    with (
        psycopg.connect(url, autocommit=True) as probe,
        psycopg.connect(url, autocommit=True) as admin,
    ):
        pid = probe.info.backend_pid
        probe.pgconn.send_query(b"SELECT pg_logical_emit_message(true, 'allocator-test', '')")
        while probe.pgconn.flush() != 0:
            time.sleep(0.01)
        deadline = time.monotonic() + DEADLINE_S
        while True:
            probe.pgconn.consume_input()
            if not probe.pgconn.is_busy():
                waited = False
                break
            if _waiting_on_sync_rep(admin, pid):
                admin.execute("SELECT pg_cancel_backend(%s)", (pid,))
                waited = True
                break
            assert time.monotonic() < deadline, "the probe commit neither ended nor waited"
            time.sleep(0.01)
        while probe.pgconn.get_result() is not None:
            pass
        return waited


@contextlib.contextmanager
def absent_sync_standby(url: str) -> Iterator[None]:
    """Every commit on the server waits for a standby that does not exist, meanwhile."""

    def configure(statement: sql.Composed, waits: bool) -> None:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(statement)
            admin.execute("SELECT pg_reload_conf()")
        _until(lambda: _commit_waits(url) is waits, f"commits wait: {waits}")

    try:  # reset even when the setting never took: a waiting teardown would hang
        configure(
            sql.SQL("ALTER SYSTEM SET synchronous_standby_names = {}").format(sql.Literal(STANDBY)),
            True,
        )
        yield
    finally:
        configure(sql.SQL("ALTER SYSTEM RESET synchronous_standby_names").format(), False)


def claimed(url: str, consumer: str) -> int:
    with psycopg.connect(url, autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(*) FROM allocator.block_ledger WHERE claimed_by = %s", (consumer,)
        ).fetchone()
    assert row is not None
    return int(str(row[0]))


def test_a_claim_waits_for_an_absent_synchronous_standby(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as admin:
        take_fence(admin, 2)
        cut(admin, 2, [(FIRST + i * SIZE, FIRST + (i + 1) * SIZE - 1) for i in range(4)])
    with (
        consumer_login(db_url, "t_syncrep") as app_url,
        psycopg.connect(db_url, autocommit=True) as admin,
    ):
        claimer = PostgresClaimer(
            app_url, statement_timeout_ms=STATEMENT_TIMEOUT_MS, application_name=APP
        )
        claimer.claim("warm-up", 1)  # opens the connection, learns the claim function
        try:
            with absent_sync_standby(db_url):
                assert claimer.begin("abandoned", 1)
                row = admin.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (APP,)
                ).fetchone()
                assert row is not None
                pid = int(str(row[0]))
                # The commit waits on the standby ten times the claim's statement_timeout
                # after the claim statement began: the timeout does not cover the wait.
                _until(
                    lambda: (
                        admin.execute(
                            "SELECT wait_event = 'SyncRep' AND now() - query_start > %s"
                            " FROM pg_stat_activity WHERE pid = %s",
                            (f"{10 * STATEMENT_TIMEOUT_MS} ms", pid),
                        ).fetchone()
                        == (True,)
                    ),
                    "the claim's commit waits past its statement_timeout",
                )
                assert claimer.poll() is None  # no answer: the commit has not returned
                with pytest.raises(DatabaseUnavailableError, match="no answer from PostgreSQL"):
                    claimer.finish(0.05)  # the client gives up: closes, sends no cancel
                assert _waiting_on_sync_rep(admin, pid)  # the backend waits on, alone
                assert claimed(db_url, "abandoned") == 0  # not visible while it waits

                # Someone who cancels a waiting claim and still reads gets its rows, as a
                # success, with the WARNING that they are on the primary only.
                notices: list[str] = []
                answer: list[object] = []
                with psycopg.connect(app_url, autocommit=True) as plain:
                    plain.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
                    plain.execute(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
                    reader = threading.Thread(
                        target=lambda: answer.extend(plain.execute(CLAIM, ("cancelled",)))
                    )
                    reader.start()
                    plain_pid = plain.info.backend_pid
                    _until(lambda: _waiting_on_sync_rep(admin, plain_pid), "the plain claim")
                    admin.execute("SELECT pg_cancel_backend(%s)", (plain_pid,))
                    reader.join(DEADLINE_S)
                    assert not reader.is_alive()
                assert len(answer) == 1
                assert any("canceling wait for synchronous replication" in n for n in notices)

                # A cancel ends the abandoned claim's wait: it committed, for a client
                # that never saw it. Its IDs are lost, handed out to no one.
                admin.execute("SELECT pg_cancel_backend(%s)", (pid,))
                _until(lambda: not _waiting_on_sync_rep(admin, pid), "the abandoned claim")
                assert claimed(db_url, "abandoned") == 1
        finally:
            claimer.close()
