"""Today's schema in one file: ``migrations/schema.sql``, what ``allocator migrate`` leaves.

``python -m allocator.local.schema_snapshot`` (``make schema-snapshot``) migrates an empty
database of a throwaway PostgreSQL server from base to head and writes its dump there;
``tests/integration/test_schema_snapshot.py`` proves the file equal to the migrations.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import psycopg

from allocator.local import postgres, tcp_ports
from allocator.postgres import migrate

SNAPSHOT = migrate.MIGRATIONS_DIR / "schema.sql"
DUMP_OPTIONS = (
    "--exclude-schema=public",  # Alembic's version table; not --schema, which loses default ACLs
    "--inserts",  # the seed rows as plain SQL, loadable without psql
    "--no-tablespaces",
    "--no-table-access-method",
)
ROLES_BEGIN = "-- Roles (cluster-wide; created when missing, as the migrations do)"
ROLES_END = "-- End of roles"
LOAD_SETTINGS = """\
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SET check_function_bodies = false;
SET client_min_messages = warning;
SELECT pg_catalog.set_config('search_path', '', false);"""
START_TIMEOUT_S = 60.0

_SCHEMA_ROLES = """
SELECT DISTINCT r.rolname
  FROM pg_roles r
  JOIN (SELECT nspowner AS oid, nspacl AS acl FROM pg_namespace WHERE nspname = 'allocator'
        UNION ALL
        SELECT relowner, relacl FROM pg_class WHERE relnamespace = 'allocator'::regnamespace
        UNION ALL
        SELECT proowner, proacl FROM pg_proc WHERE pronamespace = 'allocator'::regnamespace
        UNION ALL
        SELECT defaclrole, defaclacl FROM pg_default_acl) o
    ON r.oid = o.oid OR r.oid IN (SELECT (aclexplode(o.acl)).grantee)
 WHERE NOT r.rolsuper
 ORDER BY 1
"""
_ROLE_ATTRIBUTES = """
SELECT rolname, rolsuper, rolinherit, rolcreaterole, rolcreatedb, rolcanlogin, rolreplication,
       rolbypassrls, rolconnlimit, pg_catalog.shobj_description(oid, 'pg_authid')
  FROM pg_roles WHERE rolname = ANY(%s) ORDER BY rolname
"""
_ROLE_MEMBERSHIPS = """
SELECT DISTINCT r.rolname, m.rolname, a.admin_option
  FROM pg_auth_members a
  JOIN pg_roles r ON r.oid = a.roleid
  JOIN pg_roles m ON m.oid = a.member
 WHERE m.rolname = ANY(%s)
 ORDER BY 1, 2
"""
_FLAGS = ("SUPERUSER", "INHERIT", "CREATEROLE", "CREATEDB", "LOGIN", "REPLICATION", "BYPASSRLS")


def pg_dump(bin_dir: Path, url: str) -> str:
    """The dump of the database at ``url`` (schema ``public`` left out) by the ``pg_dump`` in
    ``bin_dir``, without what depends on the server version (:func:`normalise`).

    Compare dumps made by the same ``pg_dump`` from the same server only: its output changes
    between PostgreSQL versions."""
    argv = [str(bin_dir / "pg_dump"), *DUMP_OPTIONS, "--dbname", migrate.libpq_url(url)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise migrate.MigrationError(f"pg_dump failed (exit {done.returncode}): {done.stderr}")
    return normalise(done.stdout)


def normalise(dump: str) -> str:
    """``dump`` without its banner, the versions that made it, ``\\restrict`` keys (a random
    key per run since PostgreSQL 15.14) and the session settings before the first object,
    which differ between versions (:data:`LOAD_SETTINGS` replaces them)."""
    body = dump[dump.index("--\n-- Name: ") :] if "--\n-- Name: " in dump else dump
    kept = [
        line
        for line in body.splitlines()
        if not line.startswith(("\\restrict ", "\\unrestrict ", "-- PostgreSQL database dump"))
    ]
    text = re.sub(r"\n{3,}", "\n\n\n", "\n".join(kept)).strip()
    while text.endswith("\n--"):  # what was left of the closing banner
        text = text[: -len("\n--")].rstrip()
    return text + "\n"


def roles_section(url: str) -> str:
    """SQL that creates every role the schema names (owner, grantees) as the database at
    ``url`` has it, and grants their memberships among themselves and in built-in roles."""
    with psycopg.connect(migrate.libpq_url(url)) as conn:
        names = [name for (name,) in conn.execute(_SCHEMA_ROLES)]
        attributes = conn.execute(_ROLE_ATTRIBUTES, (names,)).fetchall()
        memberships = conn.execute(_ROLE_MEMBERSHIPS, (names,)).fetchall()
    lines = [ROLES_BEGIN, "DO $roles$", "BEGIN"]
    comments = []
    for name, *flags, limit, comment in attributes:
        options = " ".join(f if on else f"NO{f}" for f, on in zip(_FLAGS, flags, strict=True))
        lines += [
            f"    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {_literal(name)}) THEN",
            f"        CREATE ROLE {_ident(name)} {options} CONNECTION LIMIT {limit};",
            "    END IF;",
        ]
        if comment is not None:
            comments.append(f"COMMENT ON ROLE {_ident(name)} IS {_literal(comment)};")
    lines += ["END", "$roles$;", ""]
    for role, member, admin in memberships:
        grant = f"GRANT {_ident(role)} TO {_ident(member)}"
        lines.append(f"{grant}{' WITH ADMIN OPTION' if admin else ''};")
    return "\n".join([*lines, *comments, ROLES_END]) + "\n"


def render(bin_dir: Path, url: str) -> str:
    """The whole snapshot of the migrated database at ``url``."""
    with psycopg.connect(migrate.libpq_url(url)) as conn:
        major = conn.info.server_version // 10000
    revision = migrate.current_revision(url)
    header = f"""\
-- migrations/schema.sql: the schema `allocator migrate` makes, at revision {revision}.
--
-- Generated: never edit it, and never apply it in place of the migrations (a database loaded
-- from it has no Alembic version; databases are made and changed by `allocator migrate`
-- alone, docs/sql.md). After adding a migration, regenerate it and commit both together:
--     make schema-snapshot        (python -m allocator.local.schema_snapshot)
-- That migrates an empty database of a throwaway PostgreSQL {major} server from base to head,
-- writes the roles the schema names (read from pg_roles), then
-- `pg_dump {" ".join(DUMP_OPTIONS)}`
-- without the dump's banner and session settings. tests/integration/test_schema_snapshot.py
-- loads this file into an empty database and proves both databases' dumps equal.
--
-- pg_dump's order: the schema, functions by name, tables, views and sequences, the rows the
-- migrations insert, constraints, indexes, triggers, then grants; each comment follows its
-- object.

"""
    return f"{header}{LOAD_SETTINGS}\n\n{roles_section(url)}\n\n{pg_dump(bin_dir, url)}"


def load(url: str, snapshot: str) -> None:
    """Run ``snapshot`` in the (empty) database at ``url``, in one transaction: for the test
    that proves it equal to the migrations, never for a database anyone uses."""
    with psycopg.connect(migrate.libpq_url(url)) as conn:
        conn.execute(snapshot)  # no parameters: the whole file as one simple query


@contextlib.contextmanager
def throwaway_server(bin_dir: Path) -> Iterator[str]:
    """A PostgreSQL server of ``bin_dir`` in a temporary folder, on a free loopback port,
    stopped by pid and deleted afterwards; yields the URL of its empty ``postgres``
    database."""
    user = postgres.server_user()
    with tempfile.TemporaryDirectory(prefix="allocator-schema-") as folder:
        state = Path(folder)
        state.chmod(0o755)  # the server's OS user must reach its data folder
        data = postgres.prepare_data_dir(state, user)
        postgres.initdb(bin_dir, state, data, user, user.name)
        port = tcp_ports.pick_free_ports(1)[0]
        daemon = postgres.start(bin_dir, state, data, port, user)
        try:
            postgres.wait_ready(daemon, port, user.name, time.monotonic() + START_TIMEOUT_S)
            yield postgres.database_url(user.name, port, "postgres")
        finally:
            postgres.stop(daemon.pid, list(daemon.argv))
            if (moved := postgres.relocated_data_dir(state)) is not None:
                shutil.rmtree(moved, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m allocator.local.schema_snapshot",
        description="Write migrations/schema.sql: the schema the migrations make.",
    )
    parser.add_argument("--output", type=Path, default=SNAPSHOT, help="default: %(default)s")
    parser.add_argument(
        "--pg-bin-dir",
        type=Path,
        help=f"the PostgreSQL binaries (default: ${postgres.BIN_DIR_ENV}, else the newest)",
    )
    args = parser.parse_args(argv)
    bin_dir = postgres.find_bin_dir(args.pg_bin_dir)
    with throwaway_server(bin_dir) as url:
        migrate.upgrade_to_head(url)
        args.output.write_text(render(bin_dir, url), encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _ident(name: str) -> str:
    plain = re.fullmatch(r"[a-z_][a-z0-9_]*", name)
    return name if plain else '"' + name.replace('"', '""') + '"'


if __name__ == "__main__":
    sys.exit(main())
