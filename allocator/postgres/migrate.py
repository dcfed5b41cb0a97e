"""Schema migrations: Alembic driven from code, PL/pgSQL kept in ``migrations/sql``.

:func:`migrate_to` (and its :func:`upgrade_to_head` / :func:`downgrade_to_base`) is the
entry point the rest of the project uses (``allocator migrate``, the local cluster manager,
test fixtures); every run holds :data:`MIGRATION_LOCK`, so two runs take turns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psycopg
from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from psycopg import sql
from sqlalchemy import Engine, create_engine, pool
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from allocator.core.errors import (
    AllocatorError,
    DatabaseUnavailableError,
    MigrationLockTimeoutError,
)
from allocator.postgres import compat
from allocator.postgres import sql as sql_text
from allocator.postgres.errors import translate

# The repository's migrations/ folder, installed as the package ``allocator.migrations``.
_PACKAGE = Path(__file__).resolve().parents[1]  # allocator/
MIGRATIONS_DIR = _PACKAGE.parent / "migrations"
if not MIGRATIONS_DIR.is_dir():  # a plain install: the folder lives inside the package
    MIGRATIONS_DIR = _PACKAGE / "migrations"
SQL_DIR = MIGRATIONS_DIR / "sql"


class MigrationError(AllocatorError):
    """A migration could not be applied (the database says why)."""


URL_ATTRIBUTE = "allocator_database_url"
"""Where :func:`_alembic_config` hands the URL to ``migrations/env.py``."""


def libpq_url(url: str) -> str:
    """``postgresql+psycopg://…`` / ``postgres://…`` → ``postgresql://…`` for libpq."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    raise MigrationError(f"not a PostgreSQL URL: {url.split('@')[-1]!r}")


def engine(url: str) -> Engine:
    """A SQLAlchemy engine whose connections libpq opens from ``url`` (no pooling).

    Database URLs are plain libpq ``postgresql://`` URLs everywhere in the project,
    multi-host ones included: libpq opens the connection and SQLAlchemy never parses the URL
    (it takes one host only).
    """
    conninfo = libpq_url(url)
    return create_engine(
        "postgresql+psycopg://",
        creator=lambda: psycopg.connect(conninfo),
        poolclass=pool.NullPool,
    )


def _alembic_config(url: str) -> AlembicConfig:
    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise MigrationError(f"migrations folder not found at {MIGRATIONS_DIR}")
    config = AlembicConfig()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes[URL_ATTRIBUTE] = libpq_url(url)
    return config


MIGRATION_LOCK = (1095520067, 1)
"""The session-level advisory lock every migration run holds (``pg_advisory_lock(int, int)``:
"ALOC" and 1), so two runs on one database take turns; ``claim_blocks`` holds (…, 4)."""
DEFAULT_LOCK_TIMEOUT_S = 60.0
LOCK_APPLICATION_NAME = "allocator-migrate"


def upgrade_to_head(url: str, lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> None:
    """Bring the database at ``url`` to the newest schema (idempotent)."""
    migrate_to(url, "head", lock_timeout_s)


def downgrade_to_base(url: str, lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> None:
    """Remove the whole allocator schema (roles are kept while other databases use them)."""
    migrate_to(url, "base", lock_timeout_s)


def known_revisions() -> list[str]:
    """Every revision the code knows, oldest first."""
    script = ScriptDirectory(str(MIGRATIONS_DIR))
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def migrate_to(
    url: str, target: str, lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S
) -> tuple[str | None, str | None]:
    """Move the schema to ``target`` (``head``, ``base`` or a known revision), up or down,
    holding :data:`MIGRATION_LOCK`; returns the revisions before and after.

    A database at a revision this code does not know (a newer release migrated it) is left
    alone for ``head`` and refused otherwise (:class:`MigrationError`).
    """
    known = known_revisions()
    if target not in ("head", "base", *known):
        raise MigrationError(
            f"unknown revision {target!r}: head, base or one of {', '.join(known)}"
        )
    with migration_lock(url, lock_timeout_s):
        before = current_revision(url)
        if before is not None and before not in known:
            if target == "head":
                return before, before
            raise MigrationError(
                f"the database is at revision {before}, which this release does not know "
                f"(it knows {known[0]} to {known[-1]}): migrate it with a release that knows it"
            )
        down = target == "base" or (
            target not in ("head", before)
            and before is not None
            and known.index(target) < known.index(before)
        )
        config = _alembic_config(url)
        if down:
            _run(lambda: command.downgrade(config, target), "downgrade")
        else:
            _run(lambda: command.upgrade(config, target), "upgrade")
        return before, current_revision(url)


@contextmanager
def migration_lock(url: str, timeout_s: float) -> Iterator[None]:
    """Hold :data:`MIGRATION_LOCK` on a connection of its own for the block; wait for it at
    most ``timeout_s`` (then :class:`MigrationLockTimeoutError`, naming the holder)."""
    what = "take the migration lock"
    try:
        conn = psycopg.connect(
            libpq_url(url), autocommit=True, application_name=LOCK_APPLICATION_NAME
        )
    except psycopg.Error as exc:
        raise _failure(exc, what) from exc
    with conn:
        try:
            conn.execute(
                "SELECT set_config('lock_timeout', %s, false)",
                (str(max(1, round(timeout_s * 1000))),),
            )
            conn.execute("SELECT pg_advisory_lock(%s, %s)", MIGRATION_LOCK)
        except psycopg.errors.LockNotAvailable as exc:
            raise MigrationLockTimeoutError(
                f"another migration has held the migration lock for over {timeout_s:g} s "
                f"(--lock-timeout; held by {_holder(conn)}): retry once it is done"
            ) from exc
        except psycopg.Error as exc:
            raise _failure(exc, what) from exc
        try:
            yield
        finally:
            with suppress(psycopg.Error):  # a lost connection released it already
                conn.execute("SELECT pg_advisory_unlock(%s, %s)", MIGRATION_LOCK)


def _holder(conn: psycopg.Connection[Any]) -> str:
    """Who holds :data:`MIGRATION_LOCK`, as ``pg_locks`` and ``pg_stat_activity`` show it."""
    try:
        row = conn.execute(
            "SELECT l.pid, a.application_name, a.usename, a.client_addr::text"
            " FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE l.locktype = 'advisory' AND l.granted"
            " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND l.classid = %s::oid AND l.objid = %s::oid AND l.objsubid = 2",
            MIGRATION_LOCK,
        ).fetchone()
    except psycopg.Error:
        return "a session this role cannot see"
    if row is None:
        return "a session that has since let it go"
    pid, application, user, address = row
    return (
        f"pid {pid}, application_name {application or '(not visible to this role)'!r}, "
        f"user {user or '?'}, from {address or 'a local socket'}"
    )


def current_revision(url: str) -> str | None:
    """The revision the database is at, or None when it was never migrated."""
    reader = engine(url)
    try:
        with reader.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    except SQLAlchemyError as exc:
        raise _failure(_driver_error(exc), "read the schema version") from _driver_error(exc)
    finally:
        reader.dispose()


def read_stamp(url: str) -> compat.SchemaStamp:
    """The database's revision and compatibility marker, as a node reads them."""
    what = "read the schema version"
    try:
        with psycopg.connect(libpq_url(url)) as conn:
            present, comment = conn.execute(sql_text.VERSION_TABLE).fetchone() or (False, None)
            rows = conn.execute(sql_text.SCHEMA_REVISION).fetchall() if present else []
    except psycopg.Error as exc:
        raise _failure(exc, what) from exc
    return compat.SchemaStamp(str(rows[0][0]) if rows else None, compat.read_marker(comment))


def head_revision() -> str:
    """The newest revision the code knows."""
    script = ScriptDirectory(str(MIGRATIONS_DIR))
    head = script.get_current_head()
    if head is None:
        raise MigrationError("no migrations found")
    return head


def run_sql_file(relative_path: str) -> None:
    """Execute ``migrations/sql/<relative_path>`` inside the running migration's
    transaction.

    The whole file goes to the driver without bind-parameter parsing (PL/pgSQL uses ``:=``
    and ``%``).
    """
    from alembic import op

    sql = (SQL_DIR / relative_path).read_text(encoding="utf-8")
    driver_connection = op.get_bind().connection.driver_connection
    if driver_connection is None:
        raise MigrationError("the migration has no open database connection")
    driver_connection.execute(sql)  # no parameters: psycopg sends the file as one query


READERS = ("allocator_node", "allocator_operator")
"""The roles ``allocator migrate`` lets read Alembic's version table (nodes check the schema
revision at start and on each reconnect; docs/upgrades.md)."""


def before_migrations(connection: psycopg.Connection[Any], destination: object) -> None:
    """In the migration's transaction, before it runs (``migrations/env.py``; ``destination``
    is Alembic's revision argument, None for ``base``): a run down to ``base`` first revokes
    what :func:`after_migrations` granted, so that migration 0001's downgrade can drop the
    group roles."""
    if destination not in (None, "base") or not _version_table_exists(connection):
        return
    for role in _existing(connection, READERS):
        connection.execute(
            sql.SQL("REVOKE ALL ON public.alembic_version FROM {}").format(sql.Identifier(role))
        )


def after_migrations(connection: psycopg.Connection[Any]) -> None:
    """In the migration's transaction, after it ran (``migrations/env.py``): the node and
    operator roles may read the revision, and the version table's comment carries the
    compatibility marker of the revision reached (:func:`allocator.postgres.compat.marker`).
    Each is written only when it changes, so a re-run needs no ownership of the table."""
    if not _version_table_exists(connection):
        return
    row = connection.execute("SELECT max(version_num) FROM public.alembic_version").fetchone()
    revision = None if row is None or row[0] is None else str(row[0])
    if revision is not None:
        for role in _existing(connection, READERS):
            granted = connection.execute(
                "SELECT has_table_privilege(%s, 'public.alembic_version', 'SELECT')", (role,)
            ).fetchone()
            if not (granted and granted[0]):
                connection.execute(
                    sql.SQL("GRANT SELECT ON public.alembic_version TO {}").format(
                        sql.Identifier(role)
                    )
                )
    wanted = compat.marker(revision)
    current = connection.execute(
        "SELECT obj_description('public.alembic_version'::regclass, 'pg_class')"
    ).fetchone()
    if (current[0] if current else None) != wanted:
        connection.execute(
            sql.SQL("COMMENT ON TABLE public.alembic_version IS {}").format(sql.Literal(wanted))
        )


def _version_table_exists(connection: psycopg.Connection[Any]) -> bool:
    row = connection.execute("SELECT to_regclass('public.alembic_version') IS NOT NULL").fetchone()
    return bool(row and row[0])


def _existing(connection: psycopg.Connection[Any], roles: tuple[str, ...]) -> list[str]:
    rows = connection.execute(
        "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s) ORDER BY rolname", (list(roles),)
    ).fetchall()
    return [str(name) for (name,) in rows]


def _run(action: Callable[[], None], what: str) -> None:
    try:
        action()
    except SQLAlchemyError as exc:
        raise _failure(_driver_error(exc), f"schema {what}") from _driver_error(exc)
    except psycopg.Error as exc:  # a version's SQL file, run on the driver connection
        raise _failure(exc, f"schema {what}") from exc


def _failure(cause: BaseException, what: str) -> AllocatorError:
    """What a failed step raises: an unreachable database or a refused login as every
    command gives it (:func:`allocator.postgres.errors.translate`: exit 75, or 78 naming
    the role); anything else a :class:`MigrationError` with the database's reason as its
    cause.
    """
    if isinstance(cause, psycopg.Error):
        translated = translate(cause, what)
        if isinstance(translated, DatabaseUnavailableError):
            return translated
    return MigrationError(f"{what} failed")


def _driver_error(exc: SQLAlchemyError) -> BaseException:
    """The psycopg error under SQLAlchemy's wrapper, whose message is the useful one."""
    if isinstance(exc, DBAPIError) and isinstance(exc.orig, BaseException):
        return exc.orig
    return exc
