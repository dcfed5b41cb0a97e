"""Schema migrations: Alembic driven from code, PL/pgSQL kept in ``migrations/sql``.

:func:`upgrade_to_head` / :func:`downgrade_to_base` are the only entry points the rest of
the project uses (``allocator migrate``, the local cluster manager, test fixtures).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psycopg
from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, pool
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from allocator.core.errors import AllocatorError, DatabaseUnavailableError
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


def upgrade_to_head(url: str) -> None:
    """Bring the database at ``url`` to the newest schema (idempotent)."""
    _run(lambda: command.upgrade(_alembic_config(url), "head"), "upgrade")


def downgrade_to_base(url: str) -> None:
    """Remove the whole allocator schema (roles are kept while other databases use them)."""
    _run(lambda: command.downgrade(_alembic_config(url), "base"), "downgrade")


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
