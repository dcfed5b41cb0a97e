"""``allocator fence rebase`` / ``fence status`` / ``status`` as an operator runs them: the
CLI in a subprocess against the session's ZooKeeper ensemble (a chroot per test) and a
database of its own, logged in as a role granted ``allocator_operator``.

The fence starts ahead of ZooKeeper, as after an ensemble rebuild: the database holds a
token from the old ensemble (a large czxid) and the test's chroot holds nothing at all.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from kazoo.client import KazooClient
from kazoo.security import OPEN_ACL_UNSAFE
from psycopg import sql

from allocator import zkclient
from tests.fixtures.pg import take_fence, url_for_user
from tests.fixtures.zk import ZK_AUTH

pytestmark = pytest.mark.integration

ALLOCATOR = str(Path(sys.executable).with_name("allocator"))
OLD_EPOCH = (7 << 32) + 42
"""A czxid of the wiped ensemble: far above anything the test's ensemble has issued."""
CHROOT = "/eu1"
"""Below the test's own chroot; absent until the re-base recreates it."""
ELECTION_PATH = "/allocator/election"
GENERATION_ZNODE = CHROOT + "/allocator/fence-generation"
EX_USAGE, EX_TEMPFAIL = 2, 75
REBASE_KEYS = {
    "old_generation",
    "old_epoch",
    "new_generation",
    "reason",
    "generation_znode",
    "zookeeper_hosts",
    "zookeeper_previous_generation",
    "zookeeper_znode_existed",
    "zookeeper_written",
    "created_znodes",
    "was_ahead_of_zookeeper",
    "rebase_id",
    "rebased_by",
    "rebased_at",
}
FENCE_KEYS = {"generation", "epoch", "holder", "zookeeper_generation", "ahead_of_zookeeper"}


def cli(
    *args: str, env: dict[str, str], stdin: int | None = subprocess.DEVNULL
) -> subprocess.CompletedProcess[str]:
    """The CLI with a clean environment: no ALLOCATOR_* variable leaks in from the caller."""
    base = {key: value for key, value in os.environ.items() if not key.startswith("ALLOCATOR_")}
    return subprocess.run(
        [ALLOCATOR, *args],
        env={**base, **env},
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.stderr.startswith("error: "), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr
    return done.stderr


@pytest.fixture
def operator_url(db_url: str) -> Iterator[str]:
    """A login role in allocator_operator (roles are cluster-wide: dropped afterwards)."""
    name = f"t_operator_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE allocator_operator").format(sql.Identifier(name))
        )
    yield url_for_user(db_url, name)
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


@pytest.fixture
def zk(zk_hosts: str) -> Iterator[KazooClient]:
    """A client in the test's chroot, for checking what the command wrote."""
    client = KazooClient(hosts=zk_hosts, auth_data=[("digest", ZK_AUTH)])
    client.start(timeout=15)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def env(db_url: str, zk_hosts: str, operator_url: str) -> dict[str, str]:
    """The cluster's config as the operator's environment; the fence ahead of ZooKeeper."""
    with psycopg.connect(db_url, autocommit=True) as admin:
        take_fence(admin, OLD_EPOCH, holder="node-1")
    return {
        "ALLOCATOR_ZOOKEEPER_HOSTS": zk_hosts + CHROOT,
        "ALLOCATOR_ZOOKEEPER_ELECTION_PATH": ELECTION_PATH,
        "ALLOCATOR_ZOOKEEPER_CONNECT_TIMEOUT_S": "10",
        "ALLOCATOR_ZOOKEEPER_AUTH": ZK_AUTH,
        "ALLOCATOR_POSTGRES_URL": operator_url,
    }


def fence_row(url: str) -> tuple[Any, ...]:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT generation, epoch, holder FROM allocator.fence").fetchone()
    assert row is not None
    return tuple(row)


def history(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT rebased_by, old_generation, old_epoch, new_generation, reason"
            " FROM allocator.fence_history ORDER BY rebase_id"
        ).fetchall()


def assert_unchanged(db_url: str, zk: KazooClient) -> None:
    assert fence_row(db_url) == (0, OLD_EPOCH, "node-1")
    assert history(db_url) == []
    assert zk.exists(CHROOT) is None  # not even the chroot was recreated


def test_rebase_refuses_without_yes_when_not_on_a_terminal(
    db_url: str, zk: KazooClient, env: dict[str, str]
) -> None:
    # An environment variable cannot confirm: a person types --yes each time.
    done = cli(
        "fence",
        "rebase",
        "--reason",
        "ensemble rebuilt",
        env={**env, "ALLOCATOR_FENCE_REBASE_YES": "1"},
    )
    assert done.returncode == EX_USAGE
    assert "pass --yes" in one_line_error(done)
    assert done.stdout == ""
    assert_unchanged(db_url, zk)


@pytest.mark.parametrize(
    ("reason", "message"),
    [("", "--reason must say why"), ("   ", "--reason must say why"), ("x" * 1001, "1001")],
)
def test_rebase_refuses_an_empty_or_long_reason(
    db_url: str, zk: KazooClient, env: dict[str, str], reason: str, message: str
) -> None:
    done = cli("fence", "rebase", "--reason", reason, "--yes", env=env)
    assert done.returncode == EX_USAGE
    assert message in one_line_error(done)
    assert_unchanged(db_url, zk)


def test_rebase_with_yes_records_and_writes_the_generation(
    db_url: str, operator_url: str, zk_hosts: str, zk: KazooClient, env: dict[str, str]
) -> None:
    operator = operator_url.rsplit("@", 1)[0].rsplit("/", 1)[-1]
    with psycopg.connect(db_url) as conn:
        [[open_terms]] = conn.execute(
            "SELECT count(*) FROM allocator.leader_history WHERE ended_at IS NULL"
        ).fetchall()
    assert open_terms == 1

    done = cli("fence", "rebase", "--reason", "ensemble eu1 rebuilt", "--yes", "--json", env=env)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out.keys() >= REBASE_KEYS
    assert (out["old_generation"], out["old_epoch"], out["new_generation"]) == (0, OLD_EPOCH, 1)
    assert out["reason"] == "ensemble eu1 rebuilt"
    assert out["rebased_by"] == operator
    assert out["was_ahead_of_zookeeper"] is True
    assert out["zookeeper_written"] is True
    assert out["zookeeper_previous_generation"] is None
    chroot = "/" + zk_hosts.split("/", 1)[1]
    assert out["generation_znode"] == chroot + GENERATION_ZNODE
    assert out["created_znodes"] == [chroot + CHROOT, chroot + CHROOT + ELECTION_PATH]

    # The database: fence re-based, the open term ended, who/when/why recorded.
    assert fence_row(db_url) == (1, 0, None)
    assert history(db_url) == [(operator, 0, OLD_EPOCH, 1, "ensemble eu1 rebuilt")]
    with psycopg.connect(db_url) as conn:
        reasons = conn.execute("SELECT end_reason FROM allocator.leader_history").fetchall()
    assert reasons == [("rebased",)]
    # ZooKeeper: the chroot and election path are back, the generation is beside them,
    # all with the cluster's ACL; the chroot's parent (the test's chroot) stays as it was.
    assert zk.exists(CHROOT + ELECTION_PATH) is not None
    assert zk.get(GENERATION_ZNODE)[0] == b"1"
    ours = zkclient.digest_acl(ZK_AUTH)
    for path in (CHROOT, CHROOT + ELECTION_PATH, GENERATION_ZNODE):
        assert zk.get_acls(path)[0] == ours, path
    assert zk.get_acls("/")[0] == OPEN_ACL_UNSAFE

    # Again (as after a failed ZooKeeper write): advances once more, harmlessly.
    done = cli("fence", "rebase", "--reason", "second try", "--yes", env=env)
    assert done.returncode == 0, done.stderr
    assert "fence re-based: 1:0x0 -> generation 2, epoch 0" in done.stdout
    assert f"by {operator}" in done.stdout
    assert f"wrote 2 to {chroot}{GENERATION_ZNODE}" in done.stdout
    assert "(was 1)" in done.stdout
    assert fence_row(db_url) == (2, 0, None)
    assert zk.get(GENERATION_ZNODE)[0] == b"2"
    assert len(history(db_url)) == 2


def test_rebase_prompts_on_a_terminal(db_url: str, zk: KazooClient, env: dict[str, str]) -> None:
    for answer, code in ((b"n\n", 1), (b"y\n", 0)):
        controller, terminal = pty.openpty()
        try:
            os.write(controller, answer)
            done = cli("fence", "rebase", "--reason", "ensemble rebuilt", env=env, stdin=terminal)
        finally:
            os.close(terminal)
            os.close(controller)
        assert done.returncode == code, done.stderr
        assert "Re-base the fence?" in done.stderr
        assert "AHEAD of ZooKeeper" in done.stderr  # the plan is shown before the question
        if code:
            assert "cancelled; nothing changed" in done.stderr
            assert_unchanged(db_url, zk)
    assert fence_row(db_url) == (1, 0, None)
    assert zk.get(GENERATION_ZNODE)[0] == b"1"


def test_rebase_refuses_when_zookeeper_is_ahead_of_the_database(
    db_url: str, zk: KazooClient, env: dict[str, str]
) -> None:
    # The database was restored, not the ensemble: a re-base would move ZooKeeper back.
    zk.create(GENERATION_ZNODE, b"5", makepath=True)
    done = cli("fence", "rebase", "--reason", "restored", "--yes", env=env)
    assert done.returncode == 1
    assert "the database was restored" in one_line_error(done)
    assert fence_row(db_url) == (0, OLD_EPOCH, "node-1")
    assert history(db_url) == []
    assert zk.get(GENERATION_ZNODE)[0] == b"5"


def test_rebase_changes_nothing_when_zookeeper_is_unreachable(
    db_url: str, zk: KazooClient, env: dict[str, str], unused_tcp_port: int
) -> None:
    env = {
        **env,
        "ALLOCATOR_ZOOKEEPER_HOSTS": f"127.0.0.1:{unused_tcp_port}{CHROOT}",
        "ALLOCATOR_ZOOKEEPER_CONNECT_TIMEOUT_S": "1",
    }
    done = cli("fence", "rebase", "--reason", "ensemble rebuilt", "--yes", env=env)
    assert done.returncode == EX_TEMPFAIL
    assert "no ZooKeeper server answered" in one_line_error(done)
    assert_unchanged(db_url, zk)


def test_rebase_needs_the_operator_role(db_url: str, zk: KazooClient, env: dict[str, str]) -> None:
    node_url = url_for_user(db_url, f"t_node_{uuid.uuid4().hex[:8]}")
    name = node_url.rsplit("@", 1)[0].rsplit("/", 1)[-1]
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE allocator_node").format(sql.Identifier(name))
        )
    try:
        done = cli("fence", "rebase", "--reason", "x", "--yes", "--database-url", node_url, env=env)
    finally:
        with psycopg.connect(db_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))
    assert done.returncode == 1
    assert "permission denied for function rebase_fence" in one_line_error(done)
    assert fence_row(db_url) == (0, OLD_EPOCH, "node-1")
    assert zk.exists(GENERATION_ZNODE) is None


def test_status_reports_the_fence_ahead_until_a_rebase(
    db_url: str, zk: KazooClient, env: dict[str, str]
) -> None:
    status_env = {**env, "ALLOCATOR_POSTGRES_URL": db_url}
    data = json.loads(cli("status", "--json", env=status_env).stdout)
    assert data["fence"].keys() >= FENCE_KEYS
    assert data["fence"]["ahead_of_zookeeper"] is True
    assert (data["fence"]["generation"], data["fence"]["epoch"]) == (0, OLD_EPOCH)
    assert data["fence"]["zookeeper_generation"] == 0
    assert data["leader"] is None  # nobody in the (missing) election
    assert [t["generation"] for t in data["handovers"]] == [0]
    text = cli("status", env=status_env)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("leader      none\ncontenders  none\n!! FENCE AHEAD OF ZOOKEEPER")
    fence_status = cli("fence", "status", "--json", env=env)  # the operator role reads it too
    assert fence_status.returncode == 0, fence_status.stderr
    assert json.loads(fence_status.stdout) == data["fence"]

    done = cli("fence", "rebase", "--reason", "ensemble eu1 rebuilt", "--yes", env=env)
    assert done.returncode == 0, done.stderr

    data = json.loads(cli("status", "--json", env=status_env).stdout)
    fence = data["fence"]
    assert fence["ahead_of_zookeeper"] is False
    assert (fence["generation"], fence["epoch"], fence["holder"]) == (1, 0, None)
    assert fence["zookeeper_generation"] == 1
    assert [r["reason"] for r in fence["rebases"]] == ["ensemble eu1 rebuilt"]
    assert data["handovers"][0]["end_reason"] == "rebased"
    text = cli("fence", "status", env=env).stdout
    assert "FENCE AHEAD" not in text
    assert "ahead       no" in text
    assert "ensemble eu1 rebuilt" in text

    # The generation znode gone (another wipe): ahead again, by generation this time.
    zk.delete(GENERATION_ZNODE)
    fence = json.loads(cli("fence", "status", "--json", env=env).stdout)
    assert (fence["ahead_of_zookeeper"], fence["zookeeper_generation"]) == (True, 0)
