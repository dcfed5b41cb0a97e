"""``migrations/schema.sql`` is what the migrations make (issue 23).

A database upgraded from base and one loaded from the file are dumped by the same
``pg_dump`` from the same server and compared, so the test holds on every PostgreSQL version
the suite runs on (the file is made by one, its dump's text differs between versions); the
roles, which are the cluster's and not the database's, are compared as the file writes them.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from allocator.local import schema_snapshot
from allocator.postgres import migrate

pytestmark = pytest.mark.integration

REGENERATE = (
    "migrations/schema.sql is not what the migrations make: run `make schema-snapshot` and "
    "commit the file with the migration (never edit it by hand)"
)


def stale(what: str, found: str, expected: str) -> str:
    """The failure message: what to do, then a unified diff from the migrations' schema to
    the file's."""
    diff = difflib.unified_diff(
        expected.splitlines(),
        found.splitlines(),
        fromfile="upgraded from base",
        tofile=what,
        lineterm="",
        n=2,
    )
    return f"{REGENERATE}\n" + "\n".join(diff)


def roles_of(snapshot: str) -> str:
    """The file's roles section, as :func:`schema_snapshot.roles_section` writes it."""
    start = snapshot.index(schema_snapshot.ROLES_BEGIN)
    end = snapshot.index(schema_snapshot.ROLES_END, start) + len(schema_snapshot.ROLES_END)
    return snapshot[start:end] + "\n"


def test_a_database_loaded_from_the_snapshot_dumps_as_one_upgraded_from_base(
    empty_db_url: str, second_empty_db_url: str, pg_bin_dir: Path
) -> None:
    migrate.upgrade_to_head(empty_db_url)
    schema_snapshot.load(second_empty_db_url, schema_snapshot.SNAPSHOT.read_text("utf-8"))
    upgraded = schema_snapshot.pg_dump(pg_bin_dir, empty_db_url)  # the server's own pg_dump
    loaded = schema_snapshot.pg_dump(pg_bin_dir, second_empty_db_url)
    assert loaded == upgraded, stale("loaded from migrations/schema.sql", loaded, upgraded)


def test_the_snapshot_creates_the_roles_the_schema_names_as_the_migrations_do(
    empty_db_url: str,
) -> None:
    migrate.upgrade_to_head(empty_db_url)
    expected = schema_snapshot.roles_section(empty_db_url)
    found = roles_of(schema_snapshot.SNAPSHOT.read_text("utf-8"))
    assert found == expected, stale("roles in migrations/schema.sql", found, expected)
