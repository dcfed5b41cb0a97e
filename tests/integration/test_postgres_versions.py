"""Issue 25, item 4: the subset of the suite that runs on PostgreSQL 16 and 18 as well.

The whole suite runs on the session's server (Debian's PostgreSQL 15). Here each other
version (tests/fixtures/pg_versions.py: 16 and 18, or ``$ALLOCATOR_TEST_PG_BIN_DIRS``) gets a
throwaway server of its own, and on it:

- docs/deploy.md's superuser steps ("Roles and the database"), run as written with that
  version's psql, then ``allocator migrate`` as the guide's migration role (a member of
  ``allocator_owner``, no CREATEROLE): base to head, down to base and up again. The other
  tests' databases are copies of the database it migrated, so they see the roles and
  grants those steps made;
- tests of other modules, the same functions collected here a second time with this
  module's ``db_url``, ``empty_db_url``, ``second_empty_db_url`` and ``pg_bin_dir`` bound to
  the version's server: the migrations' upgrade and round trip (test_migrations.py),
  migrations/schema.sql against the version's own pg_dump (test_schema_snapshot.py), every
  role's rights and attributes and the refusals (test_privileges.py), claim_blocks' order
  and an empty pool's SQLSTATE (test_claim_sql.py), and a real node that leads, cuts and
  hands over with the session's ZooKeeper (test_node.py).

README.md, "Supported PostgreSQL versions", names this subset.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from allocator.core.exits import Exit
from allocator.local import postgres
from allocator.postgres import migrate
from tests import deploy_guide as guide
from tests.fixtures import pg
from tests.fixtures.pg_versions import PgServer
from tests.fuzz.clikit import clean_environment, invoke
from tests.integration import (
    test_claim_sql,
    test_migrations,
    test_node,
    test_privileges,
    test_schema_snapshot,
)

pytestmark = pytest.mark.integration

GUIDE_DATABASE = "allocator"
MIGRATOR = "allocator_migrator"
TEMPLATE = "allocator_guide_template"
ROLES_STEP = "CREATE ROLE allocator_owner NOLOGIN;"
"""What marks the guide's block of superuser steps."""


# -- the deploy guide's superuser steps, then its migration role ------------------------------


def superuser_steps() -> str:
    """docs/deploy.md's block that creates the roles and the database."""
    (block,) = (b for b in guide.blocks(guide.GUIDE.read_text()) if ROLES_STEP in b.text)
    return block.text


def run_superuser_steps(server: PgServer, secrets: Path) -> None:
    """The block with bash, ``sudo -u postgres psql`` being the version's psql as the
    server's superuser over loopback and ``/root/allocator-db`` a folder of the test's."""
    port = psycopg.conninfo.conninfo_to_dict(server.url)["port"]
    superuser = postgres.server_user().name
    psql = f"{server.bin_dir / 'psql'} -h 127.0.0.1 -p {port} -U {superuser} -d postgres"
    pairs = [("sudo -u postgres psql", psql), ("/root/allocator-db", str(secrets))]
    script = guide.substitute(superuser_steps(), pairs)
    done = subprocess.run(
        ["bash", "-c", f"set -eo pipefail\n{script}"],
        capture_output=True, text=True, check=False, timeout=60,
        env={"PATH": os.environ["PATH"], "LANG": "C.UTF-8"}, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, f"the guide's superuser steps failed:\n{done.stderr}"


def migrate_as(url: str, *args: str, expect: Exit = Exit.OK) -> str:
    """``allocator migrate ARGS`` in-process, the URL (password included) in its variable, as
    the guide gives it; its output."""
    with pytest.MonkeyPatch.context() as patch:
        clean_environment(patch)
        patch.setenv("ALLOCATOR_MIGRATE_DATABASE_URL", url)
        result = invoke(["migrate", *args])
    assert result.exit_code == expect, result.output
    return result.output


@pytest.fixture(scope="module")
def guide_database(pg_server: PgServer, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The guide's roles and database on the version's server, migrated to head by its
    migration role; that role's URL. A template copy is kept for the other tests."""
    secrets = tmp_path_factory.mktemp("allocator-db")
    run_superuser_steps(pg_server, secrets)
    password = (secrets / MIGRATOR).read_text().strip()
    url = pg.url_for_user(pg.url_for_database(pg_server.url, GUIDE_DATABASE), MIGRATOR)
    url = url.replace(f"//{MIGRATOR}@", f"//{MIGRATOR}:{password}@", 1)  # hex: URL-safe
    assert "schema upgraded from nothing to revision" in migrate_as(url)
    pg.create_database(pg_server.url, TEMPLATE, GUIDE_DATABASE)
    return url


def test_the_guide_s_migration_role_migrates_and_only_a_superuser_goes_down_to_base(
    guide_database: str, pg_server: PgServer
) -> None:
    """The guide's migration role owns the schema through allocator_owner, with no role
    attribute; ``--to base`` also drops the NOLOGIN roles, which only a superuser (or a
    CREATEROLE role holding them) may, so that role is refused in one line and nothing
    changes; as the superuser it runs, and the migration role brings the schema back."""
    head = migrate.head_revision()
    assert migrate.current_revision(guide_database) == head
    with psycopg.connect(guide_database) as conn:
        row = conn.execute(
            "SELECT current_user, r.rolsuper, r.rolcreaterole,"
            " pg_has_role(current_user, 'allocator_owner', 'USAGE'),"
            " pg_has_role('allocator_owner', 'pg_read_all_stats', 'USAGE'),"
            " current_setting('server_version_num')::int / 10000"
            " FROM pg_roles r WHERE r.rolname = current_user"
        ).fetchone()
    assert row == (MIGRATOR, False, False, True, True, pg_server.major)
    refused = migrate_as(guide_database, "--to", "base", "--yes", expect=Exit.FAILED)
    assert "permission denied to drop role" in refused
    assert migrate.current_revision(guide_database) == head  # one transaction: nothing done
    migrate_as(pg.url_for_database(pg_server.url, GUIDE_DATABASE), "--to", "base", "--yes")
    assert migrate.current_revision(guide_database) is None
    assert test_migrations.schema_objects(guide_database) == {
        "tables": set(),
        "views": set(),
        "functions": set(),
    }
    assert f"schema upgraded from nothing to revision {head}" in migrate_as(guide_database)
    assert test_migrations.schema_objects(guide_database) == {
        "tables": test_migrations.TABLES,
        "views": test_migrations.VIEWS,
        "functions": test_migrations.FUNCTIONS,
    }


# -- the session's database fixtures, on the version's server ----------------------------------


@pytest.fixture(scope="module")
def pg_bin_dir(pg_server: PgServer) -> Path:
    return pg_server.bin_dir


@pytest.fixture
def db_url(pg_server: PgServer, guide_database: str) -> Iterator[str]:
    """A superuser URL of a fresh copy of the database the guide's migration role migrated."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield pg.create_database(pg_server.url, name, TEMPLATE)
    pg.drop_database(pg_server.url, name)


@pytest.fixture
def empty_db_url(pg_server: PgServer, guide_database: str) -> Iterator[str]:
    name = f"e_{uuid.uuid4().hex[:12]}"
    yield pg.create_database(pg_server.url, name)
    pg.drop_database(pg_server.url, name)


@pytest.fixture
def second_empty_db_url(pg_server: PgServer, guide_database: str) -> Iterator[str]:
    name = f"e_{uuid.uuid4().hex[:12]}"
    yield pg.create_database(pg_server.url, name)
    pg.drop_database(pg_server.url, name)


# -- the tests run here too (the same functions, this module's fixtures) ---------------------

test_upgrade_creates_the_whole_schema = test_migrations.test_upgrade_creates_the_whole_schema
test_downgrade_to_base_then_upgrade_again_works = (
    test_migrations.test_downgrade_to_base_then_upgrade_again_works
)

test_a_database_loaded_from_the_snapshot_dumps_as_one_upgraded_from_base = (
    test_schema_snapshot.test_a_database_loaded_from_the_snapshot_dumps_as_one_upgraded_from_base
)
test_the_snapshot_creates_the_roles_the_schema_names_as_the_migrations_do = (
    test_schema_snapshot.test_the_snapshot_creates_the_roles_the_schema_names_as_the_migrations_do
)

admin = test_privileges.admin
login_roles = test_privileges.login_roles
login_as = test_privileges.login_as
stocked = test_privileges.stocked
test_each_role_holds_exactly_the_rights_the_table_lists = (
    test_privileges.test_each_role_holds_exactly_the_rights_the_table_lists
)
test_each_role_has_the_documented_attributes_and_memberships = (
    test_privileges.test_each_role_has_the_documented_attributes_and_memberships
)
test_the_owner_owns_the_schema_and_every_object_in_it = (
    test_privileges.test_the_owner_owns_the_schema_and_every_object_in_it
)
test_every_function_pins_its_search_path_and_the_definers_are_the_owners = (
    test_privileges.test_every_function_pins_its_search_path_and_the_definers_are_the_owners
)
test_the_consumer_claims_and_reads_pool_status_and_is_refused_the_rest = (
    test_privileges.test_the_consumer_claims_and_reads_pool_status_and_is_refused_the_rest
)
test_the_node_writes_only_through_the_fenced_functions = (
    test_privileges.test_the_node_writes_only_through_the_fenced_functions
)
test_the_operator_reads_and_runs_the_audited_commands_only = (
    test_privileges.test_the_operator_reads_and_runs_the_audited_commands_only
)
test_a_migration_role_that_cannot_own_the_schema_gets_a_one_line_error = (
    test_privileges.test_a_migration_role_that_cannot_own_the_schema_gets_a_one_line_error
)

conn = test_claim_sql.conn
test_claims_hand_out_the_oldest_blocks_first_in_order = (
    test_claim_sql.test_claims_hand_out_the_oldest_blocks_first_in_order
)
test_empty_pool_raises_al003_without_waiting = (
    test_claim_sql.test_empty_pool_raises_al003_without_waiting
)

test_one_leader_fills_the_pool_and_hands_over_on_shutdown = (
    test_node.test_one_leader_fills_the_pool_and_hands_over_on_shutdown
)
