"""``allocator migrate`` as an operator runs it (issue 25, item 2): ``--to`` any known
revision (down only with ``--yes``), ``--status``, the migration lock that keeps two runs
apart, and a node that refuses a schema outside its window (exit 78).

The one-shot commands run in-process (click's ``CliRunner``); the concurrent migrations run
as two ``allocator`` processes against one database, held at the lock by the test until
both wait for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql as pgsql

from allocator.core.exits import Exit
from allocator.local.info import ClusterInfo
from allocator.postgres import compat, migrate
from tests.fixtures.pg import url_for_user
from tests.fuzz.clikit import clean_environment, invoke
from tests.integration.test_migrations import FUNCTIONS, TABLES, VIEWS, schema_objects

pytestmark = pytest.mark.integration

ALLOCATOR = str(Path(sys.executable).with_name("allocator"))
LOCK_WAITERS = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    " AND classid = %s::oid AND objid = %s::oid AND objsubid = 2"
)
WAIT_S = 30.0


@pytest.fixture(autouse=True)
def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_environment(monkeypatch)
    monkeypatch.chdir(tmp_path)


def status(url: str) -> dict[str, object]:
    result = invoke(["migrate", "--status", "--json", "--database-url", url])
    assert result.exit_code == Exit.OK, result.output
    document: dict[str, object] = json.loads(result.stdout)
    return document


def test_migrate_to_a_revision_up_and_down_with_status_between(empty_db_url: str) -> None:
    url = empty_db_url
    assert status(url)["current_revision"] is None

    up = invoke(["migrate", "--to", "0009", "--database-url", url])
    assert up.exit_code == Exit.OK, up.output
    assert up.stdout.startswith("schema upgraded from nothing to revision 0009")
    assert "nodes of this release cannot use it" in up.stdout
    report = status(url)
    assert report["current_revision"] == "0009"
    assert report["pending_revisions"] == ["0010", "0011", "0012", "0013"]
    assert report["nodes_can_use"] is False
    assert report["min_node_revision"] == "0003"
    assert "run `allocator migrate` with this release" in str(report["nodes_verdict"])

    unknown = invoke(["migrate", "--to", "0042", "--database-url", url])
    assert unknown.exit_code == Exit.USAGE
    assert "--to '0042': not a revision this release knows (head, base, 0001, 0002" in (
        unknown.stderr
    )
    down = invoke(["migrate", "--to", "0005", "--database-url", url])
    assert down.exit_code == Exit.USAGE
    assert "moves the schema down from 0009" in down.stderr
    assert "add --yes" in down.stderr
    assert migrate.current_revision(url) == "0009"  # nothing moved

    head = invoke(["migrate", "--database-url", url])
    assert head.exit_code == Exit.OK, head.output
    assert head.stdout.strip() == f"schema upgraded from 0009 to revision {compat.HEAD}"
    text = invoke(["migrate", "--status", "--database-url", url])
    assert text.stdout.splitlines() == [
        f"schema revision: {compat.HEAD}",
        f"this release's head: {compat.HEAD}",
        "pending: none",
        f"nodes of this release can use it: yes (schema revision {compat.HEAD} "
        f"(this release's head: {compat.HEAD}))",
    ]

    back = invoke(["migrate", "--to", "0010", "--yes", "--json", "--database-url", url])
    assert back.exit_code == Exit.OK, back.output
    document = json.loads(back.stdout)
    assert (document["action"], document["previous_revision"]) == ("downgrade", compat.HEAD)
    assert document["current_revision"] == "0010"
    assert "block_age" not in schema_objects(url)["tables"]  # what 0011 added is gone

    both = invoke(["migrate", "--status", "--to", "head", "--database-url", url])
    assert both.exit_code == Exit.USAGE
    assert "--check and --status only report" in both.stderr


def test_a_schema_a_newer_release_wrote_is_left_alone_and_reported(db_url: str) -> None:
    """A revision this release does not know: ``migrate`` leaves it, ``--check`` is not
    behind, ``--status`` says whether the marker closes it to this release's nodes."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE public.alembic_version SET version_num = '0099'")
    report = status(db_url)
    assert (report["newer_than_head"], report["nodes_can_use"]) == (True, True)
    assert report["pending_revisions"] == []
    result = invoke(["migrate", "--database-url", db_url])
    assert result.exit_code == Exit.OK, result.output
    assert "newer than this release knows" in result.stdout
    check = invoke(["migrate", "--check", "--json", "--database-url", db_url])
    assert check.exit_code == Exit.OK, check.output
    assert json.loads(check.stdout)["up_to_date"] is True
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            """COMMENT ON TABLE public.alembic_version IS '{"min_node_revision": "0099"}'"""
        )
    report = status(db_url)
    assert report["nodes_can_use"] is False
    assert "upgrade the node to a release that knows revision 0099" in str(report["nodes_verdict"])


def node_env(cluster: ClusterInfo, url: str) -> dict[str, str]:
    return {
        "ALLOCATOR_POSTGRES_URL": url,
        "ALLOCATOR_ZOOKEEPER_HOSTS": cluster.zk_hosts,
        "ALLOCATOR_ZOOKEEPER_INSECURE": "true",
        "ALLOCATOR_NODE_ADMIN_TOKEN": "a-test-admin-token-0123456789",
    }


def test_a_node_refuses_a_schema_older_than_its_window(
    empty_db_url: str, cluster: ClusterInfo
) -> None:
    """The previous release's schema (0009): the node stops at start, exit 78, one line
    naming both revisions and the way out."""
    migrate.migrate_to(empty_db_url, "0009")
    result = invoke(["run", "--admin-address", "127.0.0.1:0"], env=node_env(cluster, empty_db_url))
    assert result.exit_code == Exit.CONFIG, result.output
    [line] = [text for text in result.stderr.splitlines() if text.startswith("error")]
    assert "schema revision 0009 is older than this node can use" in line
    assert f"schema revisions {compat.NODE_OLDEST_REVISION} to {compat.HEAD}" in line
    assert line.endswith("run `allocator migrate` with this release")


def test_a_node_refuses_a_newer_schema_a_contract_closed_to_it(
    db_url: str, cluster: ClusterInfo
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE public.alembic_version SET version_num = '0099'")
        conn.execute(
            """COMMENT ON TABLE public.alembic_version IS '{"min_node_revision": "0098"}'"""
        )
    result = invoke(["run", "--admin-address", "127.0.0.1:0"], env=node_env(cluster, db_url))
    assert result.exit_code == Exit.CONFIG, result.output
    [line] = [text for text in result.stderr.splitlines() if text.startswith("error")]
    assert "schema revision 0099 is newer than this release knows" in line
    assert line.endswith("upgrade the node to a release that knows revision 0098")


def test_a_node_whose_role_may_not_read_the_revision_says_to_migrate(
    db_url: str, cluster: ClusterInfo
) -> None:
    """A database last migrated by an older release's CLI, which granted no read of the
    version table: the node cannot tell the revision and says what grants it."""
    role = f"t_node_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("REVOKE SELECT ON public.alembic_version FROM allocator_node")
        conn.execute(
            pgsql.SQL("CREATE ROLE {} LOGIN IN ROLE allocator_node").format(pgsql.Identifier(role))
        )
    try:
        env = node_env(cluster, url_for_user(db_url, role))
        result = invoke(["run", "--admin-address", "127.0.0.1:0"], env=env)
    finally:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(role)))
    assert result.exit_code == Exit.CONFIG, result.output
    [line] = [text for text in result.stderr.splitlines() if text.startswith("error")]
    assert "this node's role may not read public.alembic_version" in line
    assert "run `allocator migrate` with this release" in line
    with psycopg.connect(db_url, autocommit=True) as conn:
        migrate.after_migrations(conn)  # what the next `allocator migrate` does
        row = conn.execute(
            "SELECT has_table_privilege('allocator_node', 'public.alembic_version', 'SELECT')"
        ).fetchone()
    assert row == (True,)


def spawn(*args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALLOCATOR_")}
    return subprocess.Popen(
        [ALLOCATOR, "migrate", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_waiters(conn: psycopg.Connection[tuple[object, ...]], count: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while True:
        row = conn.execute(LOCK_WAITERS, migrate.MIGRATION_LOCK).fetchone()
        if row is not None and row[0] == count:
            return
        assert time.monotonic() < deadline, f"{count} migrations did not queue for the lock"
        time.sleep(0.05)


def test_two_migrations_at_once_take_turns_and_leave_the_whole_schema(empty_db_url: str) -> None:
    """Both start while the lock is held; both wait; released, one upgrades from nothing and
    the other finds the schema at head: both succeed."""
    with psycopg.connect(empty_db_url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s, %s)", migrate.MIGRATION_LOCK)
        runs = [spawn("--json", "--database-url", empty_db_url) for _ in range(2)]
        try:
            wait_for_waiters(holder, 2)
        finally:
            holder.execute("SELECT pg_advisory_unlock(%s, %s)", migrate.MIGRATION_LOCK)
        outputs = [run.communicate(timeout=WAIT_S) for run in runs]
    assert [run.returncode for run in runs] == [Exit.OK, Exit.OK], outputs
    previous = sorted(str(json.loads(out)["previous_revision"]) for out, _ in outputs)
    assert previous == [compat.HEAD, "None"]
    assert migrate.current_revision(empty_db_url) == compat.HEAD
    assert schema_objects(empty_db_url) == {
        "tables": TABLES,
        "views": VIEWS,
        "functions": FUNCTIONS,
    }


def test_a_migration_that_waits_past_its_lock_timeout_names_the_holder(
    empty_db_url: str,
) -> None:
    holder = psycopg.connect(empty_db_url, autocommit=True, application_name="the-other-migrate")
    with holder:
        holder.execute("SELECT pg_advisory_lock(%s, %s)", migrate.MIGRATION_LOCK)
        row = holder.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        result = invoke(["migrate", "--lock-timeout", "1s", "--database-url", empty_db_url])
    assert result.exit_code == Exit.TEMPFAIL, result.output
    [line] = [text for text in result.stderr.splitlines() if text.startswith("error")]
    assert "another migration has held the migration lock for over 1 s (--lock-timeout" in line
    assert f"pid {row[0]}, application_name 'the-other-migrate'" in line
    assert migrate.current_revision(empty_db_url) is None  # nothing ran
