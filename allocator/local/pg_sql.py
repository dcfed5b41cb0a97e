"""SQL against a running embedded PostgreSQL server, as its superuser over loopback.

Replication as the servers see it, promotion, and the setup ``up`` runs once a server
serves: the ``allocator`` database and the login roles.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from allocator.core import logs
from allocator.core.errors import LocalClusterError, ServerStartError
from allocator.local.pg_settings import STANDBY_NAME
from allocator.local.postgres import (
    CONNECT_TIMEOUT_S,
    DATABASE,
    READY_POLL_INTERVAL_S,
    database_url,
)

log = logs.get_logger(__name__)

PROMOTE_TIMEOUT_S = 60


def _query_one(port: int, superuser: str, query: str, params: tuple[object, ...] = ()) -> Any:
    """The first row of ``query`` on the server on ``port`` (superuser, ``postgres`` database,
    autocommit); raises ``psycopg.Error``."""
    url = database_url(superuser, port, "postgres")
    with psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
        return conn.execute(query, params).fetchone()


def in_recovery(port: int, superuser: str) -> bool | None:
    """``pg_is_in_recovery()`` of the server on ``port``; None if it does not answer."""
    try:
        row = _query_one(port, superuser, "SELECT pg_is_in_recovery()")
    except psycopg.Error:
        return None
    return bool(row[0]) if row else None


def sync_state(port: int, superuser: str) -> str | None:
    """How the primary on ``port`` sees its standby: ``sync``, ``async``, … or None."""
    try:
        row = _query_one(
            port,
            superuser,
            "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s"
            " AND state = 'streaming'",
            (STANDBY_NAME,),
        )
    except psycopg.Error:
        return None
    return str(row[0]) if row else None


def reload(port: int, superuser: str) -> None:
    """``pg_reload_conf()`` on the server on ``port`` (after
    :func:`~allocator.local.postgres.write_settings`)."""
    try:
        _query_one(port, superuser, "SELECT pg_reload_conf()")
    except psycopg.Error as exc:
        raise LocalClusterError(f"could not reload PostgreSQL on port {port}") from exc


def wait_synchronous(port: int, superuser: str, deadline: float) -> None:
    """Wait until the primary on ``port`` streams to its standby synchronously."""
    while (state := sync_state(port, superuser)) != "sync":
        if time.monotonic() >= deadline:
            raise ServerStartError(
                f"the standby did not stream synchronously from the primary on port {port} "
                f"by its deadline (sync_state {state!r}); see its postgres.log"
            )
        time.sleep(READY_POLL_INTERVAL_S)


def _not_accepting_yet(exc: psycopg.Error) -> bool:
    """The server refuses connections for now: starting up, or restarting after a crash of
    one of its processes (SQLSTATE 57P03, "the database system is in recovery mode")."""
    return exc.sqlstate == "57P03" or "the database system is" in str(exc)


def promote(port: int, superuser: str, timeout_s: float = PROMOTE_TIMEOUT_S) -> None:
    """Promote the standby on ``port`` (``pg_promote``, waiting until it accepts writes).

    A standby that is restarting (after a crash of its WAL receiver, say: PostgreSQL restarts
    every process then) refuses connections until it is consistent again; promotion waits
    for it, within ``timeout_s``, rather than fail on the first refusal."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            row = _query_one(port, superuser, "SELECT pg_promote(true, %s)", (PROMOTE_TIMEOUT_S,))
            break
        except psycopg.Error as exc:
            if _not_accepting_yet(exc) and time.monotonic() < deadline:
                time.sleep(READY_POLL_INTERVAL_S)
                continue
            raise LocalClusterError(f"could not promote the standby on port {port}") from exc
    if not row or not row[0]:
        raise LocalClusterError(
            f"the standby on port {port} did not finish its promotion within {PROMOTE_TIMEOUT_S} s"
        )


def ensure_database(port: int, superuser: str, database: str = DATABASE) -> None:
    """Create ``database`` if it does not exist."""
    url = database_url(superuser, port, "postgres")
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
            found = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (database,)
            ).fetchone()
            if found is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    except psycopg.Error as exc:
        raise LocalClusterError(f"could not create database {database!r} on port {port}") from exc


def ensure_login_roles(
    port: int, superuser: str, roles: Sequence[tuple[str, str]], database: str = DATABASE
) -> list[str]:
    """Create each ``(login, group)`` login role ``IN ROLE group`` (idempotent).

    A group that does not exist yet (the migrations create them) is skipped; returns the
    login roles that exist afterwards. Authentication is the server's: ``trust`` on loopback.
    """
    url = database_url(superuser, port, database)
    present: list[str] = []
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
            for login, group in roles:
                names = {
                    str(row[0])
                    for row in conn.execute(
                        "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", ([login, group],)
                    )
                }
                if group not in names:
                    log.info(
                        "login_role_skipped",
                        role=login,
                        group=group,
                        note="the group does not exist",
                    )
                    continue
                if login not in names:
                    with contextlib.suppress(psycopg.errors.DuplicateObject):  # a racing `up`
                        conn.execute(
                            sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
                                sql.Identifier(login), sql.Identifier(group)
                            )
                        )
                else:
                    conn.execute(
                        sql.SQL("GRANT {} TO {}").format(
                            sql.Identifier(group), sql.Identifier(login)
                        )
                    )
                present.append(login)
    except psycopg.Error as exc:
        raise LocalClusterError(f"could not create the login roles on port {port}") from exc
    return present
