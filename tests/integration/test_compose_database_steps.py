"""The compose kit's database steps against real servers: PostgreSQL 15 (the kit's image and
the session's binaries), 16 and 18 (tests/fixtures/pg_versions.py).

deploy/compose has no Docker engine here (``docker-compose config`` only validates it), so
the three steps the stack runs against its primary are run as the stack runs them, each on
a throwaway server of the version: ``postgres/primary-init.sh`` as the image's superuser
(with that version's psql, the secrets in a folder of the test's instead of /run/secrets),
``allocator migrate`` as ``allocator_migrator`` (the ``migrate`` service), then
``postgres/login-roles.sql`` twice (the ``db-roles`` service, at every ``up``). The login
roles must then be in their groups and the application's role allowed to claim.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from allocator.core.exits import Exit
from allocator.local import postgres
from allocator.postgres import migrate
from tests.fixtures import pg_versions
from tests.fixtures.pg import url_for_database, url_for_user
from tests.fixtures.pg_versions import PgServer
from tests.fuzz.clikit import clean_environment, invoke

pytestmark = pytest.mark.integration

KIT = Path(__file__).resolve().parents[2] / "deploy" / "compose" / "postgres"
SECRETS = ("replication_password", "migrator_password", "node_db_password", "app_db_password")
VERSIONS = [pg_versions.session_install(), *pg_versions.installs()]


@pytest.fixture(scope="module", params=VERSIONS, ids=pg_versions.label)
def kit_server(request: pytest.FixtureRequest) -> Iterator[PgServer]:
    with pg_versions.serve(request.param) as server:
        yield server


def run(server: PgServer, argv: list[str], stdin: str | None = None) -> None:
    """A step with the version's psql first on PATH and libpq aimed at the server."""
    port = psycopg.conninfo.conninfo_to_dict(server.url)["port"]
    env = {
        "PATH": f"{server.bin_dir}:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PGHOST": "127.0.0.1",
        "PGPORT": str(port),
        "POSTGRES_USER": postgres.server_user().name,
    }
    with psycopg.connect(server.url) as conn:
        (env["PGDATA"],) = conn.execute("SHOW data_directory").fetchone()  # type: ignore[misc]
    done = subprocess.run(
        argv, input=stdin, capture_output=True, text=True, env=env, check=False, timeout=60
    )
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stderr}"


def test_the_compose_kit_s_database_steps_work_and_may_be_repeated(
    kit_server: PgServer, tmp_path: Path
) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    for name in SECRETS:
        (secrets / name).write_text(f"{name}-of-the-test\n")
    migrator = url_for_user(url_for_database(kit_server.url, "allocator"), "allocator_migrator")
    migrator = migrator.replace("//allocator_migrator@", "//allocator_migrator:x@", 1)
    (secrets / "migrate_database_url").write_text(migrator)

    def kit_file(name: str) -> str:
        return (KIT / name).read_text().replace("/run/secrets", str(secrets))

    run(kit_server, ["sh", "-c", kit_file("primary-init.sh")])
    with pytest.MonkeyPatch.context() as patch:
        clean_environment(patch)
        result = invoke(["migrate", "--database-url-file", str(secrets / "migrate_database_url")])
    assert result.exit_code == Exit.OK, result.output
    assert migrate.current_revision(migrator) == migrate.head_revision()
    psql = ["psql", "--set=ON_ERROR_STOP=1", "--no-psqlrc", "--quiet", f"--dbname={migrator}"]
    for _ in range(2):  # at every `up`
        run(kit_server, psql, stdin=kit_file("login-roles.sql"))
    with psycopg.connect(url_for_database(kit_server.url, "allocator")) as conn:
        row = conn.execute(
            "SELECT pg_has_role('allocator_node_login', 'allocator_node', 'USAGE'),"
            " pg_has_role('allocator_app', 'allocator_consumer', 'USAGE'),"
            " pg_has_role('allocator_app', 'allocator_node', 'USAGE'),"
            " has_function_privilege('allocator_app', 'allocator.claim_blocks(text, integer)',"
            "  'EXECUTE'),"
            " pg_has_role('allocator_migrator', 'allocator_owner', 'USAGE'),"
            " pg_has_role('allocator_owner', 'pg_read_all_stats', 'USAGE'),"
            " current_setting('server_version_num')::int / 10000"
        ).fetchone()
    assert row == (True, True, False, True, True, True, kit_server.major)
