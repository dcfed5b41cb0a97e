"""A PostgreSQL login the server refuses is a configuration error (exit 78) naming the role,
for every command that logs in (issue 21, item 6); the rows of the exit-code table that
need a real server (``tests/unit/test_exit_codes.py`` drives the others).

The test server trusts loopback, so the fixture :func:`password_role` makes it check one
role's password: a login role of its own and a ``scram-sha-256`` line for it alone at the
top of ``pg_hba.conf`` (the rest of the session's server keeps ``trust``; the file is put
back afterwards). Each command then logs in with a wrong password, in-process (click's
``CliRunner``), with the session's ZooKeeper ensemble for the commands that read it first.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from allocator.core.exits import Exit
from allocator.local.info import ClusterInfo
from tests.fixtures.pg import url_for_user
from tests.fuzz.clikit import clean_environment, invoke

pytestmark = pytest.mark.integration

PASSWORD = "the-right-password"


@pytest.fixture
def password_role(db_url: str) -> Iterator[str]:
    """A login role (an operator) whose password the server checks; its name."""
    role = f"login_probe_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE allocator_operator").format(
                sql.Identifier(role), sql.Literal(PASSWORD)
            )
        )
        row = admin.execute("SHOW hba_file").fetchone()
        assert row is not None
        hba = Path(str(row[0]))
        before = hba.read_text()
        hba.write_text(f"host all {role} 127.0.0.1/32 scram-sha-256\n{before}")
        admin.execute("SELECT pg_reload_conf()")
    try:
        yield role
    finally:
        hba.write_text(before)
        with psycopg.connect(db_url, autocommit=True) as admin:
            admin.execute("SELECT pg_reload_conf()")
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def with_password(url: str, role: str, password: str) -> str:
    user_url = url_for_user(url, role)
    return user_url.replace(f"//{role}@", f"//{role}:{password}@", 1)


LOGGING_IN = [
    ("claim", "--consumer", "c"),
    ("migrate",),
    ("migrate", "--check"),
    ("config", "check", "--database"),
    ("status",),
    ("fence", "status"),
    ("fence", "rebase", "--reason", "r", "--yes"),
    ("pool", "pause", "--reason", "r"),
    ("pool", "resume", "--reason", "r"),
    ("pool", "reset", "--after-restore", "--reason", "r", "--old-database-unreachable", "--yes"),
    ("run", "--admin-address", "127.0.0.1:0"),
    ("bench", "claims"),  # the benches' URL, from their variable (no password on a flag)
    ("bench", "client"),
    ("bench", "slow-consumer"),
]


@pytest.mark.parametrize("args", LOGGING_IN, ids=[" ".join(a[:2]) for a in LOGGING_IN])
def test_a_refused_login_is_a_configuration_error_naming_the_role(
    args: tuple[str, ...],
    cluster: ClusterInfo,
    db_url: str,
    password_role: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    clean_environment(monkeypatch)
    monkeypatch.chdir(tmp_path)
    wrong = with_password(db_url, password_role, "not-the-password")
    env = {
        "ALLOCATOR_POSTGRES_URL": wrong,
        "ALLOCATOR_CLAIM_DATABASE_URL": wrong,
        "ALLOCATOR_ZOOKEEPER_HOSTS": cluster.zk_hosts,
        "ALLOCATOR_ZOOKEEPER_INSECURE": "true",
        "ALLOCATOR_POSTGRES_CONNECT_TIMEOUT_S": "2",
    }
    if args[0] == "bench":
        env["ALLOCATOR_" + "_".join(args).upper().replace("-", "_") + "_DATABASE_URL"] = wrong
    result = invoke(list(args), env=env)
    assert result.exit_code == Exit.CONFIG, result.output
    [line] = [text for text in result.stderr.splitlines() if text.startswith("error")]
    assert f"PostgreSQL refused the login of role '{password_role}'" in line
    assert "unreachable" not in line
    assert "not-the-password" not in result.output


def test_the_right_password_gets_in(db_url: str, password_role: str) -> None:
    """The control: the line checks the password, it does not refuse the role."""
    with psycopg.connect(with_password(db_url, password_role, PASSWORD)) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (password_role,)


def test_a_schema_behind_is_the_answer_no(
    empty_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exit 1 (``migrate --check``): the check ran and found the schema behind."""
    clean_environment(monkeypatch)
    result = invoke(["migrate", "--check", "--database-url", empty_db_url])
    assert result.exit_code == Exit.FAILED, result.output
    assert result.stdout.startswith("schema revision: none (newest: ")
