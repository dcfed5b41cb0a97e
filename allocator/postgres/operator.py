"""Operators' and status commands' calls to PostgreSQL, each on a short-lived connection of
its own, errors translated.

Any URL works that logs in with the operator or node role; the audited operator functions
run as whoever it logs in as. :func:`read_status` reads one consistent snapshot (REPEATABLE
READ).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg import IsolationLevel
from psycopg.rows import TupleRow, class_row

from allocator.core.errors import DatabaseError
from allocator.core.records import BlockAgeStatus, PoolStatus, Rebase, Replication, TermRecord
from allocator.fence.report import REBASE_HISTORY_LIMIT, RebaseRecord
from allocator.postgres import sql
from allocator.postgres.errors import translate, translated

STATUS_APPLICATION_NAME = "allocator-status"
STATUS_CONNECT_TIMEOUT_S = 5.0
STATUS_STATEMENT_TIMEOUT_MS = 5000
STATUS_HISTORY_LIMIT = 10
MAX_BIGINT = (1 << 63) - 1

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Reset:
    """What ``allocator.reset_after_restore`` did."""

    voided_blocks: int
    old_high_water_id: int
    new_high_water_id: int
    old_generation: int
    old_epoch: int
    new_generation: int


def _one_row(
    url: str, what: str, query: str, params: Mapping[str, Any], kind: type[_T], timeout_s: float
) -> _T:
    """One statement on a connection of its own (operator and diagnostic commands)."""
    with translated(what):
        conn = psycopg.connect(
            url,
            autocommit=True,
            connect_timeout=max(2, math.ceil(timeout_s)),
            application_name=STATUS_APPLICATION_NAME,
        )
        with conn, conn.cursor(row_factory=class_row(kind)) as cursor:
            row = cursor.execute(query, params).fetchone()
    if row is None:
        raise DatabaseError(f"{what}: the database returned no row")
    return row


def rebase_fence(
    url: str, reason: str, *, connect_timeout_s: float = STATUS_CONNECT_TIMEOUT_S
) -> Rebase:
    """Run ``allocator.rebase_fence`` as whoever ``url`` logs in as (the operator role)."""
    return _one_row(
        url, "re-base the fence", sql.REBASE_FENCE, {"reason": reason}, Rebase, connect_timeout_s
    )


def reset_after_restore(
    url: str,
    reason: str,
    min_high_water_id: int,
    max_ahead_ms: int,
    *,
    connect_timeout_s: float = STATUS_CONNECT_TIMEOUT_S,
) -> Reset:
    """Run ``allocator.reset_after_restore`` as whoever ``url`` logs in as (operator role)."""
    params = {
        "reason": reason,
        "min_high_water_id": min_high_water_id,
        "max_ahead_ms": max_ahead_ms,
    }
    return _one_row(
        url,
        "reset the pool after a restore",
        sql.RESET_AFTER_RESTORE,
        params,
        Reset,
        connect_timeout_s,
    )


def read_replication(
    url: str, *, connect_timeout_s: float = STATUS_CONNECT_TIMEOUT_S
) -> Replication:
    """How the database at ``url`` replicates, as whoever ``url`` logs in as (node/operator)."""
    return _one_row(
        url,
        "read the replication status",
        sql.REPLICATION_STATUS,
        {},
        Replication,
        connect_timeout_s,
    )


def read_pool_status(
    url: str, *, connect_timeout_s: float = STATUS_CONNECT_TIMEOUT_S
) -> PoolStatus:
    """``allocator.pool_status`` at ``url`` (every role may read it)."""
    return _one_row(url, "read the pool status", sql.POOL_STATUS, {}, PoolStatus, connect_timeout_s)


def read_status(
    url: str,
    *,
    history_limit: int = STATUS_HISTORY_LIMIT,
    connect_timeout_s: float = STATUS_CONNECT_TIMEOUT_S,
    statement_timeout_ms: int = STATUS_STATEMENT_TIMEOUT_MS,
) -> tuple[PoolStatus, list[TermRecord]]:
    """The pool status and the latest terms, for ``allocator status``, from any URL.

    One plain connection, opened and closed here; both reads come from one read-only
    REPEATABLE READ transaction, so they describe the same moment.
    """
    what = "read the allocator status"
    with translated(what):
        conn = psycopg.connect(
            url,
            connect_timeout=max(2, math.ceil(connect_timeout_s)),
            application_name=STATUS_APPLICATION_NAME,
        )
        with conn:
            conn.isolation_level = IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            with conn.transaction():
                conn.execute(
                    sql.SET_LOCAL_STATEMENT_TIMEOUT,
                    {"statement_timeout": str(statement_timeout_ms)},
                )
                with conn.cursor(row_factory=class_row(PoolStatus)) as cursor:
                    status = cursor.execute(sql.POOL_STATUS).fetchone()
                with conn.cursor(row_factory=class_row(TermRecord)) as cursor:
                    terms = cursor.execute(sql.LEADER_HISTORY, {"limit": history_limit}).fetchall()
    if status is None:
        raise DatabaseError(f"{what}: the database returned no row")
    return status, terms


# -- pausing claims (operator role, migration 0010) ------------------------------------------


@dataclass(frozen=True, slots=True)
class Pause:
    """What ``allocator.pause_claims`` answered: the open pause."""

    pause_id: int
    paused_at: datetime
    paused_by: str
    reason: str
    already_paused: bool
    """Claims were paused before this call (nothing changed; the pause is the earlier one)."""


@dataclass(frozen=True, slots=True)
class Resume:
    """What ``allocator.resume_claims`` answered; all None but ``was_paused`` when claims
    were not paused."""

    pause_id: int | None
    paused_at: datetime | None
    paused_by: str | None
    reason: str | None
    resumed_at: datetime | None
    resumed_by: str | None
    resume_reason: str | None
    was_paused: bool


@dataclass(frozen=True, slots=True)
class OpenPause:
    """The open row of ``allocator.claim_pause_history``: why claims are paused."""

    pause_id: int
    paused_at: datetime
    paused_by: str
    reason: str


@dataclass(frozen=True, slots=True)
class ClaimInFlight:
    """A session whose open transaction holds a claim (``allocator.claims_in_flight()``)."""

    pid: int | None
    """None for a prepared transaction (two-phase commit): it holds the claim until
    ``COMMIT PREPARED`` or ``ROLLBACK PREPARED``."""
    virtualtransaction: str
    usename: str | None
    application_name: str | None
    client_addr: str | None
    state: str | None
    xact_start: datetime | None
    state_change: datetime | None

    def describe(self) -> str:
        """The session in one line for an error message: pid, user, application, client,
        state, since when.
        """
        since = self.xact_start.isoformat(timespec="seconds") if self.xact_start else "?"
        return (
            f"pid {self.pid} ({self.usename or '?'}, application "
            f"{self.application_name or '-'!r}, {self.client_addr or 'local'}, "
            f"{self.state or '?'}, transaction since {since})"
        )


@dataclass(frozen=True, slots=True)
class LayoutClock:
    """The recorded layout's epoch and timestamp shift, with the database clock."""

    epoch_ms: int
    shift: int
    db_ms: int

    def id_at(self, ms: int) -> int:
        """The last ID of millisecond ``ms`` (Unix), as ``reset_after_restore`` computes
        its clock bound; -1 before the layout's epoch."""
        if ms < self.epoch_ms:
            return -1
        return min(MAX_BIGINT, ((ms - self.epoch_ms + 1) << self.shift) - 1)


class OperatorSession:
    """One operator connection (autocommit: each call its own transaction), for commands
    that make several calls, such as ``allocator pool pause`` polling the claims in flight.
    Errors leave translated; build it with :func:`operator_session`."""

    def __init__(self, conn: psycopg.Connection[TupleRow]) -> None:
        self._conn = conn

    def _fetch(self, what: str, query: str, params: Mapping[str, Any], kind: type[_T]) -> list[_T]:
        with translated(what), self._conn.cursor(row_factory=class_row(kind)) as cursor:
            return cursor.execute(query, params).fetchall()

    def _one(self, what: str, query: str, params: Mapping[str, Any], kind: type[_T]) -> _T:
        rows = self._fetch(what, query, params, kind)
        if not rows:
            raise DatabaseError(f"{what}: the database returned no row")
        return rows[0]

    def pause_claims(self, reason: str) -> Pause:
        """Pause claims (audited, ``allocator.pause_claims``); committed at once."""
        return self._one("pause claims", sql.PAUSE_CLAIMS, {"reason": reason}, Pause)

    def resume_claims(self, reason: str) -> Resume:
        """Resume claims (audited); resuming claims that are not paused changes nothing."""
        return self._one("resume claims", sql.RESUME_CLAIMS, {"reason": reason}, Resume)

    def claims_in_flight(self) -> list[ClaimInFlight]:
        """The sessions holding a claim in an open transaction now
        (``allocator.claims_in_flight()``).
        """
        return self._fetch("list the claims in flight", sql.CLAIMS_IN_FLIGHT, {}, ClaimInFlight)

    def open_pause(self) -> OpenPause | None:
        """The pause in force, or None when claims are not paused."""
        rows = self._fetch("read the open pause", sql.OPEN_PAUSE, {}, OpenPause)
        return rows[0] if rows else None

    def pool_status(self) -> PoolStatus:
        """The one row of ``allocator.pool_status``."""
        return self._one("read the pool status", sql.POOL_STATUS, {}, PoolStatus)

    def block_age_status(self) -> BlockAgeStatus:
        """``allocator.block_age_status`` (migration 0011; every role may read it)."""
        return self._one("read the block age status", sql.BLOCK_AGE_STATUS, {}, BlockAgeStatus)

    def layout_clock(self) -> LayoutClock | None:
        """None before the first takeover recorded a layout."""
        rows = self._fetch("read the layout and clock", sql.LAYOUT_AND_CLOCK, {}, LayoutClock)
        return rows[0] if rows else None


@contextmanager
def operator_session(
    url: str, *, connect_timeout_s: float = STATUS_CONNECT_TIMEOUT_S
) -> Iterator[OperatorSession]:
    """An :class:`OperatorSession` on ``url``, closed on leaving."""
    with translated("connect to the database"):
        conn = psycopg.connect(
            url,
            autocommit=True,
            connect_timeout=max(2, math.ceil(connect_timeout_s)),
            application_name=STATUS_APPLICATION_NAME,
        )
    with conn:
        yield OperatorSession(conn)


def read_rebases(
    url: str,
    limit: int = REBASE_HISTORY_LIMIT,
    *,
    connect_timeout_s: float = STATUS_CONNECT_TIMEOUT_S,
    statement_timeout_ms: int = STATUS_STATEMENT_TIMEOUT_MS,
) -> list[RebaseRecord] | None:
    """The latest ``limit`` re-bases, newest first; None when the role may not read them
    (``fence_history`` is for the node and operator roles; a consumer still gets a status)."""
    what = "read the fence history"
    try:
        with psycopg.connect(
            url,
            connect_timeout=max(2, math.ceil(connect_timeout_s)),
            application_name=STATUS_APPLICATION_NAME,
        ) as conn:
            conn.read_only = True
            with conn.transaction():
                conn.execute(
                    sql.SET_LOCAL_STATEMENT_TIMEOUT,
                    {"statement_timeout": str(statement_timeout_ms)},
                )
                with conn.cursor(row_factory=class_row(RebaseRecord)) as cursor:
                    return cursor.execute(sql.FENCE_HISTORY, {"limit": limit}).fetchall()
    except psycopg.errors.InsufficientPrivilege:
        return None
    except psycopg.Error as exc:
        raise translate(exc, what) from exc
