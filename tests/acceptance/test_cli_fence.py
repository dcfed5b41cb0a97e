"""``allocator fence rebase`` / ``fence status`` / ``status`` as an operator runs them: the
CLI in a subprocess against the session's ZooKeeper ensemble (a chroot per test) and a
database of its own, logged in as a role granted ``allocator_operator``.

The fence starts ahead of ZooKeeper, as after an ensemble rebuild: the database holds a
token from the old ensemble (a large czxid) and the test's chroot holds nothing at all.
A test that puts a watermark there (a database that went backwards, or one that did not)
creates the chroot with it. One test runs the command in-process, to let a leader cut
between the command's reads.
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

from allocator.core.exits import Exit
from allocator.fence import Token, Watermark
from allocator.postgres import operator as db
from allocator.zookeeper import client as zkclient
from tests.fixtures.pg import cut, layout_blocks, take_fence, url_for_user
from tests.fixtures.zk import ZK_AUTH
from tests.fuzz.clikit import invoke

pytestmark = pytest.mark.integration

ALLOCATOR = str(Path(sys.executable).with_name("allocator"))
OLD_EPOCH = (7 << 32) + 42
"""A czxid of the wiped ensemble: far above anything the test's ensemble has issued."""
CHROOT = "/eu1"
"""Below the test's own chroot; absent until the re-base recreates it."""
ELECTION_PATH = "/allocator/election"
GENERATION_ZNODE = CHROOT + "/allocator/fence-generation"
WATERMARK_ZNODE = CHROOT + "/allocator/db-watermark"
EX_USAGE, EX_TEMPFAIL, EX_CONFIG = Exit.USAGE, Exit.TEMPFAIL, Exit.CONFIG
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
WATERMARK_KEYS = {"watermark", "watermark_problem"}
"""Added to the re-base's --json (ZooKeeper's watermark as the plan read it)."""
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


def high_water_id(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT high_water_id FROM allocator.pool_status").fetchone()
    assert row is not None
    return int(row[0])


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


# -- ZooKeeper's watermark: a database that went backwards is not re-based --------------------


@pytest.mark.parametrize("behind", ["fence", "mark", "both"])
def test_rebase_refuses_a_database_below_the_watermark(
    db_url: str, zk: KazooClient, env: dict[str, str], behind: str
) -> None:
    # The reviewer's reproduction: the database restored from a backup, ZooKeeper's
    # watermark still holding what the lost commits had reached.
    mark = high_water_id(db_url)
    token = Token(0, OLD_EPOCH + 1) if behind in ("fence", "both") else Token(0, OLD_EPOCH)
    watermark = Watermark(token, mark + 1000 if behind in ("mark", "both") else mark)
    zk.create(WATERMARK_ZNODE, watermark.to_bytes(), makepath=True)
    before = zk.get(WATERMARK_ZNODE)

    done = cli("fence", "rebase", "--reason", "zk rebuilt", "--yes", "--json", env=env)

    assert done.returncode == EX_CONFIG, done.stderr
    error = one_line_error(done)
    assert f"fence {Token(0, OLD_EPOCH)}, mark {mark}" in error  # the database's
    assert f"fence {watermark.token}, mark {watermark.high_water_id}" in error  # ZooKeeper's
    assert "went backwards" in error
    assert "`allocator pool reset --after-restore`" in error
    assert error.rstrip().endswith("nothing changed")
    assert done.stdout == ""
    # Nothing written: not the database, not ZooKeeper (no path recreated, no generation).
    assert fence_row(db_url) == (0, OLD_EPOCH, "node-1")
    assert high_water_id(db_url) == mark
    assert history(db_url) == []
    assert zk.get(WATERMARK_ZNODE) == before
    assert zk.get_children(CHROOT) == ["allocator"]
    assert zk.get_children(CHROOT + "/allocator") == ["db-watermark"]


def test_rebase_refuses_a_database_below_the_watermark_before_the_prompt(
    db_url: str, zk: KazooClient, env: dict[str, str]
) -> None:
    mark = high_water_id(db_url)
    zk.create(WATERMARK_ZNODE, Watermark(Token(2, 5), mark).to_bytes(), makepath=True)
    controller, terminal = pty.openpty()
    try:
        os.write(controller, b"y\n")  # would confirm, were the question asked
        done = cli("fence", "rebase", "--reason", "zk rebuilt", env=env, stdin=terminal)
    finally:
        os.close(terminal)
        os.close(controller)
    assert done.returncode == EX_CONFIG, done.stderr
    assert "Re-base the fence?" not in done.stderr
    assert "`allocator pool reset --after-restore`" in one_line_error(done)
    assert fence_row(db_url) == (0, OLD_EPOCH, "node-1")
    assert history(db_url) == []
    assert zk.exists(GENERATION_ZNODE) is None


@pytest.mark.parametrize("watermark", ["absent", "at the database", "below the database"])
def test_rebase_goes_ahead_when_the_database_is_not_below_the_watermark(
    db_url: str, zk: KazooClient, env: dict[str, str], watermark: str
) -> None:
    # Absent: a wiped ensemble, the usual case for a re-base. Present (an ensemble restored
    # from an older snapshot): the database at or past it went nowhere.
    mark = high_water_id(db_url)
    copy = {
        "absent": None,
        "at the database": Watermark(Token(0, OLD_EPOCH), mark),
        "below the database": Watermark(Token(0, OLD_EPOCH - 7), -1),
    }[watermark]
    if copy is not None:
        zk.create(WATERMARK_ZNODE, copy.to_bytes(), makepath=True)

    done = cli("fence", "rebase", "--reason", "zk rebuilt", "--yes", "--json", env=env)

    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out.keys() >= REBASE_KEYS | WATERMARK_KEYS
    assert out["watermark"] == (copy.to_json() if copy else None)
    assert out["watermark_problem"] is None
    assert (out["old_generation"], out["new_generation"]) == (0, 1)
    assert fence_row(db_url) == (1, 0, None)
    assert zk.get(GENERATION_ZNODE)[0] == b"1"
    if copy is not None:
        assert zk.get(WATERMARK_ZNODE)[0] == copy.to_bytes()  # the next leader raises it


def test_rebase_reports_and_ignores_a_watermark_that_does_not_parse(
    db_url: str, zk: KazooClient, env: dict[str, str]
) -> None:
    zk.create(WATERMARK_ZNODE, b"not a watermark", makepath=True)

    done = cli("fence", "rebase", "--reason", "zk rebuilt", "--yes", "--json", env=env)

    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["watermark"] is None
    assert "not JSON" in out["watermark_problem"]
    assert fence_row(db_url) == (1, 0, None)

    # The human output says it too.
    done = cli("fence", "rebase", "--reason", "again", "--yes", env=env)
    assert done.returncode == 0, done.stderr
    assert "watermark" in done.stdout
    assert "not JSON" in done.stdout
    assert "ignored" in done.stdout


@pytest.mark.parametrize("watermark", ["absent", "present", "unreadable"])
def test_rebase_plan_shows_the_watermark(
    db_url: str, zk: KazooClient, env: dict[str, str], watermark: str
) -> None:
    mark = high_water_id(db_url)
    copy = Watermark(Token(0, OLD_EPOCH - 1), mark)
    if watermark != "absent":
        data = copy.to_bytes() if watermark == "present" else b"[1, 2]"
        zk.create(WATERMARK_ZNODE, data, makepath=True)
    controller, terminal = pty.openpty()
    try:
        os.write(controller, b"n\n")
        done = cli("fence", "rebase", "--reason", "zk rebuilt", env=env, stdin=terminal)
    finally:
        os.close(terminal)
        os.close(controller)
    assert done.returncode == 1, done.stderr
    assert "Re-base the fence?" in done.stderr
    assert "cancelled; nothing changed" in done.stderr
    plan = done.stderr.split("Re-base the fence?", 1)[0]
    [line] = [line for line in plan.splitlines() if line.startswith("watermark")]
    assert "db-watermark" in line
    if watermark == "present":
        assert f"fence {copy.token}, mark {mark}" in line
        assert "the database is not below it" in line
    elif watermark == "absent":
        assert "none" in line
    else:
        assert "not a JSON object" in line
        assert "ignored" in line
    assert fence_row(db_url) == (0, OLD_EPOCH, "node-1")
    assert history(db_url) == []


def test_rebase_is_not_refused_when_a_leader_cuts_between_its_reads(
    db_url: str, zk: KazooClient, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The watermark lags the database (a leader raises it after its cuts commit), so the
    # command reads it before the database: a leader that cuts and raises it between the
    # command's two reads must not read as a database that went backwards.
    zk.create(WATERMARK_ZNODE, Watermark(Token(0, OLD_EPOCH), -1).to_bytes(), makepath=True)
    read_status = db.read_status

    def read_then_a_leader_cuts(*args: Any, **kwargs: Any) -> Any:
        result = read_status(*args, **kwargs)
        with psycopg.connect(db_url, autocommit=True) as admin:
            cut(admin, OLD_EPOCH, layout_blocks(3))
        mark = high_water_id(db_url)
        data, stat = zk.get(WATERMARK_ZNODE)
        raised = Watermark.from_bytes(data).merge(Watermark(Token(0, OLD_EPOCH), mark))
        zk.set(WATERMARK_ZNODE, raised.to_bytes(), version=stat.version)
        return result

    monkeypatch.setattr(db, "read_status", read_then_a_leader_cuts)
    for name in [n for n in os.environ if n.startswith("ALLOCATOR_")]:
        monkeypatch.delenv(name)
    done = invoke(["fence", "rebase", "--reason", "zk rebuilt", "--yes", "--json"], env=env)

    assert done.exit_code == 0, done.output
    assert fence_row(db_url) == (1, 0, None)
    assert json.loads(done.stdout)["watermark"] == Watermark(Token(0, OLD_EPOCH), -1).to_json()
