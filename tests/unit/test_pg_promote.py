"""Promoting the embedded standby waits out a restart instead of failing on its first refusal.

Rules: ``_query_one`` is replaced; no server runs. The refusal is the one the chaos failover
test met: the standby restarting every process after its WAL receiver was killed.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from allocator.core.errors import LocalClusterError
from allocator.local import pg_sql

RESTARTING = psycopg.OperationalError(
    'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
    "FATAL:  the database system is in recovery mode"
)


def replies(monkeypatch: pytest.MonkeyPatch, *answers: Any) -> list[str]:
    """``_query_one`` answers (or raises) each of ``answers`` in turn; the queries it got."""
    queue, asked = list(answers), []

    def query_one(port: int, superuser: str, query: str, params: tuple[object, ...] = ()) -> Any:
        asked.append(query)
        answer = queue.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    monkeypatch.setattr(pg_sql, "_query_one", query_one)
    monkeypatch.setattr(pg_sql.time, "sleep", lambda _s: None)
    return asked


def test_a_restarting_standby_is_promoted_once_it_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = replies(monkeypatch, RESTARTING, RESTARTING, (True,))
    pg_sql.promote(5432, "postgres")
    assert len(asked) == 3


def test_a_standby_that_keeps_restarting_fails_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    replies(monkeypatch, RESTARTING, RESTARTING)
    with pytest.raises(LocalClusterError, match="could not promote the standby on port 5432"):
        pg_sql.promote(5432, "postgres", timeout_s=0)


def test_other_errors_fail_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = replies(monkeypatch, psycopg.OperationalError("connection refused"), (True,))
    with pytest.raises(LocalClusterError):
        pg_sql.promote(5432, "postgres")
    assert len(asked) == 1


def test_a_promotion_that_does_not_finish_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    replies(monkeypatch, (False,))
    with pytest.raises(LocalClusterError, match="did not finish its promotion"):
        pg_sql.promote(5432, "postgres")
