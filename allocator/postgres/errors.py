"""PostgreSQL driver errors translated into the project's own
(:mod:`allocator.core.errors`).

Shared by the node's store, the operator commands and the ID client
(:mod:`allocator.client`), so it imports only psycopg, psycopg_pool and
:mod:`allocator.core.errors`: the client-only install (without the ``node`` extra) imports
this module and must never pull in the node's dependencies (configuration, ZooKeeper,
Alembic).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import psycopg
from psycopg_pool import PoolClosed

from allocator.core.errors import (
    AllocatorError,
    BehindHighWaterError,
    ClockAheadError,
    DatabaseError,
    DatabaseLoginError,
    DatabaseUnavailableError,
    FencedError,
    InvalidBatchError,
    InvalidRequestError,
    LayoutMismatchError,
    StaleTakeoverError,
)

_BY_SQLSTATE: Mapping[str, type[AllocatorError]] = {
    FencedError.sqlstate: FencedError,
    StaleTakeoverError.sqlstate: StaleTakeoverError,
    BehindHighWaterError.sqlstate: BehindHighWaterError,
    InvalidBatchError.sqlstate: InvalidBatchError,
    LayoutMismatchError.sqlstate: LayoutMismatchError,
    ClockAheadError.sqlstate: ClockAheadError,
    InvalidRequestError.sqlstate: InvalidRequestError,
}
# Retryable server answers, and what they mean for whoever reads the log line.
_UNAVAILABLE: Mapping[str, str] = {
    "55P03": "timed out waiting for a lock (lock_timeout)",
    "57014": "statement cancelled (statement_timeout)",
    "25P03": "session ended: idle in transaction too long",
    "40001": "transaction rolled back by a serialization conflict",
    "40P01": "transaction rolled back by a deadlock",
    "57P01": "the server is shutting down",
    "57P02": "the server crashed",
    "57P03": "the server is not accepting connections yet",
    "53300": "the server has too many connections",
}
# The schema lacks an object this code calls: missing, older, or (after a contract) newer.
_SCHEMA_MISSING = frozenset({"3F000", "42P01", "42883"})
# invalid_password, invalid_authorization_specification: the server refused the login.
_LOGIN_REFUSED = frozenset({"28P01", "28000"})
# What libpq reports, without a SQLSTATE, when the server refuses a login while connecting.
_LOGIN_MESSAGES = re.compile(
    r"authentication failed|no password supplied|password is required|"
    r'role "[^"]*" does not exist|is not permitted to log in|no pg_hba\.conf entry|'
    r"pg_hba\.conf rejects connection"
)
_ROLE_IN_MESSAGE = re.compile(r'(?:user|role) "([^"]*)"')


def translate(exc: psycopg.Error, what: str) -> AllocatorError:
    """The project's error for a driver error raised while doing ``what``; callers chain it
    (``raise translate(exc, what) from exc``).

    - SQLSTATE AL100 → :class:`FencedError`, AL101 → :class:`StaleTakeoverError`, AL102 →
      :class:`BehindHighWaterError`, AL103 → :class:`InvalidBatchError` (a bug), AL104 →
      :class:`LayoutMismatchError`, AL105 → :class:`ClockAheadError`, AL106 →
      :class:`InvalidRequestError` (the project's SQLSTATEs: docs/design.md §6).
    - A login the server refuses (28P01 / 28000, or libpq's message for it on a failed
      connection: a wrong or missing password, a role that does not exist or may not log in,
      no ``pg_hba.conf`` entry) → :class:`DatabaseLoginError` (exit 78, naming the role).
    - Other connection failures, lock and statement timeouts, server shutdowns, deadlocks
      and serialization failures → :class:`DatabaseUnavailableError` (retryable; after a
      write the outcome is unknown, the commit may have happened).
    - A schema without an object this code calls → :class:`DatabaseError` naming
      ``allocator migrate --status``;
      anything else → :class:`DatabaseError`.
    """
    state = exc.sqlstate or ""
    if state in _BY_SQLSTATE:
        primary = exc.diag.message_primary or str(exc).strip().partition("\n")[0]
        return _BY_SQLSTATE[state](f"{what}: {primary}")
    if isinstance(exc, PoolClosed):
        return DatabaseError(f"{what}: the node's database pool is closed")
    if state in _UNAVAILABLE:
        return DatabaseUnavailableError(f"{what}: {_UNAVAILABLE[state]}")
    if state in _LOGIN_REFUSED or (
        not state and isinstance(exc, psycopg.OperationalError) and _LOGIN_MESSAGES.search(str(exc))
    ):
        role = _role_of(exc)
        who = f"role {role!r}" if role else "the configured role"
        return DatabaseLoginError(
            f"{what}: PostgreSQL refused the login of {who} (fix the user or password of "
            "the database URL, PGPASSWORD / PGPASSFILE, or the server's pg_hba.conf)",
            role=role,
        )
    if (not state and isinstance(exc, psycopg.OperationalError)) or state.startswith("08"):
        return DatabaseUnavailableError(f"{what}: PostgreSQL is unreachable")
    if state in _SCHEMA_MISSING:
        return DatabaseError(
            f"{what}: the database's schema lacks something this release calls "
            "(`allocator migrate --status` names its revision and whether this release can "
            "use it; docs/upgrades.md)"
        )
    return DatabaseError(f"{what} failed")


def _role_of(exc: psycopg.Error) -> str | None:
    """The role a refused login tried: libpq's own record of the attempt, else the name the
    server's message quotes."""
    pgconn = getattr(exc, "pgconn", None)
    user = getattr(pgconn, "user", None)
    if isinstance(user, bytes) and user:
        return user.decode("utf-8", errors="replace")
    found = _ROLE_IN_MESSAGE.search(str(exc))
    return found.group(1) if found else None


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Inside: a driver error leaves as the project's own (:func:`translate`)."""
    try:
        yield
    except psycopg.Error as exc:
        raise translate(exc, what) from exc
